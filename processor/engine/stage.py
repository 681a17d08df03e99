"""The database stage of the commit path (steps 1 to 3 of a batch: engine/executor.py holds the
numbered list), run on a daemon thread of its own with its own Database, so the poll loop keeps
consuming, delivering and storing offsets while Postgres works.

What the stage does, and in what order, is decided by the batch protocol (core/batch.py): a
generator that yields requests and is sent their answers. This is its driver: it carries out
each request on the database (or at a fault point), sends back the answer, or ``Failed`` with
what the one classifier (io/postgres/db_errors.py) says the error means, and times the phases with
the one injected clock. A request whose failure fails nothing (waking waiters, a force-fail, the
quarantine flags) drops the connection, so the next statement opens a new one.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

from processor.core.batch import batch
from processor.core.batch_values import (
    BatchOutcome,
    CommitRuns,
    DeleteOutbox,
    Failed,
    Failure,
    FlagQuarantine,
    LoadLimits,
    LoadRuns,
    MeetServer,
    NoteCommitted,
    ProbeDecide,
    ReadBack,
    Request,
    WakeWaiters,
    WriteForceFail,
)
from processor.core.plans import BatchItem, Rules
from processor.core.shapes import OutboxKey
from processor.engine.database import Database
from processor.engine.recent_commits import RecentCommits
from processor.engine.stage_thread import InFlight, StageThread
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.db_errors import Fault, classify
from processor.io.runtime.clock import SYSTEM_CLOCK, Clock
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.runtime.threads import ThreadWatch


@dataclass(frozen=True, slots=True)
class Timings:
    """When the batch's phases ended (epoch ns, for its spans' events) and how long they took
    (ms); of its last round when it was split. A stage that ticked nothing has zeros."""

    started_ns: int
    tick_ended_ns: int = 0
    commit_ended_ns: int = 0
    tick_ms: float = 0.0
    commit_ms: float = 0.0


@dataclass(frozen=True, slots=True)
class Staged:
    """What the database stage of one batch came to, and how long its phases took."""

    outcome: BatchOutcome
    timings: Timings


class _Timer:
    """The phases of a stage by the one clock's monotonic time; the wall clock is read once,
    to place them (a span's events)."""

    __slots__ = ("_clock", "_committed", "_round", "_started", "_started_ns", "_ticked")

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._started = self._round = clock.monotonic()
        self._started_ns = clock.wall_ms() * 1_000_000
        self._ticked: float | None = None  # (None: not yet)
        self._committed: float | None = None

    def round_started(self) -> None:
        self._round = self._clock.monotonic()

    def ticked(self) -> None:
        self._ticked = self._clock.monotonic()

    def committed(self) -> None:
        self._committed = self._clock.monotonic()

    def timings(self) -> Timings:
        ticked = self._ticked
        if ticked is None:
            return Timings(self._started_ns)
        committed = ticked if self._committed is None else max(self._committed, ticked)
        return Timings(
            self._started_ns,
            self._started_ns + round((ticked - self._started) * 1e9),
            self._started_ns + round((committed - self._started) * 1e9),
            (ticked - self._round) * 1000,
            (committed - ticked) * 1000,
        )


# Requests whose failure fails nothing of the batch: their connection is dropped.
_DROPS_CONNECTION = (WakeWaiters, WriteForceFail, FlagQuarantine)


def failure_of(exc: Exception) -> Failure:
    """What an error met carrying out a request means for the batch (io/postgres/db_errors.py)."""
    if not isinstance(exc, psycopg.Error):
        return Failure.UNFORESEEN
    fault = classify(exc)
    if fault is Fault.CONNECTION:
        return Failure.LOST
    return Failure.ROW if fault is Fault.ROW else Failure.DATABASE


class DatabaseStage:
    def __init__(
        self,
        database: Database,
        rules: Rules,
        db_clock: DatabaseClock,
        faults: Faults = NO_FAULTS,
        recent: RecentCommits | None = None,
        threads: ThreadWatch | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._db = database
        self._rules = rules
        self._db_clock = db_clock
        self._clock = clock
        self._faults = faults
        self._decide_fault = faults.at(Point.DECIDE)  # (asked per run: probed only if armed)
        self._runner = StageThread(threads=threads)
        self._recent = recent or RecentCommits()

    def start(self, items: list[BatchItem], acknowledged: list[OutboxKey]) -> InFlight[Staged]:
        """Run the stage on the database thread (the executor starts one only once the
        previous one ended)."""
        return self._runner.submit(lambda: self.run(items, acknowledged))

    def use_rules(self, rules: Rules) -> None:
        self._rules = rules  # read by the next batch's thread (one batch at a time)

    def close(self) -> None:
        """Forget the connection (after a failure, or at the end); the next batch reopens it."""
        self._db.close()

    def run(self, items: list[BatchItem], acknowledged: list[OutboxKey]) -> Staged:
        """Drive the batch protocol to its outcome: each request carried out, its answer sent
        back. Touches nothing but its Database, the recent commits and its result."""
        timer = _Timer(self._clock)
        protocol = batch(items, tuple(acknowledged), self._rules, self._decide_fault)
        try:
            request = next(protocol)
            while True:
                request = protocol.send(self._answer(request, timer))
        except StopIteration as done:
            outcome: BatchOutcome = done.value
        return Staged(outcome, timer.timings())

    def _answer(self, request: Request, timer: _Timer) -> object:
        try:
            return self._carry_out(request, timer)
        except Exception as exc:
            if isinstance(request, _DROPS_CONNECTION) and isinstance(exc, psycopg.Error):
                self._db.close()
            return Failed(exc, failure_of(exc))

    def _carry_out(self, request: Request, timer: _Timer) -> object:
        """One request on the database (in the order a batch meets them)."""
        db = self._db
        if isinstance(request, LoadRuns):
            timer.round_started()
            sent_ms = self._db_clock.local_ms()
            loaded, now_ms = db.load_at(request.run_ids)
            self._db_clock.observe(now_ms, sent_ms, self._db_clock.local_ms())
            return loaded, now_ms
        if isinstance(request, LoadLimits):
            limits = db.load_limits(request.loaded)
            self._faults.hit(Point.TICK, list(request.run_ids))
            return limits
        if isinstance(request, CommitRuns):
            timer.ticked()
            return db.commit(request.commits, request.acknowledged)
        if isinstance(request, NoteCommitted):
            self._faults.hit(Point.AFTER_COMMIT, set(request.committed))
            self._recent.add(self._clock.monotonic(), request.runs)
            timer.committed()
            return None
        if isinstance(request, MeetServer):
            return tuple(self._recent.met(db.server_started()))
        return self._carry_out_rare(request)

    def _carry_out_rare(self, request: Request) -> object:
        db = self._db
        if isinstance(request, ProbeDecide):
            self._faults.hit(Point.DECIDE, request.run_id)
            return None
        if isinstance(request, ReadBack):
            db.close()  # the commit's connection failed: read on a new one
            return db.landed(request.commits)
        if isinstance(request, WakeWaiters):
            # A tuple, as the protocol casts it: the compiled build checks a cast's type.
            return tuple(db.waiters_to_wake(request.freed))
        if isinstance(request, WriteForceFail):
            return db.force_fail(request.write)
        if isinstance(request, FlagQuarantine):
            return db.quarantine(request.flags)
        if isinstance(request, DeleteOutbox):
            db.delete_outbox(request.acknowledged)
            return None
        raise AssertionError(f"no such request: {request!r}")


__all__ = ["DatabaseStage", "Staged", "Timings", "failure_of"]
