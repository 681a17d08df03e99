"""Runs waiting for a tick: their wakeups coalesced, their conflict retries parked.

Every accepted wakeup of a run joins the run's ``RunWork``, so however many wakeups arrive
(duplicates, a step result and a signal at once), an instance ticks the run once per batch.
A run that lost a version race (or whose batch the database failed) waits here for its next
try with a ready time, and never holds back another run: the book only hands out work
whose time has come.

The book's bookkeeping does not grow with its size per loop turn: ready runs wait in a FIFO,
parked ones in a heap by ready time, so a turn costs what it takes out, not what waits. Times
are plain floats from whatever monotonic clock the caller reads; nothing here reads one.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable
from typing import Generic, TypeVar

from processor.core.envelope import Wakeup
from processor.core.records import Inbound
from processor.core.shapes import TopicPartition

S = TypeVar("S")  # the shell's handle on the work's trace span (opaque here)


# A plain class, not a dataclass: a generic dataclass does not compile with mypyc (its
# dataclass support cannot rebuild a class that has Generic among its bases: mypyc issue 827).
# Compared by identity, like the dataclass(eq=False) it was.
class RunWork(Generic[S]):
    """Everything waiting for one run: its coalesced records and its in-process tries."""

    def __init__(
        self,
        run_id: str,
        records: list[Inbound] | None = None,
        tries: int = 0,
        locked: int = 0,
        prior_version: int | None = None,
        ready_at: float = 0.0,
        span: S | None = None,
    ) -> None:
        self.run_id = run_id
        self.records: list[Inbound] = [] if records is None else records
        self.tries = tries  # in-process tries that lost a version race
        self.locked = locked  # tries in a row that found the run's row held by another transaction
        self.prior_version = prior_version  # the run's version its previous try loaded
        self.ready_at = ready_at  # when the next try may start
        self.span = span

    def __repr__(self) -> str:  # the dataclass's
        return (
            f"RunWork(run_id={self.run_id!r}, records={self.records!r},"
            f" tries={self.tries!r}, locked={self.locked!r},"
            f" prior_version={self.prior_version!r}, ready_at={self.ready_at!r},"
            f" span={self.span!r})"
        )

    def lineage(self) -> Wakeup:
        """The envelope whose requeue history this work continues: the most requeued one."""
        wakeups = [r.wakeup for r in self.records if r.wakeup is not None]
        return max(wakeups, key=lambda w: (w.requeue_count, w.requeue_seq))


class RunBook(Generic[S]):
    """The runs waiting for a tick, by run id (at most one ``RunWork`` per run).

    Invariants: every work is either ready (its id in ``_ready``) or parked (an entry of
    ``_parked`` with its ready time); ``records`` counts the records of every work here.
    """

    def __init__(self) -> None:
        self._works: dict[str, RunWork[S]] = {}
        self._ready: deque[str] = deque()
        self._parked: list[tuple[float, int, str]] = []
        self._order = itertools.count()  # ties in the heap never compare run ids
        self.records = 0

    def __len__(self) -> int:
        return len(self._works)

    def add(self, record: Inbound) -> RunWork[S]:
        """Coalesce an accepted wakeup into its run's work (a new work is ready at once)."""
        assert record.wakeup is not None, "only decoded wakeups are ticked"
        run_id = record.wakeup.run_id
        work = self._works.get(run_id)
        if work is None:
            work = self._works[run_id] = RunWork(run_id)
            self._ready.append(run_id)
        work.records.append(record)
        self.records += 1
        return work

    def take_ready(self, now: float, limit: int) -> list[RunWork[S]]:
        """Remove and return up to ``limit`` works whose ready time has come, oldest first."""
        self._promote(now)
        taken: list[RunWork[S]] = []
        while self._ready and len(taken) < limit:
            work = self._works.pop(self._ready.popleft())
            self.records -= len(work.records)
            taken.append(work)
        return taken

    def park(self, work: RunWork[S], ready_at: float) -> None:
        """Put work back until ``ready_at``. Records that came for the run while the work was
        in flight wait in a work of their own, ready at once: they merge into this one, and the
        earlier ready time wins (a fresh wakeup, a step result say, is not held by a backoff)."""
        self.records += len(work.records)
        existing = self._works.get(work.run_id)
        if existing is not None:  # ready (it was created while this work was in flight)
            work.records.extend(existing.records)
            work.ready_at = min(ready_at, existing.ready_at)
            self._works[work.run_id] = work  # takes the existing work's place in the FIFO
            return
        work.ready_at = ready_at
        self._works[work.run_id] = work
        heapq.heappush(self._parked, (ready_at, next(self._order), work.run_id))

    def ready_count(self, now: float) -> int:
        self._promote(now)
        return len(self._ready)

    def next_ready_at(self) -> float | None:
        if self._ready:
            return 0.0
        return self._parked[0][0] if self._parked else None

    def drop_partitions(self, revoked: Iterable[TopicPartition]) -> list[RunWork[S]]:
        """Forget records of revoked partitions (their next owner redoes them). Returns the
        works left with no record at all, removed from the book. (A rebalance is rare: this
        rebuilds the bookkeeping.)"""
        gone = set(revoked)
        emptied: list[RunWork[S]] = []
        for run_id, work in list(self._works.items()):
            work.records = [r for r in work.records if r.tp not in gone]
            if not work.records:
                del self._works[run_id]
                emptied.append(work)
        self._ready = deque(r for r in self._ready if r in self._works)
        self._parked = [entry for entry in self._parked if entry[2] in self._works]
        heapq.heapify(self._parked)
        self.records = sum(len(w.records) for w in self._works.values())
        return emptied

    def clear(self) -> list[RunWork[S]]:
        """Forget everything (shutdown): the records were never acknowledged, so the group
        redelivers them. Returns what was dropped."""
        dropped = list(self._works.values())
        self._works.clear()
        self._ready.clear()
        self._parked.clear()
        self.records = 0
        return dropped

    def _promote(self, now: float) -> None:
        """Parked works whose ready time has come join the ready FIFO."""
        while self._parked and self._parked[0][0] <= now:
            _at, _order, run_id = heapq.heappop(self._parked)
            self._ready.append(run_id)
