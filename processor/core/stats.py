"""In-process counters and latency samples of one processor instance.

The hot path only bumps integers here; the telemetry module reads them into OpenTelemetry
instruments, and tests, the demo and the benchmark read them directly. Run ids never become
labels: the hottest conflicting runs are kept in a small counter that is logged periodically.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from processor.core.run_tally import RunTally

_HISTOGRAMS = {
    "tick": "ductor.tick.duration",
    "commit": "ductor.commit.duration",
    "end_to_end": "ductor.end_to_end.latency",
    "arrival": "ductor.wakeup.arrival",
    "lateness": "ductor.delay.lateness",
}


@dataclass
class Reservoir:
    """The last ``capacity`` samples (ms): enough for percentiles without unbounded memory."""

    capacity: int = 10_000  # sorting it for the periodic stats line must stay ~1 ms
    samples: list[float] = field(default_factory=list)
    _next: int = 0

    def add(self, value: float) -> None:
        if len(self.samples) < self.capacity:
            self.samples.append(value)
        else:
            self.samples[self._next] = value
            self._next = (self._next + 1) % self.capacity

    def percentile(self, p: float) -> float | None:
        return self.percentiles(p)[0]

    def percentiles(self, *ps: float) -> list[float | None]:
        """Several percentiles from one sort."""
        if not self.samples:
            return [None for _ in ps]
        ordered = sorted(self.samples)
        last = len(ordered) - 1
        return [ordered[min(last, max(0, round(p / 100 * last)))] for p in ps]


@dataclass
class Stats:
    ticks: Counter[str] = field(default_factory=Counter)  # by outcome
    conflicts: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # by error type
    requeues: Counter[int] = field(default_factory=Counter)  # by delay rung (ms)
    force_fails: Counter[str] = field(default_factory=Counter)  # by reason
    dead_letters: Counter[str] = field(default_factory=Counter)  # by reason
    quarantined: Counter[str] = field(default_factory=Counter)  # runs flagged, by reason
    # Exceptions nobody foresaw, each isolated to the item it was met on, by where: intake,
    # request, tick, produce, trigger, sweep (docs/guarantees.md#isolation).
    isolated: Counter[str] = field(default_factory=Counter)
    records: int = 0  # wakeup records accepted
    done_before: int = 0  # records a partition's previous owner had done: not done again
    commits_sent: int = 0  # runs sent to a batched commit (a try each)
    relayed: int = 0  # records sent again from the outbox (an instance died after its commit)
    parked: Counter[str] = field(default_factory=Counter)  # outbox rows parked, by error
    rejoins: int = 0  # times the consumer joined its group again, stuck (io/kafka/group_watch.py)
    # Records of triggers' source topics by (trigger, what became of them: requested, skipped
    # by the filter, rejected).
    trigger_records: Counter[tuple[str, str]] = field(default_factory=Counter)
    # Commits whose connection was lost before the answer, by what the re-read found.
    unknown_commits: Counter[str] = field(default_factory=Counter)
    # Runs woken again because the database restarted or failed over right after their commit
    # (it may have lost it: engine/recent_commits.py).
    restart_rewakes: int = 0
    runs: RunTally = field(default_factory=RunTally)  # started, ended: by workflow (and status)
    hot_runs: Counter[str] = field(default_factory=Counter)  # conflicts by run id, logged only
    # Dispatches a full limit held back, and waiters it let in, by limit name (core/limits.py).
    limit_refused: Counter[str] = field(default_factory=Counter)
    limit_let_in: Counter[str] = field(default_factory=Counter)
    tick_ms: Reservoir = field(default_factory=Reservoir)
    commit_ms: Reservoir = field(default_factory=Reservoir)
    end_to_end_ms: Reservoir = field(default_factory=Reservoir)
    # A wakeup's way to the instance (produced to taken in): the part of end_to_end spent
    # outside it, in the producer, the broker and the fetch.
    arrival_ms: Reservoir = field(default_factory=Reservoir)
    lateness_ms: Reservoir = field(default_factory=Reservoir)
    observe: Callable[[str, float], None] | None = None  # set by telemetry: histogram hook
    # Set by telemetry: the time a waiter waited for its limit, by limit name.
    observe_limit_wait: Callable[[str, float], None] | None = None

    def limits_used(self, refused: Sequence[str], waited: Sequence[tuple[str, int]]) -> None:
        """A stage's limit decisions: dispatches held back, and each waiter let in with how
        long it waited (milliseconds), by limit name."""
        self.limit_refused.update(refused)
        for name, ms in waited:
            self.limit_let_in[name] += 1
            if self.observe_limit_wait is not None:
                self.observe_limit_wait(name, ms)

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    def conflict_rate(self) -> float:
        """Share of the commits sent that lost a version race."""
        return self.conflicts / self.commits_sent if self.commits_sent else 0.0

    def summary(self) -> dict[str, object]:
        """Totals for logs and reports (no run ids: those stay in the hot-runs log line)."""
        return {
            "records": self.records,
            "done_before": self.done_before,
            "ticks": _plain(self.ticks),
            "conflicts": self.conflicts,
            "errors": _plain(self.errors),
            "requeues": {str(k): v for k, v in sorted(self.requeues.items())},
            "force_fails": _plain(self.force_fails),
            "dead_letters": _plain(self.dead_letters),
            "quarantined": _plain(self.quarantined),
            "isolated": _plain(self.isolated),
            "commits_sent": self.commits_sent,
            "relayed": self.relayed,
            "parked": _plain(self.parked),
            "rejoins": self.rejoins,
            "triggers": {f"{t}:{o}": n for (t, o), n in sorted(self.trigger_records.items())},
            "unknown_commits": _plain(self.unknown_commits),
            "restart_rewakes": self.restart_rewakes,
            "runs_started": dict(self.runs.started),
            "runs_ended": {f"{w}:{s}": n for (w, s), n in sorted(self.runs.ended.items())},
            "latency_ms": {
                name: dict(zip(("p50", "p99"), reservoir.percentiles(50, 99), strict=True))
                for name, reservoir in (
                    ("tick", self.tick_ms),
                    ("commit", self.commit_ms),
                    ("end_to_end", self.end_to_end_ms),
                    ("arrival", self.arrival_ms),
                    ("lateness", self.lateness_ms),
                )
            },
        }

    def sample(self, name: str, value_ms: float) -> None:
        """A latency sample: kept for percentiles and handed to the telemetry histograms."""
        self._reservoirs[name].add(value_ms)
        if self.observe is not None:
            self.observe(_HISTOGRAMS[name], value_ms)

    @property
    def _reservoirs(self) -> dict[str, Reservoir]:
        return {
            "tick": self.tick_ms,
            "commit": self.commit_ms,
            "end_to_end": self.end_to_end_ms,
            "arrival": self.arrival_ms,
            "lateness": self.lateness_ms,
        }

    def take_hot_runs(self, n: int = 10) -> list[tuple[str, int]]:
        hot = self.hot_runs.most_common(n)
        self.hot_runs.clear()
        return hot


def _plain(counter: Counter[str]) -> dict[str, int]:
    """Counts keyed by plain strings (outcome enums are str subclasses, which JSON refuses)."""
    return {str(k): n for k, n in counter.items()}
