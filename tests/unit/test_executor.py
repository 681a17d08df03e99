"""The executor carrying out plans, with its real producer client and no broker behind it:
records produced wait in the client's queue (unacknowledged), which is exactly what the
executor must cope with. Nothing here talks to a database (no batch is started)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import psycopg
import pytest
from confluent_kafka import Producer

from processor.core.decide import Rules, database_failed, decide, reject, tick_batch
from processor.core.envelope import Wakeup
from processor.core.intake import Reject, admit
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import DeadLetterReason, ForceFailReason, Outcome
from processor.core.pending import RunWork
from processor.core.policy import IN_PROCESS_BACKOFF_MS, MAX_IN_PROCESS_ATTEMPTS
from processor.core.routing import DELAY_RUNGS_MS
from processor.core.stats import Stats
from processor.engine.database import Database
from processor.engine.executor import Executor, Work
from processor.io.kafka import Outbox
from processor.io.telemetry import Telemetry

from .fakes import MAX_BYTES, NAMES, NOW_MS, FakeMessage, accepted, item, loaded, wakeup_message

RULES = Rules(NAMES, livelock_requeues=3)
TP = (NAMES.wakeup("t1"), 0)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def producer() -> Iterator[Producer]:
    client = Producer({"bootstrap.servers": "127.0.0.1:1", "log_level": 0})
    yield client
    client.purge()
    client.flush(0)


@dataclass
class Harness:
    executor: Executor
    tracker: OffsetTracker
    stats: Stats
    outbox: Outbox
    clock: Clock


@pytest.fixture
def h(producer: Producer) -> Harness:
    tracker, stats, outbox, clock = OffsetTracker(), Stats(), Outbox(producer), Clock()
    partitions = dict.fromkeys([*NAMES.coordinator_topics(), NAMES.steps, NAMES.dlq], 3)
    executor = Executor(
        database=Database("postgresql://nobody@127.0.0.1:1/none"),  # never opened here
        outbox=outbox,
        partitions=partitions,
        rules=RULES,
        partition_by_run=True,
        tracker=tracker,
        stats=stats,
        telemetry=Telemetry(),
        wall_ms=lambda: NOW_MS,
        monotonic=clock,
    )
    return Harness(executor, tracker, stats, outbox, clock)


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
    assert h.executor.book.take_ready(h.clock.now, 10) == []
    assert h.executor.book.next_ready_at() == h.clock.now + IN_PROCESS_BACKOFF_MS[1] / 1000
    assert (h.stats.conflicts, h.stats.error_count, h.stats.ticks[Outcome.CONFLICT]) == (1, 0, 1)
    assert h.tracker.committable() == {}  # the record waits: its offset is held
    h.clock.now += 1
    (again,) = h.executor.book.take_ready(h.clock.now, 10)
    assert again is work and again.attempts == 1


def test_a_requeue_settles_only_once_the_broker_acknowledged_it(h: Harness) -> None:
    work = _work(h, 4)
    run = loaded("r")
    commits = tick_batch({"r": run}, NOW_MS, NAMES)
    exhausted = item("r", work.records, attempts=MAX_IN_PROCESS_ATTEMPTS - 1)
    plan = decide(exhausted, run, commits["r"], False, NOW_MS, RULES)
    h.executor.carry_out(work, plan)
    assert (
        plan.outcome is Outcome.REQUEUED and h.outbox.in_flight >= 1
    )  # (the count includes client events)
    assert h.stats.ticks == {Outcome.CONFLICT: 1, Outcome.REQUEUED: 1}
    assert h.stats.requeues == {DELAY_RUNGS_MS[0]: 1} and h.stats.error_count == 0
    assert h.tracker.committable() == {}  # not acknowledged (there is no broker): held


def test_a_database_error_is_an_error_and_the_run_retries_later(h: Harness) -> None:
    work = _work(h, 4)
    plan = database_failed(item("r", work.records), 1000)
    h.executor.carry_out(work, plan, psycopg.OperationalError("the server went away"))
    assert h.stats.ticks == {Outcome.ERROR: 1} and h.stats.conflicts == 0
    assert h.executor.book.take_ready(h.clock.now + 0.5, 10) == []
    assert h.executor.book.take_ready(h.clock.now + 1.0, 10) == [work]


def test_a_rejected_record_is_dead_lettered_and_counted_by_reason(h: Harness) -> None:
    verdict = admit(FakeMessage(TP[0], 9, b"nope"), NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Reject)
    h.tracker.started(verdict.record.tp, verdict.record.offset)
    plan = reject(verdict.record, verdict.reason, verdict.detail, RULES)
    h.executor.carry_out_now(verdict.record, plan)
    assert h.stats.dead_letters == {DeadLetterReason.NOT_JSON: 1}
    assert (
        h.stats.ticks == {Outcome.DEAD_LETTERED: 1} and h.outbox.in_flight >= 1
    )  # (the count includes client events)
    assert h.tracker.committable() == {}


def test_runs_the_watchdog_failed_are_counted_as_stuck(h: Harness) -> None:
    h.executor.stuck_failed(["a", "b"])
    assert h.stats.force_fails == {ForceFailReason.STUCK: 2}
    assert h.stats.ticks == {Outcome.FORCE_FAILED: 2}


def test_acknowledged_outbox_rows_are_deleted_once_each_in_key_order_and_bounded(
    h: Harness,
) -> None:
    """After an outage both a commit and a relay may acknowledge the same row, and thousands
    may gather: each row is deleted once, at most 500 per statement, locked in key order."""
    rows = [(f"run-{i:05d}", 1) for i in range(1200)]
    h.executor._acknowledge(list(reversed(rows)))
    h.executor._acknowledge(rows[:300])  # acknowledged again (a relay's copy)
    first = h.executor._take_acknowledged()
    assert first == rows[:500]
    second, third = h.executor._take_acknowledged(), h.executor._take_acknowledged()
    assert second == rows[500:1000] and third == rows[1000:]
    assert h.executor._take_acknowledged() == []
