"""The executor carrying out plans, with its real producer client and no broker behind it:
records produced wait in the client's queue (unacknowledged), which is exactly what the
executor must cope with. Nothing here talks to a database (no batch is started)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from confluent_kafka import Producer
from opentelemetry.trace import Span

from processor.core.batch_values import ReadBackResult, Undecided
from processor.core.decide import database_failed, decide, reject, tick_batch
from processor.core.envelope import Wakeup
from processor.core.intake import Reject, admit
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import DeadLetterReason, ForceFailReason, Outcome
from processor.core.pending import RunBook, RunWork
from processor.core.plans import BatchItem, Rules, TryAgain, payload_of
from processor.core.policy import IN_PROCESS_BACKOFF_MS, MAX_IN_PROCESS_TRIES
from processor.core.routing import DELAY_RUNGS_MS
from processor.core.run_state import RunStatus
from processor.core.run_tally import RunTally
from processor.core.stats import Stats
from processor.engine.acknowledged import ACKS_WAIT_S, Acknowledged
from processor.engine.assembly import Commons, build_executor, commons
from processor.engine.database import Database
from processor.engine.executor import Executor, Work
from processor.engine.stage import Staged, Timings
from processor.engine.stage_failures import StageFailures
from processor.engine.stage_thread import InFlight
from processor.io.kafka.clients import Publisher
from processor.io.runtime.clock import Clock, ManualClock
from processor.io.runtime.faults import NO_FAULTS, Faults
from processor.io.telemetry.setup import Telemetry

from .fakes import MAX_BYTES, NAMES, NOW_MS, FakeMessage, accepted, item, loaded, wakeup_message

RULES = Rules(NAMES, livelock_requeues=3)
TP = (NAMES.wakeup("t1"), 0)


@pytest.fixture
def producer() -> Iterator[Producer]:
    client = Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    yield client
    client.purge()
    client.flush(0)


@dataclass
class Harness:
    executor: Executor
    book: RunBook[Span]  # the executor's, looked into by the test that built it
    shared: Commons
    clock: ManualClock
    _failures: StageFailures | None = None

    @property
    def tracker(self) -> OffsetTracker:
        return self.shared.tracker

    @property
    def stats(self) -> Stats:
        return self.shared.stats

    @property
    def publisher(self) -> Publisher:
        return self.shared.publisher

    def now(self) -> float:
        return self.clock.clock.monotonic()

    @property
    def failures(self) -> StageFailures:
        """A stage-failure policy of its own, on the harness's counters (built alone)."""
        if self._failures is None:
            self._failures = StageFailures(
                self.stats, self.shared.ledger, self.shared.postgres, lambda: None
            )
        return self._failures


def _harness(producer: Producer, faults: Faults = NO_FAULTS) -> Harness:
    clock = ManualClock(monotonic_s=100.0)
    wall = Clock(clock.clock.monotonic, lambda: NOW_MS)
    partitions = dict.fromkeys([*NAMES.coordinator_topics(), NAMES.steps, NAMES.dlq], 3)
    shared = commons(
        Publisher(producer), partitions, NAMES, Stats(), Telemetry(), wall, faults=faults
    )
    book: RunBook[Span] = RunBook()
    database = Database("postgresql://nobody@127.0.0.1:1/none")  # never opened here
    return Harness(build_executor(shared, database, RULES, book), book, shared, clock)


@pytest.fixture
def h(producer: Producer) -> Harness:
    return _harness(producer)


def _work(h: Harness, offset: int) -> Work:
    """A run's work holding one start wakeup, taken at intake as the processor does."""
    record = accepted(wakeup_message(offset, Wakeup("r", "start", produced_at=NOW_MS - 5)))
    h.tracker.started(record.tp, record.offset)
    return RunWork("r", records=[record])


def test_a_noop_settles_at_once_and_frees_the_offset(h: Harness) -> None:
    work = _work(h, 4)
    run = loaded("r", tick_batch({"r": loaded("r")}, NOW_MS, NAMES)["r"].state)  # started
    plan = decide(item("r", work.records), run, None, False, NOW_MS, RULES)
    h.executor.carry_out(work, plan)
    assert plan.outcome is Outcome.NOOP
    assert h.tracker.committable() == {TP: 5} and not work.records
    assert h.stats.ticks == {Outcome.NOOP: 1}


def test_a_conflict_is_parked_for_its_backoff_and_never_counted_as_an_error(h: Harness) -> None:
    work = _work(h, 4)
    run = loaded("r")
    commits = tick_batch({"r": run}, NOW_MS, NAMES)
    plan = decide(item("r", work.records), run, commits["r"], False, NOW_MS, RULES)
    h.executor.carry_out(work, plan)
    assert h.executor.ready_count(h.now()) == 0
    assert h.executor.next_ready_at() == h.now() + IN_PROCESS_BACKOFF_MS[1] / 1000
    assert (h.stats.conflicts, h.stats.error_count, h.stats.ticks[Outcome.CONFLICT]) == (1, 0, 1)
    assert h.tracker.committable() == {}  # the record waits: its offset is held
    h.clock.advance(1)
    assert h.executor.ready_count(h.now()) == 1
    (again,) = h.book.take_ready(h.now(), 10)
    assert again is work and again.tries == 1


def test_a_requeue_settles_only_once_the_broker_acknowledged_it(h: Harness) -> None:
    work = _work(h, 4)
    run = loaded("r")
    commits = tick_batch({"r": run}, NOW_MS, NAMES)
    exhausted = item("r", work.records, tries=MAX_IN_PROCESS_TRIES - 1)
    plan = decide(exhausted, run, commits["r"], False, NOW_MS, RULES)
    h.executor.carry_out(work, plan)
    assert (
        plan.outcome is Outcome.REQUEUED and h.publisher.in_flight >= 1
    )  # (the count includes client events)
    assert h.stats.ticks == {Outcome.CONFLICT: 1, Outcome.REQUEUED: 1}
    assert h.stats.requeues == {DELAY_RUNGS_MS[0]: 1} and h.stats.error_count == 0
    assert h.tracker.committable() == {}  # not acknowledged (there is no broker): held


def test_a_database_error_is_an_error_and_the_run_retries_later(h: Harness) -> None:
    work = _work(h, 4)
    plan = database_failed(item("r", work.records), 1000)
    h.executor.carry_out(work, plan, psycopg.OperationalError("the server went away"))
    assert h.stats.ticks == {Outcome.ERROR: 1} and h.stats.conflicts == 0
    assert h.executor.ready_count(h.now() + 0.5) == 0
    assert h.book.take_ready(h.now() + 1.0, 10) == [work]


def test_a_rejected_record_is_dead_lettered_and_counted_by_reason(h: Harness) -> None:
    verdict = admit(FakeMessage(TP[0], 9, b"nope"), NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Reject)
    h.tracker.started(verdict.record.tp, verdict.record.offset)
    plan = reject(verdict.record, verdict.reason, verdict.detail, RULES)
    h.executor.carry_out_now(verdict.record, plan)
    assert h.stats.dead_letters == {DeadLetterReason.NOT_JSON: 1}
    assert (
        h.stats.ticks == {Outcome.DEAD_LETTERED: 1} and h.publisher.in_flight >= 1
    )  # (the count includes client events)
    assert h.tracker.committable() == {}


def test_runs_the_watchdog_failed_are_counted_as_stuck_and_as_ended_failed(h: Harness) -> None:
    h.shared.ledger.stuck_failed([("a", "orders"), ("b", "orders"), ("c", "reports")])
    assert h.stats.force_fails == {ForceFailReason.STUCK: 3}
    assert h.stats.ticks == {Outcome.FORCE_FAILED: 3}
    assert h.stats.runs.ended == {("orders", RunStatus.FAILED): 2, ("reports", RunStatus.FAILED): 1}
    assert h.stats.runs.started == {}


def test_runs_a_stage_moved_before_it_failed_are_counted(h: Harness) -> None:
    """A batch split around a poison row commits half by half: a half that committed before
    the other failed moved its runs for good, and the retry finds them moved (no-ops)."""
    moved = RunTally()
    moved.committed("orders", RunStatus.PENDING, RunStatus.RUNNING)
    moved.committed("orders", RunStatus.RUNNING, RunStatus.SUCCEEDED)
    failed = psycopg.OperationalError("server closed the connection unexpectedly")
    stage = InFlight(lambda: Staged(Undecided(failed, (), (), moved, ()), Timings(0)))
    stage.run()
    h.executor._stage = ([], stage)
    assert h.executor.flush(0)
    assert h.stats.runs.started == {"orders": 1}
    assert h.stats.runs.ended == {("orders", RunStatus.SUCCEEDED): 1}


def test_acknowledged_outbox_rows_are_deleted_once_each_in_key_order_and_bounded(
    h: Harness,
) -> None:
    """After an outage both a commit and a relay may acknowledge the same row, and thousands
    may gather: each row is deleted once, at most 500 per statement, locked in key order."""
    rows = [(f"run-{i:05d}", 1) for i in range(1200)]
    acknowledged = Acknowledged(h.clock.clock.monotonic)
    acknowledged.add(list(reversed(rows)))
    acknowledged.add(rows[:300])  # acknowledged again (a relay's copy)
    assert acknowledged.due(h.now())  # (500 or more: they go on their own at once)
    first = acknowledged.take()
    assert first == rows[:500]
    second, third = acknowledged.take(), acknowledged.take()
    assert second == rows[500:1000] and third == rows[1000:]
    assert acknowledged.take() == [] and not acknowledged.due(h.now() + 1)


def test_a_few_acknowledged_rows_go_on_their_own_once_the_oldest_waited() -> None:
    """Without a commit to ride with, a few rows wait ACKS_WAIT_S for company, no longer."""
    clock = ManualClock()
    acknowledged = Acknowledged(clock.clock.monotonic)
    acknowledged.add([("r", 1)])
    clock.advance(ACKS_WAIT_S / 2)
    acknowledged.add([("s", 1)])
    assert not acknowledged.due(clock.clock.monotonic())
    clock.advance(ACKS_WAIT_S / 2)
    assert acknowledged.due(clock.clock.monotonic())


def test_a_run_whose_row_is_held_waits_apart_with_a_growing_backoff_never_a_conflict(
    h: Harness,
) -> None:
    """The commit skipped the row (another transaction held it): the run is retried after
    10 ms, then 20 ms while its version stays put, its conflict attempts untouched; neither a
    conflict nor an error. Once the version moves while it is held, it is a lost race."""
    work = _work(h, 4)
    run = loaded("r", version=7)
    commits = tick_batch({"r": run}, NOW_MS, NAMES)
    plan = decide(item("r", work.records), run, commits["r"], False, NOW_MS, RULES, held=True)
    h.executor.carry_out(work, plan)
    assert (plan.outcome, payload_of(plan, TryAgain).retry_in_ms) == (Outcome.LOCKED, 10)
    assert (h.stats.conflicts, h.stats.error_count, h.stats.ticks[Outcome.LOCKED]) == (0, 0, 1)
    assert (work.locked, work.prior_version, work.tries) == (1, 7, 0)
    again = BatchItem("r", work.tries, tuple(work.records), work.locked, work.prior_version)
    second = decide(again, run, commits["r"], False, NOW_MS, RULES, held=True)
    assert (second.outcome, payload_of(second, TryAgain).retry_in_ms) == (Outcome.LOCKED, 20)
    moved = decide(again, loaded("r", version=8), commits["r"], False, NOW_MS, RULES, held=True)
    assert moved.outcome is Outcome.CONFLICT and payload_of(moved, TryAgain).tries == 1
    assert h.tracker.committable() == {}  # the record waits: its offset is held


def test_commits_that_keep_losing_their_connection_back_off(h: Harness) -> None:
    """The first commit whose answer was lost is retried at once; while the next ones lose
    theirs too, the runs they did not move wait longer each time."""
    lost = psycopg.OperationalError("server closed the connection unexpectedly")
    waits = []
    for _ in range(4):
        read_back = ReadBackResult(lost, frozenset({"r"}))
        plans = [database_failed(item("r", []), 0)]
        h.failures.commit_answered(read_back, 1)
        waits.append(payload_of(h.failures.not_landed(read_back, plans)[0], TryAgain).retry_in_ms)
    assert waits == [0, 100, 200, 400]
    assert h.stats.unknown_commits == {"landed": 0, "not_landed": 4}


def test_a_deadlock_is_an_error_counted_and_logged_never_a_conflict(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Postgres aborted the batch's statement to break a lock cycle: nothing was written. An
    error (counted by type, logged each time), retried after a backoff that grows while it
    recurs, and not a database outage; never "every run conflicted"."""
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected")
    waits = [h.failures.failed(deadlock, 3) for _ in range(3)]
    assert waits == [100, 200, 400]
    assert h.stats.errors == {"DeadlockDetected": 3} and h.stats.conflicts == 0
    assert h.failures.database_ok
    assert [r.levelname for r in caplog.records if "deadlock" in r.getMessage()] == ["ERROR"] * 3


def test_records_waiting_for_the_broker_count_against_the_intake_bound(h: Harness) -> None:
    """A committed tick whose effects the broker has not acknowledged (there is none here):
    its record is off the book but not done, and the executor counts it as waiting until the
    acknowledgement comes, so the intake pauses while the broker is away."""
    work = _work(h, 4)
    run = loaded("r")
    commits = tick_batch({"r": run}, NOW_MS, NAMES)
    plan = decide(item("r", work.records), run, commits["r"], True, NOW_MS, RULES)
    assert plan.outcome is Outcome.COMMITTED and plan.sends
    h.executor.carry_out(work, plan)
    assert h.executor.waiting_for_tick == 0 and h.executor.waiting_records == 1
    assert h.tracker.committable() == {}


def test_a_failed_stage_holds_the_next_deletions_for_its_backoff(h: Harness) -> None:
    """The database failed a stage that only deletes acknowledged outbox rows (here: nothing
    listens at its address): the deletions are not tried again before the outage's backoff,
    so an outage costs a try per backoff instead of one per loop turn (a chaos run counted
    284 failed tries in 0.6 s)."""
    h.shared.acknowledged.add([("r", 1)])
    h.clock.advance(1)  # the acknowledgement has waited long enough to go on its own
    h.executor.advance(10)
    assert h.executor.busy
    h.executor.wait_for_stage(10)
    h.executor.advance(10)  # carries the failure out
    assert not h.executor.busy and h.stats.error_count == 1
    h.executor.advance(10)
    assert not h.executor.busy  # the backoff has not passed
    h.clock.advance(0.2)
    h.executor.advance(10)
    assert h.executor.busy
    h.executor.wait_for_stage(10)


def test_a_plan_whose_carrying_out_raises_dead_letters_its_records_and_the_loop_goes_on(
    producer: Producer,
) -> None:
    """The ``produce`` fault point raises for run r when its plan is carried out: the work's
    records go to the dead-letter topic (unexpected_error), counted and logged once; another
    run's plan is carried out as ever."""
    faulty = _harness(producer, Faults.from_spec("produce=raise:r"))
    executor, tracker, stats = faulty.executor, faulty.tracker, faulty.stats
    works: dict[str, Work] = {}
    for offset, run_id in enumerate(["r", "other"]):
        record = accepted(wakeup_message(offset, Wakeup(run_id, "start", produced_at=NOW_MS)))
        tracker.started(record.tp, record.offset)
        works[run_id] = RunWork(run_id, records=[record])
    for run_id, work in works.items():
        run = loaded(run_id, tick_batch({run_id: loaded(run_id)}, NOW_MS, NAMES)[run_id].state)
        executor.carry_out(
            work, decide(item(run_id, work.records), run, None, False, NOW_MS, RULES)
        )
    assert stats.isolated == {"produce": 1}
    assert stats.dead_letters == {DeadLetterReason.UNEXPECTED_ERROR: 1}
    assert stats.ticks == {Outcome.NOOP: 1, Outcome.DEAD_LETTERED: 1}
    # The other's record (offset 1) is done; r's (offset 0) waits for its letter's ack.
    assert tracker.committable() == {TP: 0} and tracker.in_flight(TP) == 1
