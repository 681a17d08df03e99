"""Consumer lag per assigned partition, for the ``ductor.consumer.lag`` gauge."""

from __future__ import annotations

from collections.abc import Mapping

from confluent_kafka import Consumer, KafkaException, TopicPartition

_INTERVAL_S = 5.0

TP = tuple[str, int]


class LagMeter:
    """Records behind the high watermark per assigned partition, paused ones included (their
    fetch position stands still while the broker's end moves on). Fetched partitions use the
    watermark their fetches bring (no request); only paused ones, which fetch nothing, ask the
    broker. Measured every few seconds on the loop thread, and only when metrics are on."""

    def __init__(self, consumer: Consumer, enabled: bool) -> None:
        self._consumer = consumer
        self._enabled = enabled
        self._next_at = 0.0
        self._held_at: dict[TP, int] = {}  # where a paused delay partition stands
        self._lag: dict[TP, int] = {}

    def read(self) -> Mapping[TP, int]:
        return self._lag

    def held_at(self, tp: TP, offset: int) -> None:
        self._held_at[tp] = offset

    def released(self, tp: TP) -> None:
        self._held_at.pop(tp, None)

    def maybe_update(self, now: float, assigned: set[TP], paused: set[TP]) -> None:
        if not self._enabled or now < self._next_at:
            return
        self._next_at = now + _INTERVAL_S
        positions = self._consumer.position([TopicPartition(t, p) for t, p in assigned])
        lag: dict[TP, int] = {}
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
