"""The triggers a processor follows (core/triggers.py): which source topics it subscribes
to, where a partition the group never read starts, and the verdict on each of their records,
counted by trigger. The set is read at start and by the watchdog's sweeps; a change of its
topics asks the processor to subscribe again (the group then rebalances).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.intake import Reject, Requested, Skipped, admit_trigger
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Inbound, KafkaMessage
from processor.core.routing import TopicNames
from processor.core.shapes import TopicPartition
from processor.core.stats import Stats
from processor.core.triggers import Trigger
from processor.io.postgres.trigger_store import TriggerSet
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.telemetry.logs import describe

log = logging.getLogger("ductor.triggers")

_OUTCOMES = {Requested: "requested", Skipped: "skipped", Reject: "rejected"}


class TriggerFollower:
    def __init__(
        self, names: TopicNames, max_bytes: int, stats: Stats, faults: Faults = NO_FAULTS
    ) -> None:
        self._names = names
        self._max_bytes = max_bytes
        self._stats = stats
        self._faults = faults
        self._set = TriggerSet()
        # Asked of every consumed record: a dict lookup, not the names' string comparisons.
        self._is_source: dict[str, bool] = {}

    @property
    def by_topic(self) -> Mapping[str, Trigger]:
        return self._set.by_topic

    def follow(self, found: TriggerSet) -> bool:
        """Follow the triggers read; True when their topics changed (subscribe again). One
        that cannot be followed (unreadable, or on one of Ductor's own topics) is said once
        and left out: it stops nothing but itself."""
        usable = {t: tr for t, tr in found.by_topic.items() if self.is_source(t)}
        unreadable = dict(found.unreadable)
        for topic in set(found.by_topic) - set(usable):
            unreadable[found.by_topic[topic].name] = f"its topic {topic} is one of Ductor's own"
        for name, why in unreadable.items():
            if self._set.unreadable.get(name) != why:
                log.error(
                    "trigger %s cannot be followed and is left out: %s",
                    name,
                    why,
                    extra={"trigger": name},
                )
        before = set(self._set.by_topic)
        self._set = TriggerSet(usable, unreadable)
        if set(usable) == before:
            return False
        log.info(
            "following triggers",
            extra={"triggers": {tr.name: t for t, tr in sorted(usable.items())}},
        )
        return True

    def is_source(self, topic: str) -> bool:
        """A topic that is not Ductor's own: a trigger's source, followed or not (any more)."""
        known = self._is_source.get(topic)
        if known is None:
            known = self._is_source[topic] = self._names.source_of(topic) == "trigger"
        return known

    def start_at(
        self, partition: KafkaTopicPartition, uncommitted: set[TopicPartition] | None
    ) -> KafkaTopicPartition:
        """A trigger's partition the group never read starts where the trigger was created;
        every other partition where the group's offset says."""
        trigger = self._set.by_topic.get(partition.topic)
        tp = (partition.topic, partition.partition)
        if trigger is None or uncommitted is None or tp not in uncommitted:
            return partition
        start = trigger.start_offset(partition.partition)
        return KafkaTopicPartition(*tp, OFFSET_BEGINNING if start is None else start)

    def admit(self, message: KafkaMessage) -> Requested | Skipped | Reject | None:
        """The verdict on a record of a source topic, counted; None when its trigger is gone
        (read before the partition is let go: not taken, the next follower reads it)."""
        topic = message.topic()
        trigger = self._set.by_topic.get(topic) if topic is not None else None
        if trigger is None:
            return None
        try:
            verdict = admit_trigger(message, trigger, self._max_bytes)
            if isinstance(verdict, Requested):
                self._faults.hit(Point.TRIGGER, verdict.request.run_id)
        except Exception as exc:  # the record's alone: dead-lettered, never the loop's
            verdict = self._failed(message, trigger, exc)
        self._stats.trigger_records[(trigger.name, _OUTCOMES[type(verdict)])] += 1
        return verdict

    def _failed(self, message: KafkaMessage, trigger: Trigger, exc: Exception) -> Reject:
        """Mapping the record raised what nobody foresaw (the mapping itself never raises on
        what a record holds: core/triggers.py): its dead letter says why."""
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None
        self._stats.isolated["trigger"] += 1
        log.error(
            "trigger %s: an unexpected exception, isolated to the record at %s[%d]@%d: %s",
            trigger.name,
            topic,
            partition,
            offset,
            describe(exc),
            exc_info=exc,
            extra={"trigger": trigger.name, "stage": "trigger"},
        )
        record = Inbound((topic, partition), offset, message.key(), message.value(), [], "trigger")
        detail = f"trigger {trigger.name}: {describe(exc)}"
        return Reject(record, DeadLetterReason.UNEXPECTED_ERROR, detail)
