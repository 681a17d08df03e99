"""One processor instance: the poll loop that feeds the coordinator.

The loop never sleeps on a delay: a delay partition whose head is not due is paused (and the
record sought back) until its due time, a conflicted run waits in the coordinator with a ready
time, and the consume timeout is the time to the next of those events.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from processor.core.envelope import Rejected, decode_wakeup
from processor.core.flow import PauseBook, TierQueues
from processor.core.offsets import OffsetTracker
from processor.core.records import Inbound, KafkaMessage, normalise_headers
from processor.core.routing import TopicNames
from processor.core.stats import Stats
from processor.engine.effects import Effects, RunWork
from processor.engine.executor import Coordinator
from processor.engine.health import start_health_server
from processor.engine.watchdog import Watchdog
from processor.io.config import Settings
from processor.io.kafka import Outbox, consumer_config, producer_config, topic_partitions
from processor.io.store import use_orjson
from processor.io.telemetry import Telemetry

log = logging.getLogger("ductor.processor")

_IDLE_POLL_S = 0.1
_LAG_INTERVAL_S = 5.0


class Processor:
    def __init__(
        self,
        settings: Settings,
        stats: Stats | None = None,
        instance_id: str | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id or f"ductor-{uuid.uuid4().hex[:8]}"
        self.stats = stats or Stats()
        self.names = TopicNames(settings.topic_prefix)
        self._stop = threading.Event()
        self._producer = Producer(producer_config(settings, self.instance_id))
        self.outbox = Outbox(self._producer)
        topics = [*self.names.coordinator_topics(), self.names.steps, self.names.dlq]
        self.partitions = topic_partitions(self._producer, topics)
        self.tracker = OffsetTracker()
        self.pauses = PauseBook()
        self.queues: TierQueues[Inbound] = TierQueues(settings.tier_weights.as_dict())
        self.assigned: set[tuple[str, int]] = set()
        self.telemetry = telemetry or Telemetry.from_environment(
            "ductor-processor", settings.metrics_port, settings.group_id
        )
        self.telemetry.group_id = settings.group_id
        self.effects = Effects(
            outbox=self.outbox,
            names=self.names,
            partitions=self.partitions,
            partition_by_run=settings.partition_by_run,
            tracker=self.tracker,
            stats=self.stats,
            telemetry=self.telemetry,
        )
        self.coordinator = Coordinator(
            connect=self.connect,
            effects=self.effects,
            names=self.names,
            stats=self.stats,
            livelock_requeues=settings.livelock_requeues,
        )
        self.lag: dict[tuple[str, int], int] = {}
        self.telemetry.instrument(self.stats, lambda: self.lag)
        self.watchdog = Watchdog(self, settings)
        self._consumer = Consumer(consumer_config(settings, self.instance_id))
        self.last_loop_at = time.monotonic()
        self._next_stats_log = self.last_loop_at + settings.stats_log_interval_s
        self._next_lag_update = self.last_loop_at
        self._shutdown_deadline: float | None = None
        self._held_at: dict[tuple[str, int], int] = {}

    def connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.settings.pg_dsn, autocommit=True, connect_timeout=5)
        # Every statement here is short; one that runs for minutes is a hung database, and it
        # must fail (and be counted) rather than hold the loop, the watchdog or a shutdown.
        conn.execute("SET statement_timeout = '30s'")
        return use_orjson(conn)

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Consume until stop() is called (or ``until`` returns True), then shut down cleanly.
        The health endpoints (health.py) answer from before the first poll to after shutdown."""
        health = start_health_server(self)  # None unless DUCTOR_HEALTH_PORT is set
        try:
            self._consume_until_stopped(until)
        finally:
            if health is not None:
                health.stop()

    def _consume_until_stopped(self, until: Callable[[], bool] | None) -> None:
        self._consumer.subscribe(
            self.names.coordinator_topics(),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info("processor started", extra={"instance": self.instance_id})
        try:
            while not self._stop.is_set() and not (until is not None and until()):
                self.step()
        finally:
            self._shutdown()

    def step(self) -> None:
        """One turn of the loop: consume, resume, tick a batch, deliver, store offsets, sweep."""
        self.last_loop_at = time.monotonic()
        for message in self._consume():
            self._intake(message)
        self._resume_due()
        self._feed_coordinator()
        self.coordinator.run_batch(self.settings.batch_size)
        self.outbox.poll(0)
        self._store_offsets()
        self.watchdog.maybe_sweep()
        self._maybe_log_stats()
        self._maybe_update_lag()

    def _maybe_update_lag(self) -> None:
        """Records behind the high watermark per assigned partition, paused ones included
        (their fetch position stands still while the broker's end moves on). Fetched
        partitions use the watermark their fetches bring (no request); only paused ones,
        which fetch nothing, ask the broker."""
        now = time.monotonic()
        if self.telemetry.meter_provider is None or now < self._next_lag_update:
            return
        self._next_lag_update = now + _LAG_INTERVAL_S
        positions = self._consumer.position([TopicPartition(t, p) for t, p in self.assigned])
        lag: dict[tuple[str, int], int] = {}
        paused = self.pauses.paused()
        for tp in positions:
            fresh = (tp.topic, tp.partition) in paused
            try:
                _low, high = self._consumer.get_watermark_offsets(tp, timeout=0.5, cached=not fresh)
            except KafkaException:
                continue
            if high < 0:  # nothing fetched yet
                continue
            key = (tp.topic, tp.partition)
            position = self._held_at.get(key, tp.offset if tp.offset >= 0 else high)
            lag[key] = max(0, high - position)
        self.lag = lag

    def _maybe_log_stats(self) -> None:
        """Totals every few seconds, and the runs that conflicted most since the last line
        (run ids go to the log, never to metric labels)."""
        now = time.monotonic()
        if now < self._next_stats_log:
            return
        self._next_stats_log = now + self.settings.stats_log_interval_s
        hot = self.stats.take_hot_runs(5)
        log.info(
            "processor stats",
            extra={
                "instance": self.instance_id,
                "stats": self.stats.summary(),
                "hot_runs": [{"run_id": r, "conflicts": n} for r, n in hot],
            },
        )

    def _consume(self) -> list[Message]:
        batch = self.settings.batch_size
        messages: list[Message] = self._consumer.consume(batch, 0)
        if messages:
            return messages
        timeout = self._idle_timeout()
        if timeout <= 0:
            return []
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        rest: list[Message] = self._consumer.consume(
            batch - 1, self.settings.batch_linger_ms / 1000
        )
        return [first, *rest]

    def _idle_timeout(self) -> float:
        """How long the loop may block in poll: until the next due event, at most 100 ms."""
        now = time.monotonic()
        if self.outbox.in_flight or self.coordinator.busy:
            return 0.001  # delivery reports and the batch in flight wait for this loop
        if len(self.queues) or self.coordinator.ready_count(now):
            return 0.0
        deadlines = [
            d
            for d in (
                self.coordinator.next_ready_at(),
                self.pauses.next_resume_at(),
                self.watchdog.next_at,
            )
            if d is not None
        ]
        until_next = min(deadlines, default=now + _IDLE_POLL_S) - now
        return max(0.0, min(_IDLE_POLL_S, until_next))

    # -- intake ------------------------------------------------------------------------------

    def _intake(self, message: KafkaMessage) -> None:
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                self.stats.errors["consume"] += 1
                log.error("consumer error: %s", error)
            return
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None
        tp = (topic, partition)
        if self.pauses.is_paused(tp) and tp in self.pauses.delayed():
            return  # prefetched behind a not-due head: it will be read again after the resume
        record = Inbound(
            tp=tp,
            offset=offset,
            key=message.key(),
            value=message.value(),
            headers=normalise_headers(message),
            tier=self.names.tier_of(topic),
        )
        try:
            decoded = decode_wakeup(record.value, self.settings.max_record_bytes)
        except Exception as exc:  # a poison record must never stop the consumer
            decoded = Rejected("wrong_schema", f"undecodable record: {type(exc).__name__}: {exc}")
        if isinstance(decoded, Rejected):
            self.effects.started(record)
            work = RunWork(run_id="", records=[record])
            self.effects.start_span(work)
            self.effects.dead_letter(work, decoded.reason, decoded.detail)
            return
        record.wakeup = decoded
        self.stats.records += 1
        now_ms = int(time.time() * 1000)
        if decoded.due_at is not None and decoded.due_at > now_ms:
            self._hold_until_due(tp, offset, decoded.due_at - now_ms)
            return
        if decoded.target_at is not None and decoded.target_at > now_ms:
            self.coordinator.hop(record, now_ms)
            return
        self.queues.push(record.tier, record)

    def _hold_until_due(self, tp: tuple[str, int], offset: int, wait_ms: int) -> None:
        """Pause a delay partition at its not-due head and read the head again when due."""
        kafka_tp = TopicPartition(tp[0], tp[1], offset)
        self._consumer.pause([kafka_tp])
        self._consumer.seek(kafka_tp)
        self._held_at[tp] = offset  # where the partition stands while paused (for the lag)
        self.pauses.pause_until(tp, time.monotonic() + wait_ms / 1000)

    def _resume_due(self) -> None:
        due = [tp for tp in self.pauses.due_to_resume(time.monotonic()) if tp in self.assigned]
        for tp in due:
            self._held_at.pop(tp, None)
        if due:
            self._consumer.resume([TopicPartition(t, p) for t, p in due])

    def _feed_coordinator(self) -> None:
        room = self.settings.batch_size - self.coordinator.ready_count(time.monotonic())
        if room > 0:
            for record in self.queues.take(room):
                self.coordinator.add(record)
        self._apply_backpressure()

    def _apply_backpressure(self) -> None:
        limit = self.settings.tier_buffer_limit
        for tier in ("t0", "t1", "t2"):
            topic = self.names.wakeup(tier)
            tps = [tp for tp in self.assigned if tp[0] == topic]
            size = self.queues.size(tier)
            if size > limit:
                newly = self.pauses.hold(tps)
                if newly:
                    self._consumer.pause([TopicPartition(t, p) for t, p in newly])
            elif size < limit // 2:
                lifted = self.pauses.release(tps)
                if lifted:
                    self._consumer.resume([TopicPartition(t, p) for t, p in lifted])

    def _store_offsets(self) -> None:
        moved = self.tracker.committable()
        offsets = [
            TopicPartition(t, p, o) for (t, p), o in moved.items() if (t, p) in self.assigned
        ]
        if offsets:
            try:
                self._consumer.store_offsets(offsets=offsets)
            except KafkaException as exc:
                log.warning("could not store offsets: %s", exc)

    # -- rebalance ---------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        tps = {(p.topic, p.partition) for p in partitions}
        self.assigned |= tps
        # A delay partition paused before a rebalance stays paused until its due time.
        delayed = [TopicPartition(t, p) for (t, p) in self.pauses.delayed() if (t, p) in tps]
        if delayed:
            consumer.pause(delayed)
        log.info("partitions assigned", extra={"count": len(tps), "instance": self.instance_id})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(consumer, partitions, commit=True)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(consumer, partitions, commit=False)

    def _wait_bound(self) -> float:
        """How long a rebalance or the shutdown may wait for in-flight work."""
        if self._shutdown_deadline is not None:
            return max(0.1, self._shutdown_deadline - time.monotonic())
        return min(10.0, self.settings.shutdown_timeout_s)

    def _release(self, consumer: Consumer, partitions: list[TopicPartition], commit: bool) -> None:
        """Give partitions back: drop their waiting records (the next owner redoes them), let
        effects already produced finish so their records count as done, then commit."""
        tps = {(p.topic, p.partition) for p in partitions}
        # The batch in flight finishes first, so its outcome is known; bounded, because a hung
        # database must not hold a rebalance (or a shutdown) hostage. If it does not finish,
        # its records are simply redone by the partitions' next owner.
        if not self.coordinator.flush(self._wait_bound()):
            log.error("the batch in flight did not finish before the partitions were released")
        self.queues.drop(lambda r: r.tp in tps)
        self.coordinator.drop_partitions(tps)
        if commit:
            self.outbox.flush(min(5.0, self._wait_bound()))
            self._store_offsets()
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET:
                    log.warning("offset commit on revoke failed: %s", exc)
        for tp in tps:
            self.tracker.forget(tp)
            self.pauses.on_revoked(tp)
            self._held_at.pop(tp, None)
        self.assigned -= tps
        log.info("partitions released", extra={"count": len(tps), "instance": self.instance_id})

    def _shutdown(self) -> None:
        deadline = self._shutdown_deadline = time.monotonic() + self.settings.shutdown_timeout_s
        # Runs still waiting (backing off, or not yet ticked) are dropped: their offsets were
        # not stored, so the group redelivers them. Effects already produced are flushed.
        if not self.coordinator.flush(max(0.1, deadline - time.monotonic())):
            log.error("the batch in flight did not finish before the shutdown bound")
        self.coordinator.pending.clear()
        remaining = self.outbox.flush(max(0.1, deadline - time.monotonic()))
        if remaining:
            log.error(
                "%d effects still undelivered at shutdown; their records will be redone", remaining
            )
        self._store_offsets()
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                log.warning("final offset commit failed: %s", exc)
        self._consumer.close()
        self.coordinator.close()
        self.watchdog.close()
        self.telemetry.shutdown()
        log.info(
            "processor stopped", extra={"instance": self.instance_id, "stats": self.stats.summary()}
        )
