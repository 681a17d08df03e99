"""The one executor: it runs the commit path and carries out the core's plans.

The commit path of a batch, numbered as it happens (a crash between any two steps is safe):

1. Load every run of the batch in one query.
2. Tick each run (pure, core/decide.py ``tick_batch``). A no-op writes nothing.
3. Commit every changed run in one conditional UPDATE, each with its own expected version; a
   run missing from ``RETURNING`` lost a version race. The core then decides each run's plan
   (``decide``); a livelocked run's force-fail is written here too (the terminal path).
   A crash up to here loses nothing: no offset was stored, the records are redelivered, and
   the redelivered tick finds the commit done (a no-op) or does it.
4. Produce the plan's records: step dispatches, retry timers, a requeue, dead letters.
   A crash between 3 and 4 loses effects, never transitions: a dispatched step's deadline and
   a timer are on the row (next_wakeup_at) and the watchdog re-wakes the run when due.
5. Wait for the broker to acknowledge every one of them (delivery reports, on the loop thread).
6. ``finish``: the work is done; its records' offsets may be stored (offsets.py keeps the
   stored offset behind any record still in flight) and its span ends with the outcome.

Steps 1 to 3 run on a database thread (``_database_stage``) so the poll loop keeps consuming,
delivering and storing offsets while Postgres works; one batch is in flight at a time, so an
instance never ticks a run twice at once. Steps 4 to 6 run on the loop thread (``carry_out``).
A plan that retries (a conflict's backoff, a database error) parks its work instead: waiting
never blocks, and the loop goes on serving every other run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field

import psycopg
from confluent_kafka import KafkaError
from opentelemetry.trace import Span

from processor.core.decide import (
    BatchItem,
    Plan,
    Rules,
    Send,
    database_failed,
    decide,
    force_fail_refused,
    tick_batch,
)
from processor.core.envelope import Wakeup
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import DeadLetterReason, ForceFailReason, Outcome
from processor.core.pending import RunBook, RunWork
from processor.core.records import Inbound
from processor.core.stats import Stats
from processor.engine.database import Database
from processor.io.kafka import Outbox, choose_partition
from processor.io.telemetry import Telemetry, end_error, end_ok, log_ids, now_ns

log = logging.getLogger("ductor.executor")

Work = RunWork[Span]


@dataclass
class StageResult:
    """What the database stage of one batch found and decided (steps 1 to 3)."""

    started_ns: int
    plans: list[Plan] = field(default_factory=list)
    error: psycopg.Error | None = None  # the whole batch failed: nothing was decided
    failed: dict[str, psycopg.Error] = field(default_factory=dict)  # a force-fail write failed
    commit_attempts: int = 0
    tick_ended_ns: int = 0
    commit_ended_ns: int = 0
    tick_ms: float = 0.0
    commit_ms: float = 0.0


@dataclass(eq=False)
class _Settling:
    """A work whose plan settles once ``outstanding`` records are acknowledged."""

    work: Work
    outcome: Outcome
    outstanding: int


class Executor:
    def __init__(
        self,
        *,
        database: Database,
        outbox: Outbox,
        partitions: Mapping[str, int],
        rules: Rules,
        partition_by_run: bool,
        tracker: OffsetTracker,
        stats: Stats,
        telemetry: Telemetry,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._db = database
        self._outbox = outbox
        self._partitions = partitions  # filled by the processor once the topics are known
        self._rules = rules
        self._partition_by_run = partition_by_run
        self._tracker = tracker
        self._stats = stats
        self._telemetry = telemetry
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        self.book: RunBook[Span] = RunBook()
        self.database_ok = True  # False after a batch failed on a database error
        self._stage: tuple[list[Work], Future[StageResult]] | None = None

    # -- intake ------------------------------------------------------------------------------

    def add(self, record: Inbound) -> None:
        """An accepted wakeup joins its run's work, waiting for the next batch."""
        self.book.add(record)
        due_at = record.wakeup.due_at if record.wakeup is not None else None
        if due_at is not None:
            # Processed minus due: never negative if the delay gate holds (a test checks it).
            self._stats.sample("lateness", self._wall_ms() - due_at)

    def carry_out_now(self, record: Inbound, plan: Plan, traced: bool = True) -> None:
        """A plan for a record that never reaches a tick (a reject, a hop)."""
        work: Work = RunWork(plan.run_id, records=[record])
        if traced:
            self._start_span(work)
        self.carry_out(work, plan)

    # -- the commit path ---------------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return self._stage is not None

    def advance(self, limit: int) -> None:
        """One turn of the commit path: carry out the batch whose database stage finished
        (steps 4 to 6), then start the next batch of ready runs (steps 1 to 3)."""
        if self._stage is not None:
            if not self._stage[1].done():
                return
            self._carry_out_stage()
        batch = self.book.take_ready(self._monotonic(), limit)
        if not batch:
            return
        for work in batch:
            self._start_span(work)
        items = [BatchItem(w.run_id, w.attempts, tuple(w.records)) for w in batch]
        self._stage = (batch, _on_daemon_thread(lambda: self._database_stage(items)))

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for the batch in flight and carry it out (before a rebalance or shutdown).

        Returns False if it did not finish in time: its records then stay unstored and are
        redelivered, which is safe (the redelivered tick finds whatever was committed)."""
        if self._stage is None:
            return True
        try:
            self._stage[1].result(timeout=timeout_s)
        except TimeoutError:
            return False
        self._carry_out_stage()
        return True

    def _database_stage(self, items: list[BatchItem]) -> StageResult:
        """Steps 1 to 3, on the database thread: touches nothing but its Database and result."""
        result = StageResult(started_ns=now_ns())
        started = time.perf_counter()
        run_ids = [item.run_id for item in items]
        try:
            # 1. Load.
            loaded = self._db.load(run_ids)
            now_ms = self._wall_ms()
            # 2. Tick.
            decisions, commits = tick_batch(loaded, now_ms)
            result.tick_ended_ns, result.tick_ms = now_ns(), (time.perf_counter() - started) * 1000
            # 3. Commit.
            commit_started = time.perf_counter()
            committed = self._db.commit(commits)
            result.commit_ended_ns = now_ns()
            result.commit_ms = (time.perf_counter() - commit_started) * 1000
            result.commit_attempts = len(commits)
        except psycopg.Error as exc:
            result.error = exc
            return result
        for item in items:
            run_id = item.run_id
            plan = decide(
                item, loaded.get(run_id), decisions.get(run_id), run_id in committed, now_ms,
                self._rules,
            )  # fmt: skip
            if plan.force_fail is not None:
                plan = self._write_force_fail(plan, item, result)
            result.plans.append(plan)
        return result

    def _write_force_fail(self, plan: Plan, item: BatchItem, result: StageResult) -> Plan:
        assert plan.force_fail is not None
        try:
            written = self._db.force_fail(plan.force_fail)
        except psycopg.Error as exc:
            self._db.close()
            result.failed[item.run_id] = exc
            return database_failed(item)
        return plan if written else force_fail_refused(plan)

    def _carry_out_stage(self) -> None:
        assert self._stage is not None
        batch, future = self._stage
        self._stage = None
        result = future.result()
        if result.error is not None:
            self._database_failed(result.error, len(batch))
            plans = [database_failed(BatchItem(w.run_id, w.attempts, ())) for w in batch]
        else:
            self.database_ok = not result.failed
            self._stats.sample("tick", result.tick_ms)
            self._stats.sample("commit", result.commit_ms)
            self._stats.commit_attempts += result.commit_attempts
            plans = result.plans
            for exc in result.failed.values():
                self._database_failed(exc, 1)
        for work, plan in zip(batch, plans, strict=True):
            self._trace_attempt(work, plan, result)
            self.carry_out(work, plan, result.failed.get(work.run_id) or result.error)

    def carry_out(self, work: Work, plan: Plan, error: BaseException | None = None) -> None:
        """Count and log the plan, then park the work for its retry or carry out steps 4 to 6."""
        self._count(work, plan)
        if plan.retry_in_ms is not None:
            if plan.outcome is Outcome.ERROR and error is not None:
                end_error(work.span, error)  # the retry gets a span of its own
                work.span = None
            work.attempts = plan.attempts
            self.book.park(work, self._monotonic() + plan.retry_in_ms / 1000)
            return
        settling = _Settling(work, plan.outcome, outstanding=len(plan.sends))
        for send in plan.sends:
            self._produce(settling, send)  # 4. produce; 5. acknowledged in _produce's callback
        if settling.outstanding == 0:
            self.finish(work, plan.outcome)

    def finish(self, work: Work, outcome: Outcome) -> None:
        """6. The work is done: its records' offsets may be stored; its span ends."""
        for record in work.records:
            self._tracker.done(record.tp, record.offset)
        work.records = []
        end_ok(work.span, outcome, attempts=work.attempts)
        work.span = None

    def _produce(self, settling: _Settling, send: Send) -> None:
        work = settling.work
        partition: int | None = None
        if send.by_run is not None:
            count = self._partitions[send.topic]
            partition = choose_partition(send.by_run, count, self._partition_by_run)
        headers = list(send.headers)
        span: Span | None = None
        if self._telemetry.tracing:
            span, trace_headers = self._telemetry.start_producer_span(
                work.span, send.topic, dict(send.attributes)
            )
            headers = [h for h in headers if h[0] not in ("traceparent", "tracestate")]
            headers += trace_headers

        def delivered(err: KafkaError | None) -> None:
            if err is not None:
                # The idempotent producer already retried for message.timeout.ms: the broker
                # is away. Keep trying; the records' offsets stay unstored meanwhile.
                self._stats.errors["produce"] += 1
                log.error("effect not delivered to %s, retrying: %s", send.topic, err)
                self._outbox.send(send.topic, send.value, send.key, delivered, partition, headers)
                return
            if span is not None:
                span.end()
            settling.outstanding -= 1
            if settling.outstanding == 0:
                self.finish(work, settling.outcome)

        self._outbox.send(send.topic, send.value, send.key, delivered, partition, headers)

    # -- counting and tracing: every plan passes here once -----------------------------------

    def _count(self, work: Work, plan: Plan) -> None:
        stats = self._stats
        if plan.attempt is not None:
            stats.ticks[plan.attempt] += 1
        if plan.outcome is not plan.attempt:
            stats.ticks[plan.outcome] += 1
        if plan.attempt is Outcome.CONFLICT:
            stats.conflicts += 1
            stats.hot_runs[work.run_id] += 1
        elif plan.attempt is Outcome.COMMITTED:
            self._sample_end_to_end(work)
        if plan.outcome is Outcome.REQUEUED:
            assert plan.rung_ms is not None and plan.requeue_count is not None
            stats.requeues[plan.rung_ms] += 1
            if work.span is not None:
                work.span.set_attribute("ductor.requeue_count", plan.requeue_count)
        elif plan.outcome is Outcome.FORCE_FAILED:
            reason = plan.reason
            assert isinstance(reason, ForceFailReason)
            stats.force_fails[reason] += 1
            log.warning(
                "run %s force-failed: %s",
                work.run_id,
                reason,
                extra={"run_id": work.run_id, "reason": reason.value, **log_ids(work.span)},
            )
            if work.span is not None:
                work.span.set_attribute("ductor.reason", reason.value)
        elif plan.outcome is Outcome.DEAD_LETTERED:
            assert isinstance(plan.reason, DeadLetterReason)
            self._count_dead_letters(work, plan.reason, plan.detail)

    def _count_dead_letters(self, work: Work, reason: DeadLetterReason, detail: str) -> None:
        if reason is DeadLetterReason.CHECKSUM_MISMATCH:
            # Changed out of band: a genuine error as well as a dead letter (never overwritten).
            self._stats.errors["checksum_mismatch"] += 1
            log.error(
                "run %s: the row was changed out of band",
                work.run_id,
                extra={"run_id": work.run_id, **log_ids(work.span)},
            )
        for record in work.records:
            self._stats.dead_letters[reason] += 1
            log.warning(
                "dead-lettered a record",
                extra={
                    "reason": reason.value,
                    "detail": detail,
                    "topic": record.tp[0],
                    "offset": record.offset,
                    **log_ids(work.span),
                },
            )

    def _database_failed(self, exc: psycopg.Error, runs: int) -> None:
        """The database is unreachable: nothing was decided for these runs. A genuine error,
        counted once; the runs are retried after a while (the loop keeps running)."""
        self._stats.errors[type(exc).__name__] += 1
        self.database_ok = False
        log.error("database error, %d run(s) will be retried: %s", runs, exc)
        self._db.close()

    def _start_span(self, work: Work) -> None:
        """Open the work's CONSUMER span (when tracing) from its records' producer contexts."""
        if work.span is not None or not self._telemetry.tracing or not work.records:
            return
        records = [(r.tp[0], r.tp[1], r.offset, r.key, r.headers) for r in work.records]
        work.span = self._telemetry.start_consumer_span(work.records[0].tp[0], records, work.run_id)

    def _trace_attempt(self, work: Work, plan: Plan, result: StageResult) -> None:
        """The attempt's `tick` span, and its `commit` span (the shared batch statement)."""
        if work.span is None or plan.attempt is None:
            return
        attributes: dict[str, str | int] = {
            "ductor.attempt": work.attempts + 1,
            "ductor.expected_version": plan.expected_version or 0,
            "ductor.outcome": plan.attempt,
        }
        commit = None
        if plan.attempt is not Outcome.NOOP:
            commit = (result.tick_ended_ns, result.commit_ended_ns)
        tick = (result.started_ns, result.tick_ended_ns)
        self._telemetry.attempt_spans(work.span, tick, commit, attributes)
        if plan.attempt is Outcome.CONFLICT:
            # An expected outcome of concurrency: an event, never an error status.
            work.span.add_event("conflict", attributes)

    def _sample_end_to_end(self, work: Work) -> None:
        now_ms = self._wall_ms()
        for record in work.records:
            if record.wakeup is not None and record.wakeup.produced_at is not None:
                start = record.wakeup.due_at or record.wakeup.produced_at
                self._stats.sample("end_to_end", max(0, now_ms - start))

    # -- the watchdog's results --------------------------------------------------------------

    def rewake(self, run_ids: list[str], topic: str) -> None:
        """Wake overdue runs again (their wakeups were lost, or a deadline passed)."""
        now_ms = self._wall_ms()
        for run_id in run_ids:
            wakeup = Wakeup(run_id=run_id, reason="sweep", produced_at=now_ms)
            partition = choose_partition(run_id, self._partitions[topic], by_run=True)
            self._outbox.send(topic, wakeup.encode(), wakeup.key(), self._rewake_sent, partition)

    def _rewake_sent(self, err: KafkaError | None) -> None:
        if err is not None:
            # The run stays overdue, so the next sweep sends it again.
            self._stats.errors["produce"] += 1
            log.error("watchdog wakeup not delivered: %s", err)

    def stuck_failed(self, run_ids: list[str]) -> None:
        """Runs the watchdog force-failed as stuck (counted like the livelock guard's)."""
        for run_id in run_ids:
            self._stats.force_fails[ForceFailReason.STUCK] += 1
            self._stats.ticks[Outcome.FORCE_FAILED] += 1
            log.warning(
                "run %s force-failed: stuck", run_id, extra={"run_id": run_id, "reason": "stuck"}
            )

    # -- rebalance and shutdown --------------------------------------------------------------

    def drop_partitions(self, revoked: set[tuple[str, int]]) -> None:
        """Forget waiting records of revoked partitions: their next owner redoes them."""
        for work in self.book.drop_partitions(revoked):
            if work.span is not None:
                work.span.end()

    def drop_waiting(self) -> None:
        """Forget every waiting run (shutdown): unstored, so the group redelivers them."""
        for work in self.book.clear():
            if work.span is not None:
                work.span.end()

    def close(self) -> None:
        # A batch still in flight (a flush that timed out, Postgres hung) is abandoned: its
        # daemon thread does not keep the process alive, and its records are redelivered.
        if self._stage is None:
            self._db.close()


def _on_daemon_thread(stage: Callable[[], StageResult]) -> Future[StageResult]:
    """Run the database stage on a daemon thread (one per batch: a hung query must never
    keep the process from exiting within its shutdown bound)."""
    future: Future[StageResult] = Future()

    def run() -> None:
        try:
            future.set_result(stage())
        except BaseException as exc:  # a bug: surfaced on the poll-loop thread
            future.set_exception(exc)

    threading.Thread(target=run, name="ductor-db", daemon=True).start()
    return future


__all__ = ["Executor", "StageResult"]
