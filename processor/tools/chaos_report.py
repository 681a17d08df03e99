"""The chaos run's figures and the report printed at the end (processor/tools/chaos.py); the
checks that fill it are chaos_checks.py's."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from processor.io.kafka.dlq import DeadLetter
from processor.tools.audit import TimedOut
from processor.tools.chaos_fleet import (
    KILL_AFTER_COMMIT,
    KILL_PROCESSOR,
    KILL_WORKER,
)
from processor.tools.chaos_hostile_check import HostileVerdict

BROKER, POSTGRES, FREEZE = "broker restart", "postgres restart", "postgres freeze"
LOCK = "outside lock"  # a run's row held FOR UPDATE by a transaction not ours
_KILL_KINDS = (KILL_PROCESSOR, KILL_WORKER, KILL_AFTER_COMMIT)


@dataclass(frozen=True)
class FaultWindow:
    """A fault as it happened: a kill (start == end) or an outage, in wall-clock seconds."""

    kind: str  # BROKER, POSTGRES, FREEZE, LOCK or one of the kill kinds of chaos_fleet
    what: str  # the process killed, the run held ("" for an outage)
    start: float
    end: float


@dataclass
class Totals:
    """The processors' stats summed over every start of every processor."""

    committed: int = 0
    conflicts: int = 0
    relayed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unknown_commits: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    force_fails: Counter[str] = field(default_factory=Counter)

    @staticmethod
    def of(stats: Sequence[dict[str, Any]]) -> Totals:
        t = Totals()
        for s in stats:
            t.committed += s["ticks"].get("committed", 0)
            t.conflicts += s["conflicts"]
            t.relayed += s["relayed"]
            t.errors.update(s["errors"])
            t.unknown_commits.update(s["unknown_commits"])
            t.dead_letters.update(s["dead_letters"])
            t.force_fails.update(s["force_fails"])
        return t


@dataclass
class ChaosReport:
    runs: int
    step_timeout_s: float
    copies: int
    seed: int
    processors: int
    workers: int
    elapsed_s: float
    outcomes: dict[tuple[str, str | None], int]
    kills: Counter[str]
    restarts: int
    windows: list[FaultWindow]
    finished_after_s: float | None  # from the end of the last fault to every run ended
    totals: Totals
    writes: int | None  # audit rows checked (None: the check failed)
    timeouts: list[TimedOut]
    never_ran: int  # of them, attempts no worker took (lost tasks: a problem)
    # Attempts whose step ran, and the executions beyond one per attempt (chaos_steps.py).
    attempts_run: int
    extra_executions: int
    # Timed-out attempts by the first fault in flight that can delay a step for real (see
    # chaos_checks._REAL_CAUSES; "no such fault" is a problem).
    timeout_causes: Counter[str]
    problems: list[str]
    lost_starts: int = 0  # runs inserted without a start wakeup: the sweep started them
    ended_while_locked: int = 0  # runs that ended while a row was held from outside
    # Writes to run rows that left the version where it was, by the columns they changed.
    unversioned: Counter[str] = field(default_factory=Counter)
    # The dead-letter topic as its readers see it: one per bad record (io/kafka/dlq.py).
    dead_letters: list[DeadLetter] = field(default_factory=list)
    # The hostile producer's records and the map run (processor/tools/chaos_hostile_check.py).
    hostile: HostileVerdict | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        out = [f"Ductor chaos run (real Kafka and Postgres on this machine, seed {self.seed})"]
        rows = [*self._fault_rows(), *self._result_rows()]
        out += [f"  {label:16} {value}" for label, value in rows]
        out.append(
            "  (stats of killed processors stop at their last periodic line: up to a second"
            " is missing)"
        )
        if self.problems:
            out.append(f"FAILED: {len(self.problems)} problem(s)")
            out += [f"  - {p}" for p in self.problems]
        else:
            out.append("PASSED: every check held")
        return out

    def _fault_rows(self) -> list[tuple[str, str]]:
        """What the run was and what was done to it."""
        outages = {
            k: [w for w in self.windows if w.kind == k] for k in (BROKER, POSTGRES, FREEZE, LOCK)
        }
        kills = ", ".join(f"{self.kills[k]} {k}" for k in _KILL_KINDS)
        ended = f"; {self.ended_while_locked} other runs ended meanwhile" if outages[LOCK] else ""
        return [
            (
                "runs",
                f"{self.runs} of the sample workflow (steps time out after"
                f" {self.step_timeout_s:.0f} s), each start wakeup delivered {self.copies} times"
                " onto random partitions",
            ),
            (
                "processes",
                f"{self.processors} processors, {self.workers} workers;"
                f" {self.restarts} restarts after kills",
            ),
            ("kills", f"{sum(self.kills.values())}: {kills}"),
            ("broker", _outage(outages[BROKER], "SIGKILL and restart on its data")),
            ("postgres", _outage(outages[POSTGRES], "immediate restart")),
            ("freeze", _outage(outages[FREEZE], "frozen behind the proxy")),
            ("outside lock", _outage(outages[LOCK], "a live run's row held FOR UPDATE") + ended),
            (
                "lost starts",
                f"{self.lost_starts} runs inserted without their start wakeup, started by the sweep"
                if self.lost_starts
                else "none",
            ),
        ]

    def _result_rows(self) -> list[tuple[str, str]]:
        """What the checks found, and the processors' figures."""
        t = self.totals
        finished = (
            f"{self.finished_after_s:.1f} s after the last fault"
            if self.finished_after_s is not None
            else "NOT ALL (see problems)"
        )
        outcomes = ", ".join(
            f"{n} {status}" + (f" ({reason})" if reason else "")
            for (status, reason), n in sorted(self.outcomes.items(), key=lambda kv: -kv[1])
        )
        audited = (
            f"{self.writes} committed writes checked"
            if self.writes is not None
            else "FAILED (see problems)"
        )
        unversioned = _counts(self.unversioned)
        timeouts = (
            f" ({self.never_ran} never reached a worker),"
            f" in flight during: {_counts(self.timeout_causes)}"
            if self.timeouts
            else ""
        )
        return [
            ("duration", f"{self.elapsed_s:.0f} s; every run ended {finished}"),
            ("outcomes", outcomes or "none"),
            ("audit", audited),
            (
                "one writer",
                f"{sum(self.unversioned.values())} writes to a run row that did not move its"
                " version" + (f" ({unversioned})" if self.unversioned else ""),
            ),
            ("timeouts", f"{len(self.timeouts)} attempts timed out{timeouts}"),
            (
                "executions",
                f"{self.attempts_run} attempts ran; {self.extra_executions} executions beyond"
                f" one per attempt ({_share(self.extra_executions, self.attempts_run)}), each"
                " where a process died or a deadline passed",
            ),
            ("relayed", f"{t.relayed} records sent again from the outbox"),
            ("ticks", f"{t.committed} committed, {t.conflicts} conflicts"),
            ("errors", _counts(t.errors)),
            ("unknown commits", _counts(t.unknown_commits)),
            ("dead letters", _dead_letters(t.dead_letters, self.dead_letters)),
            ("force-fails", _counts(t.force_fails)),
            *(self.hostile.rows() if self.hostile is not None else []),
        ]


def _dead_letters(sent: Counter[str], letters: list[DeadLetter]) -> str:
    """What the processors sent (a record redone after a kill is sent again) and what the
    topic holds, one per bad record."""
    if not sent and not letters:
        return "none"
    again = sum(letter.copies - 1 for letter in letters)
    held = Counter(letter.reason for letter in letters)
    return (
        f"{_counts(sent)} sent; in the topic {len(letters)} bad records ({_counts(held)}),"
        f" {again} copies sent again after a kill, each counted once"
    )


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f} %" if whole else "none"


def _outage(windows: list[FaultWindow], what: str) -> str:
    if not windows:
        return "none"
    downs = ", ".join(f"{w.end - w.start:.1f} s" for w in windows)
    return f"{len(windows)} x {what} (unavailable {downs})"


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counter.most_common()) or "none"
