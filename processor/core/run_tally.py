"""Runs started and ended, by workflow (and final status): what the business metrics count.

A run **starts** with the committed transition that takes it out of ``pending`` on its own:
to ``running``, or straight to an end when its first tick finishes it (a map over an empty
list, a wait whose signal came first). That transition happens once in a run's life: nothing
takes a run back to ``pending`` (``ductor runs retry`` resumes a failed run as ``running``),
and the version check lets exactly one commit make it, however many processors tick the run.
Counting where runs are created instead would count requests that lost to an existing run id
(the insert is idempotent), and creation happens in clients, triggers, schedules and parents'
commits, most of them outside the processor. A pending run cancelled (or force-failed) never
started: it is counted as ended only.

A run **ends** with the committed transition to ``succeeded``, ``failed`` or ``cancelled``,
force-fails included. A run resumed by ``ductor runs retry`` ends again: each end is counted.

The shell notes each transition only once its commit succeeded (never for a conflict, a
refused force-fail or a commit that did not land), so one process counts a transition once.
Labels stay bounded: the workflow's name (registered workflows) and the status, never a run
id. The time a step waits for a concurrency or rate limit is counted by the limit's name
(core/limits.py, ``Stats.limits_used``).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from processor.core.run_state import RunStatus

_PENDING, _CANCELLED = RunStatus.PENDING, RunStatus.CANCELLED


@dataclass(slots=True)
class RunTally:
    """Starts by workflow and ends by (workflow, status), gathered over a batch (or a sweep)
    and added to the process's totals in one go."""

    started: Counter[str] = field(default_factory=Counter)
    ended: Counter[tuple[str, RunStatus]] = field(default_factory=Counter)

    def committed(self, workflow: str, before: RunStatus, after: RunStatus) -> None:
        """A tick's transition from ``before`` to ``after`` was committed."""
        if before is after:
            return  # the common case: a running run stays running
        if before is _PENDING and after is not _CANCELLED:
            self.started[workflow] += 1
        if after.terminal:
            self.ended[(workflow, after)] += 1

    def force_failed(self, workflow: str) -> None:
        """A force-fail (livelock guard, stuck-run watchdog) was written: an end, never a
        start (a pending run force-failed never ran)."""
        self.ended[(workflow, RunStatus.FAILED)] += 1

    def add(self, other: RunTally) -> None:
        if other.started:
            self.started.update(other.started)
        if other.ended:
            self.ended.update(other.ended)

    def __bool__(self) -> bool:
        return bool(self.started) or bool(self.ended)


__all__ = ["RunTally"]
