"""In-process counters of one worker: read by its metrics (metrics.py), its log lines, the
tests and the tools. The loop thread bumps integers; nothing here is a label with a run id."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WorkerStats:
    # Step executions that ended, by (step type, outcome): succeeded, failed.
    attempts: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Tasks not run, by reason: deadline, superseded, ahead, recorded, resend, run_gone,
    # duplicate, died, done_before (finished by the partition's previous owner past its
    # committed offset).
    skipped: Counter[str] = field(default_factory=Counter)
    abandoned: int = 0  # steps given up on while still running (deadline, heartbeat)
    heartbeats: int = 0  # heartbeats the steps reported
    reruns: int = 0  # executions begun again after the worker running them died
    rerun_crashes: int = 0  # reruns whose step killed the child process running it again
    dead_letters: int = 0  # tasks that could not be decoded
    rejoins: int = 0  # times the consumer joined its group again, stuck (io/kafka/group_watch.py)
    # Tasks of a step type this worker has no function for, handed to a worker that has, by
    # step type (handback.py).
    handed_back: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)  # genuine failures by kind
    # Exceptions nobody foresaw, each isolated to the task it was met on, by where: intake,
    # claimed, ended, recorded, handback (the loop), claim, record (the database lanes).
    isolated: Counter[str] = field(default_factory=Counter)

    @property
    def executed(self) -> int:
        return sum(self.attempts.values())

    def totals(self) -> dict[str, Any]:
        """What the worker's log lines say of its work so far (``worker stats``, ``stopped``)."""
        return {
            "executed": self.executed,
            "skipped": dict(self.skipped),
            "abandoned": self.abandoned,
            "reruns": self.reruns,
            "handed_back": dict(self.handed_back),
        }
