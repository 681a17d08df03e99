"""The one executor: it runs the commit path and carries out the core's plans.

The commit path of a batch, numbered as it happens (a crash between any two steps is safe):

1. Load every run of the batch in one query.
2. Tick each run (pure, core/decide.py ``tick_batch``). A no-op writes nothing.
3. Commit every changed run in one conditional UPDATE, each with its own expected version; a
   run missing from ``RETURNING`` lost a version race. The same statement writes each
   transition's records (step dispatches, retry timers) to the outbox, and deletes the outbox
   rows acknowledged since the previous commit. The core then decides each run's plan
   (``decide``); a livelocked run's force-fail is written here too (the terminal path).
   A crash up to here loses nothing: no offset was stored, the records are redelivered, and
   the redelivered tick finds the commit done (a no-op) or does it.
4. Produce the plan's records: the transition's, or a requeue, or dead letters.
   A crash between 3 and 4 loses nothing either: the transition's records wait in the outbox,
   and any instance's relay sends them after ``DUCTOR_RELAY_AFTER_S`` (the watchdog claims them).
5. Wait for the broker to acknowledge every one of them (delivery reports, on the loop thread).
6. ``finish``: the work is done; its records' offsets may be stored (offsets.py keeps the
   stored offset behind any record still in flight), its outbox row is due for deletion (with
   the next commit), and its span ends with the outcome.

Steps 1 to 3 run on a database thread (the protocol of core/batch.py, driven by
engine/stage.py) so the poll loop keeps consuming, delivering and storing offsets while
Postgres works; one batch is in flight at a time, so an instance never ticks a run twice at
once. Steps 4 to 6 run on the loop thread
(``carry_out``, ``_produce``, ``finish``).
A plan that retries (a conflict's backoff, a database error) parks its work instead: waiting
never blocks, and the loop goes on serving every other run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial

import psycopg
from confluent_kafka import KafkaError
from opentelemetry.trace import Span

from processor.core.backoff import retry_delay_s
from processor.core.batch_values import Decided, ReadBackResult, Undecided
from processor.core.decide import (
    BatchItem,
    Plan,
    Rules,
    Send,
    database_failed,
    dead_letter,
    reject,
)
from processor.core.envelope import Wakeup
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import DeadLetterReason, Outcome
from processor.core.pending import RunBook, RunWork
from processor.core.records import Inbound
from processor.core.routing import partition_for
from processor.core.stats import Stats
from processor.engine.database import Database
from processor.engine.ledger import Ledger
from processor.engine.recent_commits import RECENT_COMMITS_S, RecentCommits
from processor.engine.stage import DatabaseStage, Staged
from processor.engine.stage_thread import InFlight
from processor.io.kafka.clients import Outbox, choose_partition
from processor.io.kafka.delivery import Delivery, Refusal
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.db_errors import TRANSIENT, classify
from processor.io.postgres.kept_signals import KeptDeadLetter, KeptKey
from processor.io.runtime.clock import Clock
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.runtime.outage import Outage
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.logs import describe, first_line
from processor.io.telemetry.setup import Telemetry
from processor.io.telemetry.spans import context_headers

log = logging.getLogger("ductor.executor")

Work = RunWork[Span]


class _Settling:
    """A work whose plan settles once ``outstanding`` records are acknowledged: its bound
    ``delivered`` is what each of them calls back (one object per plan, no closures)."""

    __slots__ = (
        "_park",
        "_settled",
        "held",
        "outboxed_seq",
        "outcome",
        "outstanding",
        "parked",
        "work",
    )

    def __init__(
        self,
        work: Work,
        outcome: Outcome,
        outstanding: int,
        outboxed_seq: int | None,  # its outbox row, deleted once everything is acknowledged
        settled: Callable[[_Settling], None],
        park: Callable[[_Settling], None],
    ) -> None:
        self.work = work
        self.outcome = outcome
        self.outstanding = outstanding
        self.outboxed_seq = outboxed_seq
        self._settled = settled
        self._park = park
        self.held = 0  # records of the work counted as waiting for the broker meanwhile
        self.parked: Refusal | None = None  # why its outbox row is parked

    def delivered(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0:
            self._settled(self)

    def refused(self, why: Refusal) -> None:
        """The broker refuses one of its records for good: its outbox row is parked (kept,
        relayed by no one until unparked), and the record counts as settled."""
        if self.parked is None:
            self.parked = why
            self._park(self)
        self.delivered()


def _ending(span: Span, delivered: Callable[[], None]) -> Callable[[], None]:
    """``delivered``, ending a relayed record's own PRODUCER span first."""

    def end_then_deliver() -> None:
        span.end()
        delivered()

    return end_then_deliver


# Outbox deletions wait for the next commit statement, or go on their own once this many
# have gathered or the oldest has waited this long.
_ACKS_PER_DELETE = 500
_ACKS_WAIT_S = 0.2


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
        faults: Faults = NO_FAULTS,
        postgres: Outage | None = None,
        clock: DatabaseClock | None = None,
        sleep: Callable[[float], object] = time.sleep,
        recent: RecentCommits | None = None,
        threads: ThreadWatch | None = None,
    ) -> None:
        # The batch's ticks judge time by Postgres's clock; the rest by this process's,
        # corrected by its offset from Postgres (io/postgres/db_clock.py).
        process_clock = Clock(monotonic, wall_ms)  # what the database stage is timed by
        clock = clock or DatabaseClock(wall_ms)
        wall_ms = clock.now_ms
        self._stage_runner = DatabaseStage(
            database, rules, clock, faults, recent, threads, process_clock
        )
        self._faults = faults
        self._produce_fault = faults.at(Point.PRODUCE)  # (asked per plan: a bool)
        self._outbox = outbox
        self._partitions = partitions  # filled by the processor once the topics are known
        self._rules = rules
        self._partition_by_run = partition_by_run
        self._tracker = tracker
        self._stats = stats
        self._telemetry = telemetry
        self._ledger = Ledger(stats, telemetry, wall_ms)
        self._wall_ms = wall_ms
        self._monotonic = monotonic
        self._sleep = sleep
        self.book: RunBook[Span] = RunBook()
        self.database_ok = True  # False after a batch failed on a database error
        self._stage: tuple[list[Work], InFlight[Staged]] | None = None
        self._outage = postgres or Outage("postgres", log)  # shared with the watchdog's
        # Outbox rows to delete (a dict: the same row acknowledged twice, by its commit and a
        # relay, is deleted once).
        self._acknowledged: dict[tuple[str, int], None] = {}
        self._acknowledged_since = 0.0
        self._to_park: list[tuple[str, int, str]] = []  # (run id, seq, why)
        self._delivery = Delivery(outbox, stats.errors, monotonic)
        self._unknown_streak = 0  # stages in a row whose commit lost its connection
        # Records whose plans wait for the broker to acknowledge their effects (taken off the
        # book, not done yet): while the broker is away they pile up here.
        self.unacknowledged_records = 0
        self._refused_streak = 0  # stages in a row that failed on a transient fault
        self._next_stage_at = 0.0  # no deletions-only stage before (after a failed stage)

    def use_rules(self, rules: Rules) -> None:
        """Rules learnt once the broker answered (the dead-letter topic's size limit)."""
        self._rules = rules
        self._stage_runner.use_rules(rules)

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
            self._ledger.start_span(work)
        self.carry_out(work, plan)

    # -- the commit path ---------------------------------------------------------------------

    @property
    def waiting_records(self) -> int:
        """Records taken in and not done: waiting for a tick (ready, backing off, retried
        through an outage) or for the broker to acknowledge their effects."""
        return self.book.records + self.unacknowledged_records

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
        now = self._monotonic()
        batch = self.book.take_ready(now, limit)
        # Deletions alone wait for the backoff of a stage the database failed (runs wait in
        # the book for theirs): an outage costs a try per backoff, not one per loop turn.
        acks_due = now >= self._next_stage_at and (
            len(self._acknowledged) >= _ACKS_PER_DELETE
            or (bool(self._acknowledged) and now - self._acknowledged_since >= _ACKS_WAIT_S)
        )
        if not batch and not acks_due:
            return
        for work in batch:
            self._ledger.start_span(work)
        items = [
            BatchItem(w.run_id, w.attempts, tuple(w.records), w.locked, w.prior_version)
            for w in batch
        ]
        self._stage = (batch, self._stage_runner.start(items, self._take_acknowledged()))

    def _take_acknowledged(self) -> list[tuple[str, int]]:
        """At most ``_ACKS_PER_DELETE`` acknowledged rows for the next statement, in key order
        (two statements deleting overlapping rows lock them in the same order); the rest wait
        for the next one."""
        taken = sorted(self._acknowledged)[:_ACKS_PER_DELETE]
        for key in taken:
            del self._acknowledged[key]
        if self._acknowledged:
            self._acknowledged_since = self._monotonic()
        return taken

    def delete_acknowledged(self, timeout_s: float) -> bool:
        """Delete every acknowledged outbox row now (shutdown, partitions released), once the
        batch in flight is carried out; False if that did not finish within ``timeout_s``."""
        deadline = self._monotonic() + timeout_s
        while self.flush(max(0.0, deadline - self._monotonic())):
            if not self._acknowledged:
                return True
            if max(self._monotonic(), self._next_stage_at) >= deadline:
                return False
            self._sleep(max(0.0, self._next_stage_at - self._monotonic()))  # an outage's backoff
            self._stage = ([], self._stage_runner.start([], self._take_acknowledged()))
        return False

    def wait_for_stage(self, timeout_s: float) -> None:
        """Block until the batch in flight finished its database stage, ``timeout_s`` at most."""
        if self._stage is not None:
            self._stage[1].wait(timeout_s)

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait for the batch in flight and carry it out (before a rebalance or shutdown).

        Returns False if it did not finish in time: its records then stay unstored and are
        redelivered, which is safe (the redelivered tick finds whatever was committed)."""
        if self._stage is None:
            return True
        try:
            self._stage[1].result(timeout_s)
        except TimeoutError:
            return False
        self._carry_out_stage()
        return True

    def _carry_out_stage(self) -> None:
        assert self._stage is not None
        batch, future = self._stage
        self._stage = None
        staged = future.result()
        outcome, timings = staged.outcome, staged.timings
        if outcome.replay:
            self.replay_after_restart(list(outcome.replay))
        for run_id, exc in outcome.isolated:
            self._ledger.isolated("tick", run_id, exc)
        if outcome.runs:
            # Counted even when the stage failed later: its statements commit one by one, so
            # a half of a batch split around a poison row committed before the other failed.
            self._stats.runs.add(outcome.runs)
        if outcome.unacknowledged:
            # The deletions did not happen: they go with the next stage.
            self._acknowledge(list(outcome.unacknowledged))
        errors: Mapping[str, Exception]
        if isinstance(outcome, Undecided):
            plans = self._undecided(outcome.error, batch)
            errors, error = {}, outcome.error
        else:
            self._stats.sample("tick", timings.tick_ms)
            self._stats.sample("commit", timings.commit_ms)
            plans = self._decided(outcome)
            errors, error = outcome.force_fail_errors, None
        tick = (timings.started_ns, timings.tick_ended_ns)
        commit = (timings.tick_ended_ns, timings.commit_ended_ns)
        for work, plan in zip(batch, plans, strict=True):
            self._ledger.trace_attempt(work, plan, tick, commit)
            self.carry_out(work, plan, errors.get(work.run_id) or error)

    def _undecided(self, error: Exception, batch: list[Work]) -> list[Plan]:
        """The database failed the batch: every run is tried again after the backoff."""
        retry_ms = self._database_failed(error, len(batch))
        self._next_stage_at = self._monotonic() + retry_ms / 1000
        self._unknown_streak = 0
        return [database_failed(BatchItem(w.run_id, w.attempts, ()), retry_ms) for w in batch]

    def _decided(self, outcome: Decided) -> list[Plan]:
        """The batch's plans, delayed where a force-fail could not be written or a commit
        lost with its connection keeps being lost; what its commits freed is woken."""
        self._stats.commit_attempts += outcome.commit_attempts
        plans = list(outcome.plans)
        if outcome.read_back is not None:
            plans = self._unknown_commit_resolved(outcome.read_back, outcome.commit_attempts, plans)
        else:
            self._unknown_streak = 0
        for run_id, exc in outcome.force_fail_errors.items():
            retry_ms = self._database_failed(exc, 1)
            plans = [replace(p, retry_in_ms=retry_ms) if p.run_id == run_id else p for p in plans]
        if not outcome.force_fail_errors:
            self._database_back()
        self._ledger.quarantined(list(outcome.quarantined), outcome.quarantine_error)
        if outcome.limit_wakes:
            self.rewake(list(outcome.limit_wakes))  # slots freed: their oldest waiters go on
        if outcome.limit_waited or outcome.limit_refused:
            self._stats.limits_used(outcome.limit_refused, outcome.limit_waited)
        return plans

    def carry_out(self, work: Work, plan: Plan, error: BaseException | None = None) -> None:
        """Count and log the plan, then park the work for its retry or carry out steps 4 to 6.
        An exception nobody foresaw while doing so is the work's alone, never the loop's
        (``_carry_out_failed``)."""
        try:
            if self._produce_fault:
                self._faults.hit(Point.PRODUCE, work.run_id)
            self._carry_out(work, plan, error)
        except Exception as exc:
            self._carry_out_failed(work, plan, exc)

    def _carry_out(self, work: Work, plan: Plan, error: BaseException | None = None) -> None:
        self._ledger.record(work, plan)
        if plan.retry_in_ms is not None:
            if plan.outcome is Outcome.ERROR and error is not None:
                self._ledger.end_span_with_error(work, error)
            work.attempts = plan.attempts
            # What the next commit that finds the row held compares with (core/decide.py).
            work.locked = work.locked + 1 if plan.outcome is Outcome.LOCKED else 0
            work.prior_version = plan.expected_version
            self.book.park(work, self._monotonic() + plan.retry_in_ms / 1000)
            return
        settling = _Settling(
            work, plan.outcome, len(plan.sends), plan.outboxed_seq, self._settled, self._park
        )
        for send in plan.sends:
            self._produce(settling, send)  # 4. produce; 5. acknowledged in _produce's callback
        if settling.outstanding == 0:
            self._settled(settling)
        else:  # its records wait for the broker: they count against the intake's bound
            settling.held = len(work.records)
            self.unacknowledged_records += settling.held

    def _carry_out_failed(self, work: Work, plan: Plan, exc: Exception) -> None:
        """Carrying out the work's plan raised what nobody foresaw (its records produced so
        far may land; the plan never settles). Its records go to the dead-letter topic
        instead (``unexpected_error``); should that raise too, the work is left undone: its
        records' offsets stay held, so nothing is skipped (they are redone after a restart
        or a rebalance) and the loop goes on with every other work."""
        self._ledger.isolated("produce", work.run_id, exc)
        if work.records and plan.reason is not DeadLetterReason.UNEXPECTED_ERROR:
            reason = DeadLetterReason.UNEXPECTED_ERROR
            letters = dead_letter(
                work.run_id, tuple(work.records), reason, describe(exc), self._rules
            )
            try:
                self._carry_out(work, letters)
                return
            except Exception as again:
                self._ledger.isolated("produce", work.run_id, again)
        log.error(
            "run %s: its work is left undone, its records' offsets held: they are redone after"
            " a restart or a rebalance",
            work.run_id,
            extra={"run_id": work.run_id, "records": len(work.records)},
        )
        self._ledger.end_span(work)

    def isolated(self, stage: str, item: str, exc: Exception) -> None:
        """An exception nobody foresaw, isolated by the loop to one item: counted, logged."""
        self._ledger.isolated(stage, item, exc)

    def _settled(self, settling: _Settling) -> None:
        self.unacknowledged_records -= settling.held
        settling.held = 0
        if settling.outboxed_seq is not None and settling.parked is None:
            self._acknowledge([(settling.work.run_id, settling.outboxed_seq)])
        if settling.outcome is Outcome.DEAD_LETTERED:
            self._faults.hit(Point.DEAD_LETTERED, settling.work.run_id)
        self.finish(settling.work, settling.outcome)

    def _park(self, settling: _Settling) -> None:
        run_id, seq, refusal = settling.work.run_id, settling.outboxed_seq, settling.parked
        assert seq is not None and refusal is not None
        why = refusal.reason
        self._stats.parked[refusal.error] += 1
        log.error(
            "parked the outbox row of run %s (transition %d): %s; it is kept, and sent again"
            " once unparked (`ductor outbox unpark`)",
            run_id,
            seq,
            why,
            extra={"run_id": run_id, "seq": seq, "reason": why},
        )
        self._to_park.append((run_id, seq, why))

    def take_parked(self) -> list[tuple[str, int, str]]:
        """Outbox rows to mark parked (the watchdog writes them)."""
        parked, self._to_park = self._to_park, []
        return parked

    def _acknowledge(self, rows: list[tuple[str, int]]) -> None:
        """Outbox rows whose records the broker has: deleted by the next database stage."""
        if rows and not self._acknowledged:
            self._acknowledged_since = self._monotonic()
        self._acknowledged.update(dict.fromkeys(rows))

    def finish(self, work: Work, outcome: Outcome) -> None:
        """6. The work is done: its records' offsets may be stored; its span ends."""
        for record in work.records:
            self._tracker.done(record.tp, record.offset)
        work.records = []
        self._ledger.end_span(work, outcome)

    def _produce(self, settling: _Settling, send: Send) -> None:
        work = settling.work
        partition: int | None = None
        if send.by_run is not None:
            count = self._partitions[send.topic]
            partition = choose_partition(send.by_run, count, self._partition_by_run)
        headers = list(send.headers)
        on_delivered = settling.delivered
        if self._telemetry.tracing:
            if work.span is None:  # a relayed record: its own PRODUCER span starts a trace
                span, trace_headers = self._telemetry.start_producer_span(
                    None, send.topic, dict(send.attributes)
                )
                on_delivered = _ending(span, settling.delivered)
            else:
                # The record carries the CONSUMER span's context (its parent downstream); a
                # sampled one notes the send as an event: a tick costs one span, not two.
                if work.span.is_recording():
                    self._telemetry.note_send(work.span, send.topic, send.attributes)
                trace_headers = context_headers(work.span)
            headers = [h for h in headers if h[0] not in ("traceparent", "tracestate")]
            headers += trace_headers
        # An outbox row's record the broker refuses for good is parked (io/kafka/delivery.py).
        refused = settling.refused if settling.outboxed_seq is not None else None
        self._delivery.send(
            send.topic, send.value, send.key, partition, headers, on_delivered, refused
        )

    # -- the watchdog's results --------------------------------------------------------------

    def relay(self, rows: list[tuple[str, int, tuple[Send, ...]]]) -> None:
        """Send again the records of outbox rows left behind (their instance died after its
        commit, or the broker was away); each row is deleted once all its records are in."""
        for run_id, _seq, sends in rows:
            self._ledger.relayed(run_id, len(sends))
        self.send_outboxed(rows)

    def send_outboxed(self, rows: list[tuple[str, int, tuple[Send, ...]]]) -> None:
        """Send the records of outbox rows (run id, seq, records): relayed ones, or those a
        force-fail of the watchdog's wrote; each row is deleted once all its records are in."""
        for run_id, seq, sends in rows:
            settling = _Settling(
                RunWork(run_id), Outcome.COMMITTED, len(sends), seq, self._settled, self._park
            )
            try:
                for send in sends:
                    self._produce(settling, send)
            except Exception as exc:  # the row stays claimed: relayed again once we are gone
                self._ledger.isolated("sweep", run_id, exc)
                continue
            if settling.outstanding == 0:
                self._settled(settling)

    def may_relay(self, quiet_s: float) -> bool:
        """Whether the broker took every record lately: while it does not, records left in
        the outbox are this instance's own, still being retried; relaying would only add."""
        return self._delivery.healthy_for(quiet_s)

    def send_due(self, now: float) -> None:
        """Records whose delivery failed go again once their backoff is over."""
        self._delivery.send_due(now)

    def next_send_at(self) -> float | None:
        return self._delivery.next_due_at()

    def rewake(self, runs: list[tuple[str, str]], reason: str = "sweep") -> None:
        """Wake overdue runs again, each on its own tier (their wakeups were lost, a deadline
        passed, or a recorded result waits for a tick)."""
        now_ms = self._wall_ms()
        for run_id, tier in runs:
            try:
                topic = self._rules.names.wakeup(tier)
                wakeup = Wakeup(run_id=run_id, reason=reason, produced_at=now_ms)
                partition = partition_for(run_id, self._partitions[topic])
                self._outbox.send(
                    topic, wakeup.encode(), wakeup.key(), self._rewake_sent, partition
                )
            except Exception as exc:  # the run stays overdue: the next sweep wakes it again
                self._ledger.isolated("sweep", run_id, exc)

    def replay_after_restart(self, runs: list[tuple[str, str]]) -> None:
        """The database restarted, or another server took its place: the runs this instance
        committed just before are woken again, in case the server lost their commits
        (engine/recent_commits.py)."""
        if not runs:
            return
        self._stats.restart_rewakes += len(runs)
        log.warning(
            "the database restarted (or another server took its place): waking again the %d"
            " run(s) committed in the %.0f s before, whose commits it may have lost",
            len(runs),
            RECENT_COMMITS_S,
            extra={"runs": len(runs)},
        )
        self.rewake(runs, reason="replay")

    def _rewake_sent(self, err: KafkaError | None, _msg: object = None) -> None:
        if err is not None:
            # The run stays overdue, so the next sweep sends it again.
            self._ledger.error("produce", "watchdog wakeup not delivered: %s", err)

    def stuck_failed(self, runs: list[tuple[str, str]]) -> None:
        """Runs the watchdog force-failed as stuck: (run id, workflow)."""
        self._ledger.stuck_failed(runs)

    def dead_letter_kept(
        self, claimed: list[KeptDeadLetter], forget: Callable[[list[KeptKey]], None]
    ) -> None:
        """Dead-letter the kept signals whose run never came (``unknown_run``) or came and
        could not take them (``unknown_signal``, ``run_ended``), with the record as it was
        read and where; each is forgotten once the broker has its dead letter."""
        for signal in claimed:
            run_id = signal.key[0]
            try:
                plan = reject(signal.record, signal.reason, signal.detail, self._rules)
                self._ledger.record(RunWork(run_id, records=[signal.record]), plan)
                for send in plan.sends:
                    headers = list(send.headers)
                    done = partial(forget, [signal.key])
                    self._delivery.send(send.topic, send.value, send.key, None, headers, done)
            except Exception as exc:  # it stays claimed: sent again once we are gone
                self._ledger.isolated("sweep", run_id, exc)

    # -- rebalance and shutdown --------------------------------------------------------------

    def drop_partitions(self, revoked: set[tuple[str, int]]) -> None:
        """Forget waiting records of revoked partitions: their next owner redoes them."""
        for work in self.book.drop_partitions(revoked):
            self._ledger.end_span(work)

    def drop_waiting(self) -> None:
        """Forget every waiting run (shutdown): unstored, so the group redelivers them."""
        for work in self.book.clear():
            self._ledger.end_span(work)

    def _database_failed(self, exc: Exception, runs: int) -> int:
        """The database failed a stage: nothing was decided for these runs. A genuine error,
        counted every time; returns after how many ms to try again (the loop keeps running
        meanwhile). A statement that lost a lock or its time (a deadlock, a lock timeout, the
        statement timeout) is logged each time, and retried after a backoff that grows while
        it recurs; anything else is an outage of the database, logged once while it lasts.
        An exception nobody foresaw that is no run's own (the stage isolates every run's) is
        logged each time and retried after the same growing backoff."""
        self._stats.errors[type(exc).__name__] += 1
        if not isinstance(exc, psycopg.Error):
            self._ledger.isolated("tick", f"a batch of {runs} run(s), retried", exc)
            delay_s = retry_delay_s(self._refused_streak)
            self._refused_streak += 1
            return int(delay_s * 1000)
        fault = classify(exc)
        if fault in TRANSIENT:
            delay_s = retry_delay_s(self._refused_streak)
            self._refused_streak += 1
            log.error(
                "a batch of %d run(s) failed (%s): %s; retried in %.1f s",
                runs,
                fault.value,
                first_line(exc),
                delay_s,
                extra={"fault": fault.value, "runs": runs},
            )
            return int(delay_s * 1000)
        delay_s = self._outage.failed(f"{first_line(exc)} ({runs} run(s) will be retried)")
        self.database_ok = False
        self._stage_runner.close()
        return int(delay_s * 1000)

    def _database_back(self) -> None:
        self._refused_streak = 0
        self.database_ok = True
        self._outage.ok()

    def _unknown_commit_resolved(
        self, read_back: ReadBackResult, attempts: int, plans: list[Plan]
    ) -> list[Plan]:
        """A commit's answer was lost with its connection, and reading the rows back told
        which runs it moved: counted apart (neither a conflict nor a lost transition). The
        runs it did not move are tried again at once the first time; when commits keep
        losing their connection, after the outage's growing backoff."""
        self._unknown_streak += 1
        not_landed = read_back.not_landed
        landed = attempts - len(not_landed)
        self._stats.unknown_commits["landed"] += landed
        self._stats.unknown_commits["not_landed"] += len(not_landed)
        self._stats.errors[type(read_back.error).__name__] += 1
        log.warning(
            "the connection was lost during a commit; read back: %d run(s) landed, %d did not",
            landed,
            len(not_landed),
            extra={"landed": landed, "not_landed": len(not_landed)},
        )
        if self._unknown_streak == 1 or not not_landed:
            return plans
        retry_ms = int(retry_delay_s(self._unknown_streak - 2) * 1000)
        return [replace(p, retry_in_ms=retry_ms) if p.run_id in not_landed else p for p in plans]

    def close(self) -> None:
        # A batch still in flight (a flush that timed out, Postgres hung) is abandoned: its
        # daemon thread does not keep the process alive, and its records are redelivered.
        if self._stage is None:
            self._stage_runner.close()


__all__ = ["Executor"]
