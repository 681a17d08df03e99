"""Runs waiting for a tick: their wakeups coalesced, their conflict retries parked.

Every accepted wakeup of a run joins the run's ``RunWork``, so however many wakeups arrive
(duplicates, a step result and a signal at once), an instance ticks the run once per batch.
A run that lost a version race waits here for its next in-process attempt with a ready time,
and never holds back another run: the book only hands out work whose time has come.

Times are plain floats from whatever monotonic clock the caller reads; nothing here reads one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from processor.core.envelope import Wakeup
from processor.core.records import Inbound, TopicPartition

S = TypeVar("S")  # the shell's handle on the work's trace span (opaque here)


@dataclass(eq=False)
class RunWork(Generic[S]):
    """Everything waiting for one run: its coalesced records and its in-process attempts."""

    run_id: str
    records: list[Inbound] = field(default_factory=list)
    attempts: int = 0  # in-process attempts that lost a version race
    ready_at: float = 0.0  # when the next attempt may start
    span: S | None = None

    def lineage(self) -> Wakeup:
        """The envelope whose requeue history this work continues: the most requeued one."""
        wakeups = [r.wakeup for r in self.records if r.wakeup is not None]
        return max(wakeups, key=lambda w: (w.requeue_count, w.attempt))


class RunBook(Generic[S]):
    """The runs waiting for a tick, by run id (at most one ``RunWork`` per run)."""

    def __init__(self) -> None:
        self._works: dict[str, RunWork[S]] = {}

    def __len__(self) -> int:
        return len(self._works)

    def add(self, record: Inbound) -> RunWork[S]:
        """Coalesce an accepted wakeup into its run's work (created ready at once)."""
        assert record.wakeup is not None, "only decoded wakeups are ticked"
        run_id = record.wakeup.run_id
        work = self._works.get(run_id)
        if work is None:
            work = self._works[run_id] = RunWork(run_id)
        work.records.append(record)
        return work

    def take_ready(self, now: float, limit: int) -> list[RunWork[S]]:
        """Remove and return up to ``limit`` works whose ready time has come."""
        ready = [w for w in self._works.values() if w.ready_at <= now][:limit]
        for work in ready:
            del self._works[work.run_id]
        return ready

    def park(self, work: RunWork[S], ready_at: float) -> None:
        """Put work back until ``ready_at``. Records that came for the run while the work was
        in flight wait in a work of their own, ready at once: they merge into this one, and the
        earlier ready time wins (a fresh wakeup, a step result say, is not held by a backoff)."""
        work.ready_at = ready_at
        existing = self._works.get(work.run_id)
        if existing is not None:
            work.records.extend(existing.records)
            work.ready_at = min(work.ready_at, existing.ready_at)
        self._works[work.run_id] = work

    def ready_count(self, now: float) -> int:
        return sum(1 for w in self._works.values() if w.ready_at <= now)

    def next_ready_at(self) -> float | None:
        return min((w.ready_at for w in self._works.values()), default=None)

    def drop_partitions(self, revoked: Iterable[TopicPartition]) -> list[RunWork[S]]:
        """Forget records of revoked partitions (their next owner redoes them). Returns the
        works left with no record at all, removed from the book."""
        gone = set(revoked)
        emptied: list[RunWork[S]] = []
        for run_id, work in list(self._works.items()):
            work.records = [r for r in work.records if r.tp not in gone]
            if not work.records:
                del self._works[run_id]
                emptied.append(work)
        return emptied

    def clear(self) -> list[RunWork[S]]:
        """Forget everything (shutdown): the records were never acknowledged, so the group
        redelivers them. Returns what was dropped."""
        dropped = list(self._works.values())
        self._works.clear()
        return dropped
