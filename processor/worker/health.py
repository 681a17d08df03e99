"""Health of one worker, for an orchestrator's probes (served by io/runtime/health_http.py's server
on
``DUCTOR_HEALTH_PORT``).

``GET /healthz``: 200 while the worker's loop keeps turning and none of its threads died (its
database lanes, its step slots, its presence heartbeat: io/runtime/threads.py). A step that hangs
does not stall it (the loop never runs users' code), so a stall or a dead thread is the worker's
own and a restart is the cure.

``GET /readyz``: 200 unless the worker is starting (waiting for the broker or the database) or
shutting down, its loop is stalled, Postgres does not answer (its own connections are in an
outage, or the server's check fails), or it holds no partition of a queue that has tasks
waiting: a spare worker of an idle queue is ready, one left out of its group while tasks pile
up is not.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.io.config.settings import Settings
from processor.io.kafka.configs import reader_config
from processor.io.kafka.logs import with_logger
from processor.io.runtime.threads import ThreadWatch

_LAG_CHECK_EVERY_S = 5.0
_LAG_TIMEOUT_S = 2.0


@dataclass
class WorkerProbe:
    """What the endpoints read of one worker; its loop keeps it up to date (plain attribute
    writes, read without a lock: a value at most a turn old)."""

    instance_id: str
    lag: QueueLag | None = None
    last_loop_at: float = field(default_factory=time.monotonic)
    assigned_partitions: int = 0
    stopping: bool = False
    database_ok: bool = True  # False while its connections ride through an outage
    waiting_for: str | None = None  # at start: the dependency not answering yet
    threads: ThreadWatch = field(default_factory=ThreadWatch)  # the worker's own threads

    def broken(self) -> list[str]:
        return self.threads.problems()

    def problems(self, stall_s: float) -> list[str]:
        problems = self.broken()
        if self.waiting_for is not None:
            problems.append(f"starting: waiting for {self.waiting_for}")
        if self.stopping:
            problems.append("shutting down")
        if time.monotonic() - self.last_loop_at > stall_s:
            problems.append("the loop is stalled")
        if not self.database_ok:
            problems.append("the database does not answer the worker's statements")
        if self.assigned_partitions == 0 and self.lag is not None:
            waiting = self.lag.waiting()
            if waiting:
                problems.append(
                    f"no partition of queue(s) {', '.join(sorted(waiting))} assigned, while"
                    f" {sum(waiting.values())} task(s) wait there"
                )
        return problems


class QueueLag:
    """Tasks waiting on each queue's steps topic beyond what the workers' group committed,
    read from the broker at most every few seconds (only asked while the worker holds no
    partition), with a client of its own."""

    def __init__(self, settings: Settings, queues: Mapping[str, str]) -> None:
        """``queues``: each steps topic's queue (a queue has one per tier)."""
        self._queues = dict(queues)
        self._consumer = Consumer(
            with_logger(reader_config(settings, "ductor-worker-lag", settings.worker_group_id))
        )
        self._lock = threading.Lock()
        self._checked_at = 0.0
        self._waiting: dict[str, int] = {}

    def waiting(self) -> dict[str, int]:
        """Tasks waiting by queue (queues with none left out)."""
        with self._lock:
            if time.monotonic() - self._checked_at >= _LAG_CHECK_EVERY_S:
                self._waiting = self._read()
                self._checked_at = time.monotonic()
            return dict(self._waiting)

    def _read(self) -> dict[str, int]:
        try:
            metadata = self._consumer.list_topics(timeout=_LAG_TIMEOUT_S).topics
            tps = [
                KafkaTopicPartition(topic, p)
                for topic in self._queues
                if topic in metadata
                for p in metadata[topic].partitions
            ]
            committed = self._consumer.committed(tps, timeout=_LAG_TIMEOUT_S)
            waiting: dict[str, int] = {}
            for tp in committed:
                low, high = self._consumer.get_watermark_offsets(
                    KafkaTopicPartition(tp.topic, tp.partition),
                    timeout=_LAG_TIMEOUT_S,
                    cached=False,
                )
                position = tp.offset if tp.offset >= 0 else low
                if high > position:
                    queue = self._queues[tp.topic]
                    waiting[queue] = waiting.get(queue, 0) + high - position
            return waiting
        except KafkaException:
            return {}  # the broker does not answer: the worker's own outage says so

    def serve(self) -> None:
        """Serve the client's queue (its log lines: io/kafka/logs.py) unless a read holds
        it; the worker's loop calls this every turn, and never waits for it."""
        if self._lock.acquire(blocking=False):
            try:
                self._consumer.poll(0)
            finally:
                self._lock.release()

    def close(self) -> None:
        self._consumer.close()
