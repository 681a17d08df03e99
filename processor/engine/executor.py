"""The batch engine: coalesce wakeups per run, load, tick, commit, retry conflicts, emit effects.

The commit path of one run, numbered as it happens (a crash between any two steps is safe):

1. Load the run (batched: one query for the whole batch).
2. Compute the pure tick. A no-op tick writes nothing and its records are done.
3. Commit with the conditional UPDATE (batched: one statement, each run with its own expected
   version). Zero rows for a run is a conflict: retried in process after 0/10/20/40/1000 ms
   from fresh state, then requeued to the delay ladder or force-failed (policy.py).
   A crash here loses nothing: the records' offsets are not stored, so they are redelivered
   and the redelivered tick either finds the commit done (no-op) or does it.
4. Produce the effects (step dispatches, timer wakeups, requeues, dead letters).
   A crash between 3 and 4 loses effects, never transitions: a dispatched step's deadline and
   a timer are on the row (next_wakeup_at) and the watchdog re-wakes the run when they are due.
5. Once the broker acknowledged every effect of a record, the record is done and its offset
   may be stored (offsets.py keeps the stored offset behind any record still in flight).

Waiting between in-process attempts never blocks: a conflicted run is parked with a ready
time and the poll loop goes on serving every other run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import psycopg

from processor.core.envelope import Wakeup
from processor.core.model import LoadedRun
from processor.core.outcomes import Outcome
from processor.core.policy import ForceFail, Requeue, after_exhausted_conflicts, retry_wait_ms
from processor.core.records import Inbound
from processor.core.routing import TopicNames, rung_for_delay
from processor.core.stats import Stats
from processor.core.step_task import StepTask
from processor.core.tick import Decision, force_fail, tick
from processor.engine.effects import Effects, RunWork
from processor.io.store import (
    Commit,
    Definitions,
    UnknownWorkflow,
    UnreadableRun,
    commit_batch,
    force_fail_write,
    load_runs,
)
from processor.io.telemetry import end_error, log_ids, now_ns

__all__ = ["Coordinator", "Inbound", "RunWork"]

log = logging.getLogger("ductor.coordinator")


@dataclass
class BatchResult:
    """What the database stage of one batch found and did."""

    tick_started_ns: int
    loaded: dict[str, LoadedRun | UnknownWorkflow | UnreadableRun] = field(default_factory=dict)
    decisions: dict[str, Decision] = field(default_factory=dict)
    committed: set[str] = field(default_factory=set)
    attempted: int = 0
    now_ms: int = 0
    tick_ended_ns: int = 0
    commit_ended_ns: int = 0
    tick_ms: float = 0.0
    commit_ms: float = 0.0
    error: psycopg.Error | None = None


class Coordinator:
    def __init__(
        self,
        *,
        connect: Callable[[], psycopg.Connection[Any]],
        effects: Effects,
        names: TopicNames,
        stats: Stats,
        livelock_requeues: int,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._connect = connect
        self._conn_or_none: psycopg.Connection[Any] | None = None
        self.effects = effects
        self._names = names
        self.stats = stats
        self._livelock_requeues = livelock_requeues
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        self._definitions = Definitions()
        self.pending: dict[str, RunWork] = {}  # runs waiting for a tick (ready or backing off)
        self.db_healthy = True
        self._in_flight: tuple[list[RunWork], Future[BatchResult]] | None = None

    @property
    def _conn(self) -> psycopg.Connection[Any]:
        if self._conn_or_none is None or self._conn_or_none.closed:
            self._conn_or_none = self._connect()
        return self._conn_or_none

    def close(self) -> None:
        # A batch still in flight (a flush that timed out, Postgres hung) is abandoned: its
        # daemon thread does not keep the process alive, and its records are redelivered.
        if self._in_flight is None:
            self.drop_connection()

    def drop_connection(self) -> None:
        """Forget a connection that failed; the next use opens a new one."""
        if self._conn_or_none is not None:
            self._conn_or_none.close()
            self._conn_or_none = None

    # -- intake ------------------------------------------------------------------------------

    def add(self, record: Inbound) -> None:
        """Coalesce an accepted wakeup into its run's pending work."""
        assert record.wakeup is not None
        self.effects.started(record)
        run_id = record.wakeup.run_id
        work = self.pending.get(run_id)
        if work is None:
            work = self.pending[run_id] = RunWork(run_id)
        work.records.append(record)
        if record.wakeup.due_at is not None:
            # Processed minus due: never negative if the delay gate holds (a test checks it).
            self.stats.sample("lateness", self._wall_ms() - record.wakeup.due_at)

    def next_ready_at(self) -> float | None:
        return min((w.ready_at for w in self.pending.values()), default=None)

    def ready_count(self, now: float) -> int:
        return sum(1 for w in self.pending.values() if w.ready_at <= now)

    # -- one batch ---------------------------------------------------------------------------

    def run_batch(self, limit: int) -> int:
        """Advance the batch pipeline: apply the batch whose database stage finished, then
        start the next one. Returns how many runs were started. The database stage (load,
        tick, commit) runs on the `ductor-db` thread, so while Postgres works the poll loop
        keeps consuming, delivering effects and storing offsets; one batch is in flight at a
        time, so a run is never ticked twice at once by the same instance."""
        if self._in_flight is not None:
            if not self._in_flight[1].done():
                return 0
            self._finish_in_flight()
        now = self._monotonic()
        batch = [w for w in self.pending.values() if w.ready_at <= now][:limit]
        if not batch:
            return 0
        for work in batch:
            del self.pending[work.run_id]
            self.effects.start_span(work)
        ids = [w.run_id for w in batch]
        self._in_flight = (batch, self._start_db_stage(ids))
        return len(batch)

    @property
    def busy(self) -> bool:
        return self._in_flight is not None

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for the batch in flight and apply it (before a rebalance or shutdown).

        Returns False if it did not finish in time: its records then stay unstored and are
        redelivered, which is safe (the redelivered tick finds whatever was committed)."""
        if self._in_flight is None:
            return True
        try:
            self._in_flight[1].result(timeout=timeout_s)
        except TimeoutError:
            return False
        self._finish_in_flight()
        return True

    def _finish_in_flight(self) -> None:
        assert self._in_flight is not None
        batch, future = self._in_flight
        self._in_flight = None
        result = future.result()
        if result.error is not None:
            self._db_failed(result.error, [w for w in batch if w.records])
            return
        self.db_healthy = True
        self._apply(batch, result)

    def _start_db_stage(self, run_ids: list[str]) -> Future[BatchResult]:
        """Run the database stage on a daemon thread (one per batch: a hung query must never
        keep the process from exiting within its shutdown bound)."""
        future: Future[BatchResult] = Future()

        def stage() -> None:
            try:
                future.set_result(self._db_stage(run_ids))
            except BaseException as exc:  # a bug: surfaced on the poll-loop thread
                future.set_exception(exc)

        threading.Thread(target=stage, name="ductor-db", daemon=True).start()
        return future

    def _db_stage(self, run_ids: list[str]) -> BatchResult:
        """Load, tick and commit, on the database thread: touches nothing but the connection,
        the definitions cache and its own result."""
        result = BatchResult(tick_started_ns=now_ns())
        started = time.perf_counter()
        try:
            result.loaded = load_runs(self._conn, self._definitions, run_ids)
            result.now_ms = self._wall_ms()
            commits: list[Commit] = []
            for run_id in run_ids:
                run = result.loaded.get(run_id)
                if not isinstance(run, LoadedRun) or not run.checksum_ok:
                    continue
                wf = self._definitions.get(self._conn, run.workflow)
                decision = tick(run.state, wf, run.results, run.signals, result.now_ms)
                result.decisions[run_id] = decision
                if decision.new_state is not None:
                    commits.append(Commit(run_id, run.version, decision.new_state))
            result.tick_ended_ns, result.tick_ms = now_ns(), (time.perf_counter() - started) * 1000
            commit_started = time.perf_counter()
            result.committed = commit_batch(self._conn, commits)
            result.commit_ended_ns = now_ns()
            result.commit_ms = (time.perf_counter() - commit_started) * 1000
            result.attempted = len(commits)
        except psycopg.Error as exc:
            result.error = exc
        return result

    def _apply(self, batch: list[RunWork], result: BatchResult) -> None:
        """Carry out the batch's decisions (on the poll-loop thread)."""
        self.stats.sample("tick", result.tick_ms)
        self.stats.sample("commit", result.commit_ms)
        self.stats.commit_attempts += result.attempted
        for work in batch:
            run = result.loaded.get(work.run_id)
            if isinstance(run, UnreadableRun) or (
                isinstance(run, LoadedRun) and not run.checksum_ok
            ):
                # Changed out of band: report it and keep the wakeup, never overwrite the row.
                self.stats.errors["checksum_mismatch"] += 1
                log.error(
                    "run %s: the row was changed out of band",
                    work.run_id,
                    extra={"run_id": work.run_id, **log_ids(work.span)},
                )
                detail = (
                    str(run)
                    if isinstance(run, UnreadableRun)
                    else "state_checksum does not match the row: changed out of band"
                )
                self.effects.dead_letter(work, "checksum_mismatch", detail)
                continue
            if not isinstance(run, LoadedRun):
                reason = "unknown_workflow" if isinstance(run, UnknownWorkflow) else "unknown_run"
                detail = str(run) if run is not None else f"run {work.run_id!r} does not exist"
                self.effects.dead_letter(work, reason, detail)
                continue
            decision = result.decisions[work.run_id]
            if decision.new_state is None:
                self.stats.ticks[Outcome.NOOP] += 1
                self._trace_attempt(
                    work, run, Outcome.NOOP, result.tick_started_ns, result.tick_ended_ns
                )
                self.effects.complete(work, Outcome.NOOP)
                continue
            won = work.run_id in result.committed
            outcome = Outcome.COMMITTED if won else Outcome.CONFLICT
            commit_span = (result.tick_ended_ns, result.commit_ended_ns)
            self._trace_attempt(
                work, run, outcome, result.tick_started_ns, result.tick_ended_ns, commit_span
            )
            if won:
                self.stats.ticks[Outcome.COMMITTED] += 1
                self._record_end_to_end(work)
                self._emit(work, run, decision, result.now_ms)
            else:
                self._on_conflict(work, run)

    def _trace_attempt(
        self,
        work: RunWork,
        run: LoadedRun,
        outcome: str,
        start_ns: int,
        end_ns: int,
        commit: tuple[int, int] | None = None,
    ) -> None:
        """The attempt's `tick` span, and its `commit` span (the shared batch statement)."""
        if work.span is None:
            return
        attributes: dict[str, str | int] = {
            "ductor.attempt": work.attempts + 1,
            "ductor.expected_version": run.version,
            "ductor.outcome": outcome,
        }
        self.effects.telemetry.attempt_spans(work.span, (start_ns, end_ns), commit, attributes)
        if outcome == Outcome.CONFLICT:
            # An expected outcome of concurrency: an event, never an error status.
            work.span.add_event("conflict", attributes)

    # -- outcomes ----------------------------------------------------------------------------

    def _on_conflict(self, work: RunWork, run: LoadedRun) -> None:
        self.stats.conflicts += 1
        self.stats.ticks[Outcome.CONFLICT] += 1
        self.stats.hot_runs[work.run_id] += 1
        work.attempts += 1
        wait_ms = retry_wait_ms(work.attempts)
        if wait_ms is not None:
            work.ready_at = self._monotonic() + wait_ms / 1000
            self._park(work)
            return
        lineage = work.lineage()
        decision = after_exhausted_conflicts(
            requeue_count=lineage.requeue_count,
            attempt=lineage.attempt,
            observed_seq=lineage.observed_seq,
            current_seq=run.state.seq,
            livelock_requeues=self._livelock_requeues,
        )
        if isinstance(decision, Requeue):
            self._requeue(work, decision)
        else:
            self._force_fail(work, run, decision)

    def _requeue(self, work: RunWork, decision: Requeue) -> None:
        now_ms = self._wall_ms()
        wakeup = Wakeup(
            run_id=work.run_id,
            reason="requeue",
            requeue_count=decision.requeue_count,
            attempt=decision.attempt,
            due_at=now_ms + decision.delay_ms,
            observed_seq=decision.observed_seq,
            produced_at=now_ms,
        )
        self.stats.requeues[decision.delay_ms] += 1
        self.stats.ticks[Outcome.REQUEUED] += 1
        if work.span is not None:
            work.span.set_attribute("ductor.requeue_count", decision.requeue_count)
        work.outcome = Outcome.REQUEUED
        self.effects.send_wakeup(work, self._names.delay(decision.delay_ms), wakeup)
        self.effects.settle(work)

    def _force_fail(self, work: RunWork, run: LoadedRun, decision: ForceFail) -> None:
        try:
            written = self._write_force_fail(run, decision.reason)
        except psycopg.Error as exc:
            self._db_failed(exc, [work])
            return
        if written:
            self.stats.force_fails[decision.reason] += 1
            self.stats.ticks[Outcome.FORCE_FAILED] += 1
            log.warning(
                "run %s force-failed: %s",
                run.run_id,
                decision.reason,
                extra={"run_id": run.run_id, "reason": decision.reason, **log_ids(work.span)},
            )
            if work.span is not None:
                work.span.set_attribute("ductor.reason", decision.reason)
            self.effects.complete(work, Outcome.FORCE_FAILED)
            return
        # The run moved since it was loaded (progress, or it ended): not a livelock. Start the
        # in-process attempts again from fresh state; the next exhaustion sees the new seq.
        work.attempts = 0
        work.ready_at = self._monotonic()
        self._park(work)

    def force_fail_stuck(self, conn: psycopg.Connection[Any], run_id: str) -> bool:
        """The watchdog's use of the shared terminal path: fail a run with no transition.
        (The watchdog passes its own connection: a batch may be using ours.)"""
        loaded = load_runs(conn, self._definitions, [run_id]).get(run_id)
        if not isinstance(loaded, LoadedRun) or not loaded.checksum_ok:
            return False
        return self._write_force_fail(loaded, "stuck", conn)

    def _write_force_fail(
        self, run: LoadedRun, reason: str, conn: psycopg.Connection[Any] | None = None
    ) -> bool:
        """Force-fail ``run`` if it did not move since loaded (the caller meters it; this may
        run on the sweep thread). Raises psycopg.Error."""
        failed = force_fail(run.state, reason)
        if failed is None:
            return False
        return force_fail_write(conn or self._conn, run.run_id, run.stored_checksum, failed)

    def _emit(self, work: RunWork, run: LoadedRun, decision: Decision, now_ms: int) -> None:
        work.outcome = Outcome.COMMITTED
        for dispatch in decision.dispatches:
            task = StepTask(
                run_id=work.run_id,
                node=dispatch.node,
                attempt=dispatch.attempt,
                step_type=dispatch.step_type,
                deadline_ms=dispatch.deadline_ms,
                tier=run.tier,
            )
            attributes = {
                "ductor.node": dispatch.node,
                "ductor.attempt": dispatch.attempt,
            }
            self.effects.send(
                work, self._names.steps, task.encode(), work.run_id.encode(), attributes=attributes
            )
        for due_ms in decision.timers:
            self._send_timer(work, due_ms, now_ms)
        self.effects.settle(work)

    def _send_timer(self, work: RunWork, due_ms: int, now_ms: int, reason: str = "timer") -> None:
        wait = max(0, due_ms - now_ms)
        rung = rung_for_delay(wait)
        hop_due = now_ms + min(wait, rung)
        wakeup = Wakeup(
            run_id=work.run_id,
            reason=reason,
            due_at=hop_due,
            target_at=due_ms if due_ms > hop_due else None,
            produced_at=now_ms,
        )
        self.effects.send_wakeup(work, self._names.delay(rung), wakeup)

    def hop(self, record: Inbound, now_ms: int) -> None:
        """A timer that came due on a rung before its target: send it on for the rest."""
        assert record.wakeup is not None and record.wakeup.target_at is not None
        self.effects.started(record)
        work = RunWork(record.wakeup.run_id, records=[record], outcome="hopped")
        self._send_timer(work, record.wakeup.target_at, now_ms, reason=record.wakeup.reason)
        self.effects.settle(work)

    def _db_failed(self, exc: Exception, works: list[RunWork]) -> None:
        """The database is unreachable: nothing was decided for these runs. End their spans as
        errors, count a genuine error, and retry them in a second (the loop keeps running)."""
        self.stats.errors[type(exc).__name__] += 1
        self.stats.ticks[Outcome.ERROR] += len(works)
        self.db_healthy = False
        log.error("database error, %d run(s) will be retried: %s", len(works), exc)
        self.drop_connection()
        retry_at = self._monotonic() + 1.0
        for work in works:
            end_error(work.span, exc)
            work.span = None
            work.ready_at = retry_at
            self._park(work)

    def _park(self, work: RunWork) -> None:
        """Put work back to wait for its ready time, merging with records that came meanwhile."""
        existing = self.pending.get(work.run_id)
        if existing is not None:
            work.records.extend(existing.records)
            work.ready_at = min(work.ready_at, existing.ready_at)
        self.pending[work.run_id] = work

    def _record_end_to_end(self, work: RunWork) -> None:
        now_ms = self._wall_ms()
        for record in work.records:
            if record.wakeup is not None and record.wakeup.produced_at is not None:
                start = record.wakeup.due_at or record.wakeup.produced_at
                self.stats.sample("end_to_end", max(0, now_ms - start))

    # -- rebalance ---------------------------------------------------------------------------

    def drop_partitions(self, revoked: Iterable[tuple[str, int]]) -> int:
        """Forget pending records of revoked partitions: their next owner redoes them."""
        gone = set(revoked)
        dropped = 0
        for run_id, work in list(self.pending.items()):
            kept = [r for r in work.records if r.tp not in gone]
            dropped += len(work.records) - len(kept)
            if kept:
                work.records = kept
            else:
                del self.pending[run_id]
                if work.span is not None:
                    work.span.end()
        return dropped
