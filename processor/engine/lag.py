"""Consumer lag per assigned partition, for the ``ductor.consumer.lag`` gauge."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.shapes import TopicPartition

_INTERVAL_S = 5.0


class LagMeter:
    """Records behind the high watermark per assigned partition, paused ones included (their
    fetch position stands still while the broker's end moves on). Fetched partitions use the
    watermark their fetches bring (no request); only paused ones, which fetch nothing, ask the
    broker. Measured every few seconds on the loop thread, and only when metrics are on."""

    def __init__(self, consumer: Consumer, enabled: bool) -> None:
        self._consumer = consumer
        self._enabled = enabled
        self._next_at = 0.0
        self._held_at: dict[TopicPartition, int] = {}  # where a paused delay partition stands
        self._lag: dict[TopicPartition, int] = {}

    def read(self) -> Mapping[TopicPartition, int]:
        return self._lag

    def held_at(self, tp: TopicPartition, offset: int) -> None:
        self._held_at[tp] = offset

    def released(self, tp: TopicPartition) -> None:
        self._held_at.pop(tp, None)

    def maybe_update(
        self, now: float, assigned: set[TopicPartition], paused: set[TopicPartition]
    ) -> None:
        if not self._enabled or now < self._next_at:
            return
        self._next_at = now + _INTERVAL_S
        positions = self._consumer.position([KafkaTopicPartition(t, p) for t, p in assigned])
        lag: dict[TopicPartition, int] = {}
        for tp in positions:
            key = (tp.topic, tp.partition)
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    tp, timeout=0.5, cached=key not in paused
                )
            except KafkaException:
                continue
            if high < 0:  # nothing fetched yet
                continue
            position = self._held_at.get(key, tp.offset if tp.offset >= 0 else high)
            lag[key] = max(0, high - position)
        self._lag = lag
