"""Step workers: run registered step functions for the tasks on the steps topic.

For each task the worker gathers the step's data (the run's input and its dependencies'
outputs: carried by the task, or read for the whole batch in one query), runs the function,
records the result idempotently keyed by (run, node, attempt), then produces a wakeup for the
run. Execution is at-least-once per
attempt (a crash before the offset commit runs the attempt again); the result insert is
``ON CONFLICT DO NOTHING`` and the coordinator applies each attempt's result once.

Outages are ridden through, never a reason to exit: a lost database connection is reopened
with capped exponential backoff and the same result inserted again; wakeups the broker has not
acknowledged are waited for (and re-sent if their delivery failed) for as long as it takes.
Offsets are stored only past tasks whose result is recorded (durably) and whose wakeup is
acknowledged, so ``stop()`` may abandon a batch mid-outage: its tasks are redelivered and
their results are idempotent. Each outage is logged once when it starts and once when it ends.

No task stops the worker either: a task that cannot be decoded (or names a tier, an attempt,
a text Postgres cannot hold) is dead-lettered with the reason; a result that cannot be stored
is recorded as a failed attempt saying why; a result for a run that no longer exists (deleted
by ``ductor gc``, say) is dropped with a log line.

Step functions and their registry live in ``processor.engine.steps`` (re-exported here).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from processor.core.dead_letters import dead_letter_headers, truncate_dead_letter
from processor.core.envelope import Wakeup
from processor.core.model import StepOutcome
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Headers, normalise_headers
from processor.core.routing import TopicNames
from processor.core.step_task import StepData, StepTask, decode_step_task
from processor.engine.outage import Outage
from processor.engine.steps import (
    StepContext,
    StepFailed,
    StepFn,
    StepRegistry,
    execute_step,
    sample_registry,
    storable_text,
)
from processor.engine.worker_db import WorkerDatabase
from processor.io.config import Settings
from processor.io.kafka import (
    choose_partition,
    group_protocol_config,
    produce,
    producer_config,
    producer_max_bytes,
    topic_partitions,
)
from processor.io.step_data import MissingData

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

# How often the wait for acknowledgements serves delivery reports and checks for a stop, and
# how long acknowledgements may take before the broker counts as unavailable.
_ACK_POLL_S = 0.1
_ACK_PATIENCE_S = 5.0


class Worker:
    def __init__(self, settings: Settings, registry: StepRegistry, threads: int = 8) -> None:
        self.settings = settings
        self.registry = registry
        self.names = TopicNames(settings.topic_prefix)
        client_id = self.instance_id = f"ductor-worker-{uuid.uuid4().hex[:8]}"
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
        self._shutdown_by: float | None = None
        self.outages = {name: Outage(name, log) for name in ("postgres", "kafka")}
        self.db = WorkerDatabase(settings.pg_dsn, self.outages["postgres"], self._stop)
        self.executed = 0
        self.dead_letters = 0  # tasks that could not be decoded
        self._dlq_max_bytes = producer_max_bytes(settings)

    @property
    def fetched(self) -> int:
        """Tasks whose data was read from the database (not carried inline)."""
        return self.db.fetched

    @property
    def dropped(self) -> int:
        """Results not recorded: their run no longer exists (or cannot be stored at all)."""
        return self.db.dropped

    def stop(self) -> None:
        self._stop.set()

    def run(self) -> None:
        self._consumer.subscribe([self.names.steps])
        self.db.connect()
        log.info(
            "worker started",
            extra={"instance": self.instance_id, "step_types": self.registry.types()},
        )
        try:
            while not self._stop.is_set():
                messages = self._consumer.consume(200, 0.1)
                tasks: list[tuple[StepTask, Headers]] = []
                letters: list[_Outgoing] = []
                for message in messages:
                    taken = self._task_of(message)
                    if isinstance(taken, _Outgoing):
                        letters.append(taken)
                    elif taken is not None:
                        tasks.append(taken)
                if (tasks or letters) and not self._run_tasks(tasks, letters):
                    break  # stopped mid-outage: the batch's offsets are not stored
                if messages:
                    self._store(messages)
        finally:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._producer.flush(max(0.0, self._shutdown_deadline() - time.monotonic()))
            self._consumer.close()
            self.db.close()
            log.info(
                "worker stopped",
                extra={
                    "executed": self.executed,
                    "dead_letters": self.dead_letters,
                    "dropped": self.db.dropped,
                    "fetched": self.db.fetched,
                    "outages": {name: o.count for name, o in self.outages.items()},
                },
            )

    def _task_of(self, message: Any) -> tuple[StepTask, Headers] | _Outgoing | None:
        """The task a message holds with its trace context, or its dead letter."""
        if message.error() is not None:
            if message.error().code() != KafkaError._PARTITION_EOF:
                log.error("worker consumer error: %s", message.error())
            return None
        try:
            headers = normalise_headers(message)
            # The task's trace context rides on to the wakeup, so one trace follows the run
            # through its step round trips.
            trace = [(k, v) for k, v in headers if k in ("traceparent", "tracestate")]
            return decode_step_task(message.value()), trace
        except Exception as exc:  # a poison task must never stop the worker
            return self._dead_letter(message, exc)

    def _dead_letter(self, message: Any, exc: Exception) -> _Outgoing:
        """A task that cannot be run goes to the dead-letter topic with why and where from."""
        detail = f"undecodable step task: {exc}"
        try:
            own = normalise_headers(message)
        except Exception:
            own = []
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        reason = DeadLetterReason.WRONG_SCHEMA
        headers = dead_letter_headers(own, reason, detail, topic, partition, offset)
        key, value = message.key(), message.value()
        value, headers = truncate_dead_letter(key, value, headers, self._dlq_max_bytes)
        log.error(
            "dead-lettered a step task",
            extra={"reason": reason.value, "detail": detail, "topic": topic, "offset": offset},
        )
        self.dead_letters += 1
        return _Outgoing(self.names.dlq, value, key, None, headers)

    def _run_tasks(self, tasks: list[tuple[StepTask, Headers]], letters: list[_Outgoing]) -> bool:
        """Run, record and announce a batch (and send its dead letters); False if stopped
        before all of it was done."""
        data = self._data_of([t for t, _ in tasks])
        if data is None:
            return False
        outcomes = list(self._pool.map(self._execute, [t for t, _ in tasks], data))
        wakeups: list[_Outgoing] = []
        for letter in letters:
            self._send(letter)
            wakeups.append(letter)
        recorded_all = self.db.record_batch([t for t, _ in tasks], outcomes)
        if recorded_all is None:
            return False
        for (task, trace), recorded in zip(tasks, recorded_all, strict=True):
            if not recorded:
                continue  # the run is gone: nothing to wake
            now_ms = int(time.time() * 1000)
            wakeup = Wakeup(run_id=task.run_id, reason="step_result", produced_at=now_ms)
            topic = self.names.wakeup(task.tier)
            partition = choose_partition(
                task.run_id, self._partitions[topic], self.settings.partition_by_run
            )
            outgoing = _Outgoing(topic, wakeup.encode(), wakeup.key(), partition, list(trace))
            self._send(outgoing)
            wakeups.append(outgoing)
            self._producer.poll(0)
        self.executed += len(tasks)
        # Results are recorded; the wakeups must be acknowledged before the offsets move on.
        return self._await_acknowledgements(wakeups)

    def _execute(
        self, task: StepTask, data: StepData | MissingData
    ) -> tuple[StepOutcome, Any, str | None]:
        if isinstance(data, MissingData):  # the attempt fails; a deleted run's is then dropped
            return StepOutcome.FAILED, None, storable_text(f"the step's data: {data}")
        return execute_step(self.registry, task, data)

    def _data_of(self, tasks: list[StepTask]) -> list[StepData | MissingData] | None:
        """Each task's data: its own when inline, the rest read in one query (through an
        outage, as ``_record`` does); None if stopped first."""
        to_fetch = [t for t in tasks if t.data is None]
        fetched = self.db.fetch(to_fetch) if to_fetch else []
        if fetched is None:
            return None
        in_order = iter(fetched)
        return [t.data if t.data is not None else next(in_order) for t in tasks]

    def _send(self, outgoing: _Outgoing) -> None:
        def delivered(err: KafkaError | None, _msg: Any) -> None:
            outgoing.error = err
            outgoing.acknowledged = err is None

        outgoing.error = None
        produce(
            self._producer,
            outgoing.topic,
            outgoing.value,
            outgoing.key,
            partition=outgoing.partition,
            headers=outgoing.headers,
            on_delivery=delivered,
        )

    def _await_acknowledgements(self, wakeups: list[_Outgoing]) -> bool:
        """Wait until the broker acknowledged every wakeup, re-sending refused ones with
        backoff; False if stopped before that (see ``_shutdown_deadline``)."""
        kafka = self.outages["kafka"]
        waiting_since = time.monotonic()
        resend_at = 0.0
        while True:
            self._producer.poll(_ACK_POLL_S)
            pending = [w for w in wakeups if not w.acknowledged]
            if not pending:
                kafka.ok()
                return True
            now = time.monotonic()
            if self._stop.is_set() and now >= self._shutdown_deadline():
                return False
            refused = [w for w in pending if w.error is not None]
            if refused and now >= resend_at:
                problem = f"{len(refused)} wakeup(s) refused: {refused[0].error}"
                resend_at = now + kafka.failed(problem)
                for outgoing in refused:
                    self._send(outgoing)
            elif not kafka.active and now - waiting_since > _ACK_PATIENCE_S:
                kafka.failed(
                    f"{len(pending)} wakeup(s) not acknowledged after {_ACK_PATIENCE_S:.0f} s"
                )

    def _shutdown_deadline(self) -> float:
        """When a stopping worker gives up on acknowledgements: after the shutdown timeout if
        the broker answers, at once if it is in an outage (the batch's offsets are not stored,
        so its tasks are redelivered; nothing is lost by not waiting)."""
        if self._shutdown_by is None:
            wait_s = 0.0 if self.outages["kafka"].active else self.settings.shutdown_timeout_s
            self._shutdown_by = time.monotonic() + wait_s
        return self._shutdown_by

    def _store(self, messages: list[Any]) -> None:
        try:
            self._consumer.store_offsets(offsets=_next_offsets(messages))
        except KafkaException as exc:
            # The partition was revoked meanwhile: its new owner runs those tasks again, and
            # their results are idempotent.
            log.warning("could not store worker offsets: %s", exc)


@dataclass
class _Outgoing:
    """A wakeup for a recorded result (or a task's dead letter), kept until the broker
    acknowledges it (to re-send it if its delivery fails)."""

    topic: str
    value: bytes | None
    key: bytes | None
    partition: int | None
    headers: Headers
    acknowledged: bool = False
    error: KafkaError | None = None


def _next_offsets(messages: list[Any]) -> list[TopicPartition]:
    highest: dict[tuple[str, int], int] = {}
    for m in messages:
        if m.error() is None:
            tp = (m.topic(), m.partition())
            highest[tp] = max(highest.get(tp, -1), m.offset())
    return [TopicPartition(t, p, o + 1) for (t, p), o in highest.items()]
