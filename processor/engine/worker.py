"""Step workers: run registered step functions for the tasks on the steps topic.

For each task the worker runs the function, records the result idempotently keyed by
(run, node, attempt), then produces a wakeup for the run. Execution is at-least-once per
attempt (a crash before the offset commit runs the attempt again); the result insert is
``ON CONFLICT DO NOTHING`` and the coordinator applies each attempt's result once.

Step functions and their registry live in ``processor.engine.steps`` (re-exported here).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processor.core.envelope import Wakeup
from processor.core.model import ValidationError
from processor.core.records import Headers, normalise_headers
from processor.core.routing import TopicNames
from processor.core.step_task import StepTask, decode_step_task
from processor.engine.steps import (
    StepContext,
    StepFailed,
    StepFn,
    StepRegistry,
    execute_step,
    sample_registry,
)
from processor.io.config import Settings
from processor.io.kafka import (
    choose_partition,
    group_protocol_config,
    produce,
    producer_config,
    topic_partitions,
)
from processor.io.store import insert_step_result

# The step API has always been importable from here (docs/operations.md shows it).
__all__ = [
    "StepContext",
    "StepFailed",
    "StepFn",
    "StepRegistry",
    "Worker",
    "execute_step",
    "sample_registry",
]

log = logging.getLogger("ductor.worker")


class Worker:
    def __init__(self, settings: Settings, registry: StepRegistry, threads: int = 8) -> None:
        self.settings = settings
        self.registry = registry
        self.names = TopicNames(settings.topic_prefix)
        client_id = f"ductor-worker-{uuid.uuid4().hex[:8]}"
        self._producer = Producer(producer_config(settings, client_id))
        self._partitions = topic_partitions(self._producer, self.names.wakeup_topics())
        self._consumer = Consumer(
            {
                **settings.kafka_common(),
                "client.id": client_id,
                "group.id": f"{settings.group_id}-workers",
                **group_protocol_config(settings),
                "auto.offset.reset": "earliest",
                # Offsets are stored once a batch's results are recorded and its wakeups
                # acknowledged; auto-commit ships them (a rebalance never fails a commit call).
                "enable.auto.offset.store": False,
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 1000,
            }
        )
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="step")
        self._stop = threading.Event()
        self.executed = 0

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self._consumer.subscribe([self.names.steps])
        conn = psycopg.connect(self.settings.pg_dsn, autocommit=True)
        try:
            while not self._stop.is_set():
                messages = self._consumer.consume(200, 0.1)
                tasks = [t for t in (self._task_of(m) for m in messages) if t is not None]
                if tasks:
                    self._run_tasks(conn, tasks)
                if messages:
                    self._store(messages)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._producer.flush(10)
            self._consumer.close()
            conn.close()

    def _task_of(self, message: Any) -> tuple[StepTask, Headers] | None:
        if message.error() is not None:
            if message.error().code() != KafkaError._PARTITION_EOF:
                log.error("worker consumer error: %s", message.error())
            return None
        try:
            # The task's trace context rides on to the wakeup, so one trace follows the run
            # through its step round trips.
            trace = [
                (k, v) for k, v in normalise_headers(message) if k in ("traceparent", "tracestate")
            ]
            return decode_step_task(message.value()), trace
        except ValidationError as exc:
            log.error("skipping malformed step task at offset %s: %s", message.offset(), exc)
            return None

    def _run_tasks(
        self, conn: psycopg.Connection[Any], tasks: list[tuple[StepTask, Headers]]
    ) -> None:
        outcomes = list(
            self._pool.map(lambda t: execute_step(self.registry, t), [t for t, _ in tasks])
        )
        for (task, trace), (outcome, output, error) in zip(tasks, outcomes, strict=True):
            insert_step_result(conn, task.run_id, task.node, task.attempt, outcome, output, error)
            now_ms = int(time.time() * 1000)
            wakeup = Wakeup(run_id=task.run_id, reason="step_result", produced_at=now_ms)
            topic = self.names.wakeup(task.tier)
            produce(
                self._producer,
                topic,
                wakeup.encode(),
                wakeup.key(),
                partition=choose_partition(
                    task.run_id, self._partitions[topic], self.settings.partition_by_run
                ),
                headers=list(trace),
            )
            self._producer.poll(0)
        self.executed += len(tasks)
        # Results are recorded; the wakeups must be acknowledged before the offsets move on.
        if self._producer.flush(30) != 0:
            raise RuntimeError("wakeups for step results were not acknowledged by the broker")

    def _store(self, messages: list[Any]) -> None:
        try:
            self._consumer.store_offsets(offsets=_next_offsets(messages))
        except KafkaException as exc:
            # The partition was revoked meanwhile: its new owner runs those tasks again, and
            # their results are idempotent.
            log.warning("could not store worker offsets: %s", exc)


def _next_offsets(messages: list[Any]) -> list[TopicPartition]:
    highest: dict[tuple[str, int], int] = {}
    for m in messages:
        if m.error() is None:
            tp = (m.topic(), m.partition())
            highest[tp] = max(highest.get(tp, -1), m.offset())
    return [TopicPartition(t, p, o + 1) for (t, p), o in highest.items()]
