"""The processor's collaborators as its composition root builds them (engine/assembly.py),
with real clients that reach no broker and no database, and a ManualClock: how long the loop
blocks in poll, how a not-due delay head pauses its partition until due, back-pressure, the
sweeps' timing and what a finished sweep's results become are judged in microseconds."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from confluent_kafka import TopicPartition as KafkaTopicPartition
from opentelemetry.trace import Span

from processor.core.decide import database_failed
from processor.core.envelope import Wakeup
from processor.core.outcomes import ForceFailReason
from processor.core.pending import RunWork
from processor.core.plans import Send
from processor.core.stats import Stats
from processor.engine.assembly import ProcessorParts, build_processor
from processor.engine.pace import DELIVERY_WAIT_S, IDLE_POLL_S, Pace
from processor.engine.watchdog import SweepResult
from processor.io.config.settings import Settings
from processor.io.runtime.clock import ManualClock
from processor.io.telemetry.setup import Telemetry

from .fakes import FakeMessage, item

NOWHERE = Settings(
    bootstrap_servers="127.0.0.1:1",  # nothing listens: no client reaches a broker
    pg_dsn="postgresql://nobody@127.0.0.1:1/none",  # never opened here
    batch_size=1,
    tier_buffer_limit=4,
    sweep_interval_s=0.5,
    trigger_refresh_s=3600.0,
)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def parts(clock: ManualClock) -> Iterator[ProcessorParts]:
    built = build_processor(
        NOWHERE, "p-test", Stats(), Telemetry(), lambda: None, clock=clock.clock
    )
    built.partitions.update(dict.fromkeys(built.names.coordinator_topics(), 3))  # (as read)
    yield built
    built.producer.purge()
    built.producer.flush(0)
    built.membership.consumer.close()


class _Sending:
    """A producer holding ``in_flight`` records; each flush is noted in ``flushed``."""

    def __init__(self, in_flight: int, flushed: list[float]) -> None:
        self.in_flight, self.flushed = in_flight, flushed

    def flush(self, timeout: float) -> int:
        self.flushed.append(timeout)
        return self.in_flight


def _quiet_pace(
    parts: ProcessorParts, in_flight: int = 0, sent_now: list[float] | None = None
) -> Pace:
    """The loop's pace over ``parts``, its producer's queue taken as holding ``in_flight``
    (a client that reaches no broker queues events of its own at any moment); what it asks
    to send at once goes to ``sent_now`` (each the longest it may wait)."""
    return Pace(
        clock=parts.commons.clock,
        batch_size=NOWHERE.batch_size,
        batch_linger_ms=NOWHERE.batch_linger_ms,
        buffer_limit=NOWHERE.tier_buffer_limit,
        stats_every_s=NOWHERE.stats_log_interval_s,
        queues=parts.queues,
        executor=parts.executor,
        requests=parts.requests,
        sweeps=parts.sweeps,
        publisher=_Sending(in_flight, [] if sent_now is None else sent_now),
        delivery=parts.commons.delivery,
        flow=lambda: parts.membership.flow,
    )


def _assign(parts: ProcessorParts, topic: str) -> tuple[str, int]:
    """Partition 0 of ``topic``, assigned as the group's callback would."""
    parts.membership.consumer.incremental_assign([KafkaTopicPartition(topic, 0, 0)])
    parts.membership.flow.assigned_now({(topic, 0)})
    return (topic, 0)


def _wakeup(parts: ProcessorParts, topic: str, offset: int, run_id: str, **kw: int) -> FakeMessage:
    wall_ms = parts.commons.db_clock.now_ms()
    wakeup = Wakeup(run_id, "timer", produced_at=wall_ms, **kw)
    return FakeMessage(topic, offset, wakeup.encode(), key_=wakeup.key())


def test_an_idle_loop_blocks_in_poll_until_the_next_due_event(
    parts: ProcessorParts, clock: ManualClock
) -> None:
    """Nothing due: the poll blocks its full 100 ms. A run backing off 30 ms in the executor
    (its batch failed on the database): 30 ms; once it is ready, not at all."""
    pace = _quiet_pace(parts)
    assert pace.idle_timeout() == IDLE_POLL_S
    message = _wakeup(parts, parts.names.wakeup("t1"), 0, "r")
    parts.intake.take(message)
    (record,) = parts.queues.take(1)
    work: RunWork[Span] = RunWork("r", records=[record])
    parts.executor.carry_out(work, database_failed(item("r", [record]), 30))
    assert pace.idle_timeout() == pytest.approx(0.03)
    clock.advance(0.03)
    assert parts.executor.ready_count(pace.now()) == 1 and pace.idle_timeout() == 0.0


def test_records_on_their_way_to_the_broker_keep_the_poll_short(parts: ProcessorParts) -> None:
    """Their delivery reports wait for the loop's poll: it blocks a few ms at most."""
    assert _quiet_pace(parts, in_flight=1).idle_timeout() == DELIVERY_WAIT_S


def test_records_on_their_way_go_at_once_when_nothing_else_comes(parts: ProcessorParts) -> None:
    """Nothing to take and records on their way: the loop sends them now (the producer's
    flush, which skips its linger) and waits there for their reports, not in the consumer's
    poll while the linger holds them back."""
    sent_now: list[float] = []
    pace = _quiet_pace(parts, in_flight=1, sent_now=sent_now)
    assert pace.consume(parts.membership.consumer) == []
    assert sent_now == [DELIVERY_WAIT_S]


def test_a_not_due_delay_head_pauses_its_partition_until_due(
    parts: ProcessorParts, clock: ManualClock
) -> None:
    """The head of a delay partition due in 40 ms: the partition is paused at it, the loop
    blocks 40 ms at most, and the partition resumes once the head is due."""
    topic = parts.names.delay(100)
    tp = _assign(parts, topic)
    due_at = parts.commons.db_clock.now_ms() + 40
    parts.intake.take(_wakeup(parts, topic, 0, "r", due_at=due_at))
    flow = parts.membership.flow
    pace = _quiet_pace(parts)
    assert tp in flow.paused() and not parts.queues
    assert pace.idle_timeout() == pytest.approx(0.04)
    assert parts.commons.tracker.committable() == {}  # not taken: read again when due
    clock.advance(0.039)
    flow.resume_due(parts.pace.now())
    assert tp in flow.paused()
    clock.advance(0.001)
    flow.resume_due(parts.pace.now())
    assert tp not in flow.paused() and pace.idle_timeout() == IDLE_POLL_S


def test_a_backlog_past_the_limit_pauses_its_source_until_down_to_half(
    parts: ProcessorParts,
) -> None:
    """DUCTOR_TIER_BUFFER_LIMIT 4, a batch of 1: six wakeups taken in leave five queued, so
    their tier's partition pauses (the other tier's does not); it resumes only once fewer
    than two wait."""
    t1 = _assign(parts, parts.names.wakeup("t1"))
    t2 = _assign(parts, parts.names.wakeup("t2"))
    for offset in range(6):
        parts.intake.take(_wakeup(parts, t1[0], offset, f"r{offset}"))
    parts.pace.feed()
    flow = parts.membership.flow
    assert parts.executor.waiting_records == 1 and len(parts.queues) == 5
    assert flow.paused() == {t1}
    backlogs = []
    while t1 in flow.paused():
        parts.executor.drop_waiting()  # (its batch gone: the next record goes in)
        parts.pace.feed()
        backlogs.append(len(parts.queues))
    assert backlogs == [4, 3, 2, 1] and t2 not in flow.paused()


def test_records_waiting_in_the_executor_pause_every_source(parts: ProcessorParts) -> None:
    """Runs retried through a database outage stay in the executor: past the limit, every
    source pauses, however short its own queue."""
    t1 = _assign(parts, parts.names.wakeup("t1"))
    t2 = _assign(parts, parts.names.wakeup("t2"))
    for offset in range(5):
        parts.intake.take(_wakeup(parts, t2[0], offset, f"r{offset}"))
        (record,) = parts.queues.take(1)
        work: RunWork[Span] = RunWork(f"r{offset}", records=[record])
        parts.executor.carry_out(work, database_failed(item(work.run_id, [record]), 1000))
    parts.pace.feed()
    assert parts.executor.waiting_records == 5
    assert parts.membership.flow.paused() == {t1, t2}


def test_sweeps_come_every_interval_and_bound_the_idle_wait(
    parts: ProcessorParts, clock: ManualClock
) -> None:
    """With nothing owned, nothing to relay and no triggers due, a due sweep has nothing to
    do (no thread starts) but the next is scheduled one interval on; the loop's poll never
    blocks past it."""
    sweeps, pace = parts.sweeps, _quiet_pace(parts)
    first = sweeps.next_at
    assert first == parts.pace.now() + NOWHERE.sweep_interval_s
    clock.advance(0.45)
    sweeps.turn()
    assert sweeps.next_at == first and pace.idle_timeout() == pytest.approx(0.05)
    clock.advance(0.05)
    sweeps.turn()
    assert sweeps.next_at == pytest.approx(parts.pace.now() + NOWHERE.sweep_interval_s)
    assert sweeps.watchdog.sweeps == 0  # (none ran)


def test_a_sweeps_results_are_carried_out_and_its_failure_is_an_outage(
    parts: ProcessorParts,
) -> None:
    """Overdue runs are woken, stuck runs counted as force-failed, rows left in the outbox
    relayed (their records in flight); a sweep the database failed is one outage."""
    stats = parts.commons.stats
    parts.sweeps.hand_on(
        SweepResult(overdue=[("a", "t1"), ("b", "t2")], force_failed=[("c", "wf")])
    )
    assert parts.commons.publisher.in_flight >= 2
    assert stats.force_fails == {ForceFailReason.STUCK: 1} and not stats.errors
    send = Send(parts.names.wakeup("t1"), b"d", b"{}", by_run="d")
    parts.sweeps.hand_on(SweepResult(relay=[("d", 4, (send,))]))
    assert stats.relayed == 1 and parts.executor.waiting_records == 0
    assert parts.commons.postgres.count == 0
    error = psycopg.OperationalError("the server went away")
    parts.sweeps.hand_on(SweepResult(error=error))
    assert parts.commons.postgres.count == 1 and stats.errors == {"OperationalError": 1}
