"""The database stage of the commit path: steps 1 to 3 of a batch (engine/executor.py holds the
numbered list), run on a daemon thread of its own with its own Database, so the poll loop keeps
consuming, delivering and storing offsets while Postgres works.

1. Load every run of the batch in one query.
2. Tick each run (pure, ``tick_batch``); a no-op writes nothing.
3. Commit every changed run in one conditional UPDATE that also writes the transitions'
   records to the outbox and deletes the acknowledged outbox rows; a run whose row another
   transaction holds is skipped (and retried apart); a commit whose answer was lost with its
   connection is read back. The core then decides each run's plan
   (``decide``); a livelocked run's force-fail is written here (the terminal path).

One run never holds its batch: a statement that fails on what one run holds, and any
exception nobody foresaw before the commit went (a row that cannot be encoded, a tick that
raises), is isolated by trying each half of the batch apart, down to the run that makes it
fail, which is dead-lettered and quarantined (``poisoned``, ``failed_unexpectedly``). After
the commit each run's plan is decided apart, so an exception there is its run's alone.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import psycopg

from processor.core.decide import (
    BatchItem,
    Commit,
    Plan,
    Rules,
    database_failed,
    decide,
    failed_unexpectedly,
    force_fail_refused,
    poisoned,
    tick_batch,
)
from processor.core.model import Loaded, LoadedRun
from processor.core.outcomes import Outcome
from processor.core.run_tally import RunTally
from processor.engine.database import Database
from processor.engine.recent_commits import RecentCommits
from processor.io.db_clock import DatabaseClock
from processor.io.db_errors import item_fault, outcome_unknown
from processor.io.faults import NO_FAULTS, Faults, Point
from processor.io.logs import describe
from processor.io.store import CommitAnswer, QuarantineFlag
from processor.io.telemetry import now_ns
from processor.io.threads import ThreadWatch


@dataclass
class StageResult:
    """What the database stage of one batch found and decided (steps 1 to 3)."""

    started_ns: int
    acknowledged: list[tuple[str, int]]  # outbox rows this stage deletes
    plans: list[Plan] = field(default_factory=list)
    # The whole batch failed: nothing was decided. A database error, or (rarely) an exception
    # nobody foresaw that is no run's own (met before any run was loaded): retried alike.
    error: Exception | None = None
    # Exceptions nobody foresaw, each isolated to its run: (run id, the exception), for the
    # ledger to count and log on the loop thread.
    isolated: list[tuple[str, Exception]] = field(default_factory=list)
    # The commit's answer was lost with its connection (then resolved by reading it back).
    unknown_commit: psycopg.Error | None = None
    not_landed: set[str] = field(default_factory=set)
    redo_acknowledged: bool = False  # the outbox deletions did not land either
    force_fail_errors: dict[str, psycopg.Error] = field(default_factory=dict)
    quarantined: list[Plan] = field(default_factory=list)  # plans whose run this stage flagged
    quarantine_error: psycopg.Error | None = None  # the flags could not be written
    commit_attempts: int = 0
    runs: RunTally = field(default_factory=RunTally)  # runs this stage's commits started, ended
    tick_ended_ns: int = 0
    commit_ended_ns: int = 0
    tick_ms: float = 0.0
    commit_ms: float = 0.0
    # Waiters of limits whose slots this stage's commits freed, to wake: (run id, tier).
    limit_wakes: list[tuple[str, str]] = field(default_factory=list)
    # (limit name, ms) that each waiter let in had waited for its limit, and a limit name per
    # dispatch a full limit held back.
    limit_waited: list[tuple[str, int]] = field(default_factory=list)
    limit_refused: list[str] = field(default_factory=list)
    # The database restarted (or failed over) since the last stage: the runs committed just
    # before, (run id, tier), to wake again (engine/recent_commits.py).
    replay: list[tuple[str, str]] = field(default_factory=list)


class DatabaseStage:
    def __init__(
        self,
        database: Database,
        rules: Rules,
        clock: DatabaseClock,
        faults: Faults = NO_FAULTS,
        recent: RecentCommits | None = None,
        threads: ThreadWatch | None = None,
    ) -> None:
        self._db = database
        self._rules = rules
        self._clock = clock
        self._faults = faults
        self._decide_fault = faults.at(Point.DECIDE)  # (asked per run: a bool)
        self._runner = StageThread(threads=threads)
        self._recent = recent or RecentCommits()

    def start(
        self, items: list[BatchItem], acknowledged: list[tuple[str, int]]
    ) -> InFlight[StageResult]:
        """Run the stage on the database thread (the executor starts one only once the
        previous one ended)."""
        return self._runner.submit(lambda: self.run(items, acknowledged))

    def use_rules(self, rules: Rules) -> None:
        self._rules = rules  # read by the next batch's thread (one batch at a time)

    def close(self) -> None:
        """Forget the connection (after a failure, or at the end); the next batch reopens it."""
        self._db.close()

    def run(self, items: list[BatchItem], acknowledged: list[tuple[str, int]]) -> StageResult:
        """Steps 1 to 3 for ``items``, deleting the ``acknowledged`` outbox rows on the way.
        Touches nothing but its Database and its result; with no run to tick, it only
        deletes the rows. A database that fails the batch (unreachable, a timeout) decides
        nothing: ``error`` says why, and the executor retries the batch."""
        result = StageResult(started_ns=now_ns(), acknowledged=acknowledged)
        try:
            self._after_restart(result)
            if not items:
                self._db.delete_outbox(acknowledged)
            else:
                self._isolating_poison(items, acknowledged, result)
        except Exception as exc:  # the database's (or no run's own): the batch is retried whole
            result.error = exc
            result.plans.clear()
            return result
        self._quarantine(result)
        return result

    def _after_restart(self, result: StageResult) -> None:
        """The runs committed just before a restart of the database, if the connection meets
        a server started anew (engine/recent_commits.py)."""
        result.replay = self._recent.met(self._db.server_started())

    def _remember(self, committed: set[str], loaded: dict[str, Loaded]) -> None:
        runs = []
        for run_id in committed:
            found = loaded.get(run_id)
            if isinstance(found, LoadedRun):
                runs.append((run_id, found.tier))
        self._recent.add(time.monotonic(), runs)

    def _quarantine(self, result: StageResult) -> None:
        """Flag the runs whose rows the plans found unusable. The flag only spares the sweeps:
        one that could not be written is written when the run is met again, so a failure
        here fails nothing of the batch."""
        flagged = [p for p in result.plans if p.quarantine]
        if not flagged:
            return
        try:
            done = self._db.quarantine(
                [
                    QuarantineFlag(p.run_id, f"{p.reason}: {p.detail}", p.expected_version)
                    for p in flagged
                ]
            )
        except psycopg.Error as exc:
            self._db.close()
            result.quarantine_error = exc
            return
        result.quarantined = [p for p in flagged if p.run_id in done]

    def _isolating_poison(
        self, items: list[BatchItem], acknowledged: list[tuple[str, int]], result: StageResult
    ) -> None:
        """Steps 1 to 3; a statement that fails on what one run holds (not on the connection),
        or an exception nobody foresaw before the commit went, is tried again on each half of
        the batch, down to the run that makes it fail, which is dead-lettered (poison, or
        unexpected_error) and quarantined: one bad run never holds the others."""
        try:
            self._steps(items, acknowledged, result)
        except Exception as exc:
            # Text Postgres cannot store, a constraint, a value that cannot be encoded, a tick
            # that raises: another run of the batch would not meet it. Anything else is the
            # database's (io/db_errors.py): the batch is retried whole.
            if not item_fault(exc):
                raise
            if len(items) == 1:
                self._db.delete_outbox(acknowledged)  # the failed statement did not
                if isinstance(exc, psycopg.Error):
                    result.plans.append(poisoned(items[0], describe(exc), self._rules))
                else:
                    result.isolated.append((items[0].run_id, exc))
                    plan = failed_unexpectedly(items[0], describe(exc), self._rules)
                    result.plans.append(plan)
                return
            half = len(items) // 2
            self._isolating_poison(items[:half], acknowledged, result)
            self._isolating_poison(items[half:], [], result)

    def _steps(
        self, items: list[BatchItem], acknowledged: list[tuple[str, int]], result: StageResult
    ) -> None:
        started = time.perf_counter()
        run_ids = [item.run_id for item in items]
        # 1. Load, at Postgres's time: the batch is judged by it (io/db_clock.py).
        sent_ms = self._clock.local_ms()
        loaded, now_ms = self._db.load_at(run_ids)
        self._clock.observe(now_ms, sent_ms, self._clock.local_ms())
        # 2. Tick (with what the batch's limited steps count on: core/limits.py).
        limits = self._db.load_limits(loaded)
        self._faults.hit(Point.TICK, run_ids)
        commits = tick_batch(loaded, now_ms, self._rules.names, limits)
        result.tick_ended_ns, result.tick_ms = now_ns(), (time.perf_counter() - started) * 1000
        # 3. Commit.
        commit_started = time.perf_counter()
        try:
            committed, held = self._db.commit(list(commits.values()), acknowledged)
        except psycopg.Error as exc:
            if not outcome_unknown(exc):
                raise  # refused: nothing was written (a deadlock, a timeout: retried)
            committed, held = self._resolve_unknown_commit(list(commits.values()), exc, result)
        self._faults.hit(Point.AFTER_COMMIT, committed)
        self._remember(committed, loaded)
        result.commit_ended_ns = now_ns()
        result.commit_ms = (time.perf_counter() - commit_started) * 1000
        result.commit_attempts += len(commits)
        self._after_limits(commits, committed, result)
        for item in items:
            # The commit went: from here an exception is one run's own, never the batch's (a
            # bisection would only tick again what committed).
            try:
                plan = self._plan(item, loaded, commits, committed, held, now_ms, result)
            except Exception as unforeseen:
                result.isolated.append((item.run_id, unforeseen))
                plan = failed_unexpectedly(item, describe(unforeseen), self._rules)
            result.plans.append(plan)

    def _plan(
        self,
        item: BatchItem,
        loaded: dict[str, Loaded],
        commits: dict[str, Commit],
        committed: set[str],
        held: set[str],
        now_ms: int,
        result: StageResult,
    ) -> Plan:
        """One run's plan once the commit answered (its force-fail written)."""
        run_id = item.run_id
        if run_id in result.not_landed:  # lost with its connection: try again at once
            return database_failed(item, 0)
        if self._decide_fault:
            self._faults.hit(Point.DECIDE, run_id)
        found, commit = loaded.get(run_id), commits.get(run_id)
        plan = decide(item, found, commit, run_id in committed, now_ms, self._rules, run_id in held)
        if plan.force_fail is not None:
            return self._write_force_fail(plan, item, found, result)
        if plan.outcome is Outcome.COMMITTED:
            assert commit is not None and isinstance(found, LoadedRun)
            # Only a commit that landed is counted: a conflict, or a commit lost with its
            # connection and not found landed, never gets here (core/run_tally.py).
            before, after = found.state.status, commit.state.status
            if before is not after:
                result.runs.committed(found.wf.name, before, after)
        return plan

    def _after_limits(
        self, commits: dict[str, Commit], committed: set[str], result: StageResult
    ) -> None:
        """The waiters to wake for the slots the landed commits freed, and how long those let
        in had waited. A failure to read the waiters fails nothing: each looks again by
        itself (core/limits.py, BACKSTOP_MS)."""
        freed: Counter[str] = Counter()
        for run_id in committed:
            limits = commits[run_id].limits if run_id in commits else None
            if limits is not None:
                freed.update(limits.released)
                result.limit_waited += limits.waited
                result.limit_refused += limits.refused
        if not freed:
            return
        try:
            result.limit_wakes = self._db.waiters_to_wake(freed)
        except psycopg.Error:
            self._db.close()
        except Exception as exc:  # nobody foresaw it: counted and logged, it fails nothing
            result.isolated.append(("the waiters of freed limits", exc))

    def _resolve_unknown_commit(
        self, commits: list[Commit], exc: psycopg.Error, result: StageResult
    ) -> CommitAnswer:
        """The connection was lost while the commit was in flight: it may have landed or not.
        Read the rows back on a new connection: a run at the version and checksum the commit
        wrote landed (its records are in the outbox too); the others did not, and neither
        did the outbox deletions. Raises psycopg.Error if the database cannot be read."""
        self._db.close()
        landed = self._db.landed(commits)
        result.unknown_commit = exc
        result.not_landed = {c.run_id for c in commits} - landed
        if result.not_landed:
            result.redo_acknowledged = True
        return CommitAnswer(landed, set())

    def _write_force_fail(
        self, plan: Plan, item: BatchItem, found: Loaded | None, result: StageResult
    ) -> Plan:
        assert plan.force_fail is not None and isinstance(found, LoadedRun)
        try:
            written = self._db.force_fail(plan.force_fail)
        except psycopg.Error as exc:
            self._db.close()
            result.force_fail_errors[item.run_id] = exc
            return database_failed(item, 0)  # the delay is the outage's (the executor's)
        if not written:
            return force_fail_refused(plan)
        result.runs.force_failed(found.wf.name)
        return plan


R = TypeVar("R")


class StageThread:
    """The daemon thread the database stages run on, one after the other, for the process's
    life. Daemon: a hung query never keeps the process from exiting within its shutdown
    bound. One thread rather than one per batch: starting a thread (and waiting for it to
    start, through a Condition written in Python) cost each batch tens of microseconds, which
    a batch of a few runs at moderate load pays per run."""

    def __init__(self, name: str = "ductor-db", threads: ThreadWatch | None = None) -> None:
        self._stages: queue.SimpleQueue[InFlight[object]] = queue.SimpleQueue()
        # Not `_thread`: mypyc names an attribute's C field `__thread`, a keyword of GCC's
        # (thread-local storage), and the compiled build would not compile.
        self._runner: threading.Thread | None = None
        self._name = name
        self._threads = threads or ThreadWatch()  # should it die, the health probes say so

    def submit(self, stage: Callable[[], R]) -> InFlight[R]:
        in_flight = InFlight(stage)
        if self._runner is None:
            self._runner = self._threads.start(self._serve, self._name)
        self._stages.put(in_flight)  # type: ignore[arg-type]  # (run() only: its type is no matter)
        return in_flight

    def _serve(self) -> None:
        while True:
            self._stages.get().run()


class InFlight(Generic[R]):
    """A database stage submitted to the database thread. ``done`` and ``wait`` are one lock
    operation each, cheap enough for every turn of the poll loop (a Future's go through a
    Condition written in Python)."""

    def __init__(self, stage: Callable[[], R]) -> None:
        self._stage = stage
        self._finished = threading.Lock()
        self._finished.acquire()  # released by the database thread when the stage ends
        self._result: R | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        """Called on the database thread."""
        try:
            self._result = self._stage()
        except BaseException as exc:  # a bug: surfaced on the poll-loop thread by result()
            self._error = exc
        finally:
            self._finished.release()

    def done(self) -> bool:
        return self.wait(0)

    def wait(self, timeout_s: float | None) -> bool:
        """Whether the stage ended within ``timeout_s`` (None: wait for it)."""
        if timeout_s is None:
            ended = self._finished.acquire()
        elif timeout_s <= 0:
            ended = self._finished.acquire(blocking=False)
        else:
            ended = self._finished.acquire(timeout=timeout_s)
        if ended:
            self._finished.release()
        return ended

    def result(self, timeout_s: float | None = None) -> R:
        """The stage's result; TimeoutError if it did not end within ``timeout_s``."""
        if not self.wait(timeout_s):
            raise TimeoutError(f"the database stage did not end within {timeout_s} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result
