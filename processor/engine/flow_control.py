"""Which of its partitions the consumer reads, and why the others wait (carried out on the
consumer; the bookkeeping is core/flow.py's ``PauseBook``).

Two reasons pause a partition, each lifted on its own: a delay partition whose head record is
not due (paused at that record, read again when it is due, and still paused when reassigned),
and backpressure (a source whose local backlog passed the limit). The assignment lives here
too, grouped by source, since both need it.
"""

from __future__ import annotations

from collections.abc import Set

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.flow import PauseBook
from processor.core.routing import TIERS, TopicNames
from processor.core.shapes import TopicPartition
from processor.engine.lag import LagMeter

SOURCES = (*TIERS, "delay", "requests", "trigger")


class FlowControl:
    def __init__(self, consumer: Consumer, names: TopicNames, lag: LagMeter) -> None:
        self._consumer = consumer
        self._names = names
        self._lag = lag
        self._pauses = PauseBook()
        self._assigned: set[TopicPartition] = set()
        self._by_source: dict[str, list[TopicPartition]] = {source: [] for source in SOURCES}

    @property
    def assigned(self) -> Set[TopicPartition]:
        return self._assigned

    def paused(self) -> set[TopicPartition]:
        return self._pauses.paused()

    def next_resume_at(self) -> float | None:
        return self._pauses.next_resume_at()

    def waits_for_due_head(self, tp: TopicPartition) -> bool:
        """A delay partition paused at a head that is not due: what was fetched behind that
        head before the pause is read again after the resume, not now."""
        return tp in self._pauses.delayed()

    def all_held_by_backpressure(self) -> bool:
        return bool(self._assigned) and all(self._pauses.held(tp) for tp in self._assigned)

    # -- the two reasons -------------------------------------------------------------------

    def hold_until_due(self, tp: TopicPartition, offset: int, now: float, wait_ms: int) -> None:
        """Pause a delay partition at its not-due head and read the head again when due."""
        kafka_tp = KafkaTopicPartition(tp[0], tp[1], offset)
        self._consumer.pause([kafka_tp])
        self._consumer.seek(kafka_tp)
        self._lag.held_at(tp, offset)  # where the partition stands while paused
        self._pauses.pause_until(tp, now + wait_ms / 1000)

    def resume_due(self, now: float) -> None:
        due = [tp for tp in self._pauses.due_to_resume(now) if tp in self._assigned]
        for tp in due:
            self._lag.released(tp)
        if due:
            self._consumer.resume([KafkaTopicPartition(t, p) for t, p in due])

    def apply_backpressure(self, backlog: dict[str, int], waiting: int, limit: int) -> None:
        """Bounded memory: a source whose local queue (``backlog``) passes ``limit`` records
        is paused until it is down to half; every source also counts the records ``waiting``
        in the executor (for a tick: ready, backing off, retried through an outage; or for
        the broker to acknowledge their effects), so a backlog the database or the broker
        cannot drain stops consumption instead of filling the heap."""
        for source, tps in self._by_source.items():
            size = backlog.get(source, 0)
            if size > limit or waiting > limit:
                newly = self._pauses.hold(tps)
                if newly:
                    self._consumer.pause([KafkaTopicPartition(t, p) for t, p in newly])
            elif size < limit // 2 and waiting < limit // 2:
                lifted = self._pauses.release(tps)
                if lifted:
                    self._consumer.resume([KafkaTopicPartition(t, p) for t, p in lifted])

    # -- the assignment --------------------------------------------------------------------

    def assigned_now(self, tps: set[TopicPartition]) -> None:
        """Partitions the group gave this instance; a delay partition paused before a
        rebalance stays paused until its due time."""
        self._assigned |= tps
        self._regroup()
        delayed = [KafkaTopicPartition(t, p) for (t, p) in self._pauses.delayed() if (t, p) in tps]
        if delayed:
            self._consumer.pause(delayed)

    def released(self, tps: set[TopicPartition]) -> None:
        for tp in tps:
            self._pauses.on_revoked(tp)
            self._lag.released(tp)
        self._assigned -= tps
        self._regroup()

    def _regroup(self) -> None:
        by_source: dict[str, list[TopicPartition]] = {source: [] for source in SOURCES}
        for tp in sorted(self._assigned):
            by_source[self._names.source_of(tp[0])].append(tp)
        self._by_source = by_source
