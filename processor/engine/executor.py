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
(``carry_out``; engine/settling.py produces and settles; ``finish``).
A plan that retries (a conflict's backoff, a database error) parks its work instead: waiting
never blocks, and the loop goes on serving every other run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from opentelemetry.trace import Span

from processor.core.batch_values import Decided, Undecided
from processor.core.decide import database_failed, dead_letter, retry_after
from processor.core.outcomes import DeadLetterReason, Outcome
from processor.core.pending import RunBook, RunWork
from processor.core.plans import (
    BatchItem,
    DeadLettered,
    ForceFailed,
    Plan,
    Produce,
    Requeue,
    Rules,
    TryAgain,
)
from processor.core.records import Inbound
from processor.core.shapes import TopicPartition
from processor.core.stats import Stats
from processor.engine.acknowledged import Acknowledged
from processor.engine.ledger import Ledger
from processor.engine.rewake import Rewake
from processor.engine.settling import Settler
from processor.engine.stage import DatabaseStage, Staged
from processor.engine.stage_failures import StageFailures
from processor.engine.stage_thread import InFlight
from processor.io.runtime.clock import SYSTEM_CLOCK, Clock
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.telemetry.logs import describe

log = logging.getLogger("ductor.executor")

Work = RunWork[Span]


class Executor:
    """Its book (the runs waiting for a batch: ready, or backing off) is its own: the loop
    asks it only how many are ready, when the next will be, and how many records wait."""

    def __init__(
        self,
        *,
        stage: DatabaseStage,
        settler: Settler,
        acknowledged: Acknowledged,
        ledger: Ledger,
        rewake: Rewake,
        failures: StageFailures,
        rules: Rules,
        stats: Stats,
        book: RunBook[Span] | None = None,
        clock: Clock = SYSTEM_CLOCK,
        wall_ms: Callable[[], int] | None = None,  # Postgres's clock (io/postgres/db_clock.py)
        faults: Faults = NO_FAULTS,
        sleep: Callable[[float], object] = time.sleep,
    ) -> None:
        self._stage_runner = stage
        self._settler = settler
        self._ledger = ledger
        self._rewake = rewake
        self._failures = failures
        self._rules = rules
        self._stats = stats
        self._book: RunBook[Span] = RunBook() if book is None else book
        self._monotonic = clock.monotonic
        self._wall_ms = wall_ms or clock.wall_ms
        self._faults = faults
        self._produce_fault = faults.at(Point.PRODUCE)  # (asked per plan: a bool)
        self._sleep = sleep
        self._stage: tuple[list[Work], InFlight[Staged]] | None = None
        self._acknowledged = acknowledged  # outbox rows to delete
        self._next_stage_at = 0.0  # no deletions-only stage before (after a failed stage)

    def use_rules(self, rules: Rules) -> None:
        """Rules learnt once the broker answered (the dead-letter topic's size limit)."""
        self._rules = rules
        self._stage_runner.use_rules(rules)

    # -- what the loop asks ------------------------------------------------------------------

    def ready_count(self, now: float) -> int:
        """Runs whose work may go in the next batch."""
        return self._book.ready_count(now)

    def next_ready_at(self) -> float | None:
        """When the next run backing off is ready again (None: none waits)."""
        return self._book.next_ready_at()

    @property
    def waiting_for_tick(self) -> int:
        """Records waiting for a tick: ready, backing off, retried through an outage."""
        return self._book.records

    @property
    def waiting_records(self) -> int:
        """Records taken in and not done: waiting for a tick (ready, backing off, retried
        through an outage) or for the broker to acknowledge their effects."""
        return self._book.records + self._settler.unacknowledged_records

    @property
    def busy(self) -> bool:
        return self._stage is not None

    @property
    def database_ok(self) -> bool:
        return self._failures.database_ok

    # -- intake ------------------------------------------------------------------------------

    def add(self, record: Inbound) -> None:
        """An accepted wakeup joins its run's work, waiting for the next batch."""
        self._book.add(record)
        wakeup = record.wakeup
        if wakeup is None:
            return
        if wakeup.due_at is not None:
            # Processed minus due: never negative if the delay gate holds (a test checks it).
            self._stats.sample("lateness", self._wall_ms() - wakeup.due_at)
        elif wakeup.produced_at is not None:
            self._stats.sample("arrival", max(0, self._wall_ms() - wakeup.produced_at))

    def carry_out_now(self, record: Inbound, plan: Plan, traced: bool = True) -> None:
        """A plan for a record that never reaches a tick (a reject, a hop)."""
        work: Work = RunWork(plan.run_id, records=[record])
        if traced:
            self._ledger.start_span(work)
        self.carry_out(work, plan)

    # -- the commit path ---------------------------------------------------------------------

    def advance(self, limit: int) -> None:
        """One turn of the commit path: carry out the batch whose database stage finished
        (steps 4 to 6), then start the next batch of ready runs (steps 1 to 3)."""
        if self._stage is not None:
            if not self._stage[1].done():
                return
            self._carry_out_stage()
        now = self._monotonic()
        batch = self._book.take_ready(now, limit)
        # Deletions alone wait for the backoff of a stage the database failed (runs wait in
        # the book for theirs): an outage costs a try per backoff, not one per loop turn.
        acks_due = now >= self._next_stage_at and self._acknowledged.due(now)
        if not batch and not acks_due:
            return
        for work in batch:
            self._ledger.start_span(work)
        items = [
            BatchItem(w.run_id, w.tries, tuple(w.records), w.locked, w.prior_version) for w in batch
        ]
        self._stage = (batch, self._stage_runner.start(items, self._acknowledged.take()))

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
            self._stage = ([], self._stage_runner.start([], self._acknowledged.take()))
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
            self._rewake.replay_after_restart(list(outcome.replay))
        for run_id, exc in outcome.isolated:
            self._ledger.isolated("tick", run_id, exc)
        if outcome.runs:
            # Counted even when the stage failed later: its statements commit one by one, so
            # a half of a batch split around a poison row committed before the other failed.
            self._stats.runs.add(outcome.runs)
        if outcome.unacknowledged:
            # The deletions did not happen: they go with the next stage.
            self._acknowledged.add(list(outcome.unacknowledged))
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
            self._ledger.trace_try(work, plan, tick, commit)
            self.carry_out(work, plan, errors.get(work.run_id) or error)

    def _undecided(self, error: Exception, batch: list[Work]) -> list[Plan]:
        """The database failed the batch: every run is tried again after the backoff."""
        retry_ms = self._failures.failed(error, len(batch))
        self._next_stage_at = self._monotonic() + retry_ms / 1000
        self._failures.undecided()
        return [database_failed(BatchItem(w.run_id, w.tries, ()), retry_ms) for w in batch]

    def _decided(self, outcome: Decided) -> list[Plan]:
        """The batch's plans, delayed where a force-fail could not be written or a commit
        lost with its connection keeps being lost; what its commits freed is woken."""
        self._stats.commits_sent += outcome.commits_sent
        plans = list(outcome.plans)
        self._failures.commit_answered(outcome.read_back, outcome.commits_sent)
        if outcome.read_back is not None:
            plans = self._failures.not_landed(outcome.read_back, plans)
        for run_id, exc in outcome.force_fail_errors.items():
            retry_ms = self._failures.failed(exc, 1)
            plans = [retry_after(p, retry_ms) if p.run_id == run_id else p for p in plans]
        if not outcome.force_fail_errors:
            self._failures.back()
        self._ledger.quarantined(list(outcome.quarantined), outcome.quarantine_error)
        if outcome.limit_wakes:
            self._rewake.rewake(list(outcome.limit_wakes))  # slots freed: their waiters go on
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
        payload = plan.payload
        if isinstance(payload, TryAgain):
            self._retry(work, plan, payload, error)
            return
        if isinstance(payload, Produce):
            sends, seq = payload.sends, payload.outboxed_seq
        elif isinstance(payload, DeadLettered):
            sends, seq = payload.sends, None
        elif isinstance(payload, Requeue):
            sends, seq = (payload.send,), None
        else:
            assert isinstance(payload, ForceFailed)
            sends, seq = payload.write.effects, payload.outboxed_seq
        self._settler.carry_out(work, plan.outcome, sends, seq)

    def _retry(self, work: Work, plan: Plan, retry: TryAgain, error: BaseException | None) -> None:
        """The work waits in the book for another try."""
        if plan.outcome is Outcome.ERROR and error is not None:
            self._ledger.end_span_with_error(work, error)
        work.tries = retry.tries
        # What the next commit that finds the row held compares with (core/decide.py).
        work.locked = work.locked + 1 if plan.outcome is Outcome.LOCKED else 0
        work.prior_version = plan.expected_version
        self._book.park(work, self._monotonic() + retry.retry_in_ms / 1000)

    def _carry_out_failed(self, work: Work, plan: Plan, exc: Exception) -> None:
        """Carrying out the work's plan raised what nobody foresaw (its records produced so
        far may land; the plan never settles). Its records go to the dead-letter topic
        instead (``unexpected_error``); should that raise too, the work is left undone: its
        records' offsets stay held, so nothing is skipped (they are redone after a restart
        or a rebalance) and the loop goes on with every other work."""
        self._ledger.isolated("produce", work.run_id, exc)
        reason = DeadLetterReason.UNEXPECTED_ERROR
        payload = plan.payload
        already = isinstance(payload, DeadLettered) and payload.reason is reason
        if work.records and not already:
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

    # -- rebalance and shutdown --------------------------------------------------------------

    def drop_partitions(self, revoked: set[TopicPartition]) -> None:
        """Forget waiting records of revoked partitions: their next owner redoes them."""
        for work in self._book.drop_partitions(revoked):
            self._ledger.end_span(work)

    def drop_waiting(self) -> None:
        """Forget every waiting run (shutdown): unstored, so the group redelivers them."""
        for work in self._book.clear():
            self._ledger.end_span(work)

    def close(self) -> None:
        # A batch still in flight (a flush that timed out, Postgres hung) is abandoned: its
        # daemon thread does not keep the process alive, and its records are redelivered.
        if self._stage is None:
            self._stage_runner.close()


__all__ = ["Executor", "Work"]
