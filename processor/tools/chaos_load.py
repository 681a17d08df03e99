"""The chaos run's load: runs of one workflow started over a span of time, each start wakeup
produced several times onto random partitions (as producers that do not co-partition would),
so several processors tick the same run at once and race for it; a few runs are inserted
without their start wakeup (lost starts), for the sweep to start.

The feeder talks to the services directly, never through the chaos run's proxy: it is the
outside client, and it rides through the outages itself (inserts are retried on a new
connection, records the broker did not take are sent again).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import psycopg
from confluent_kafka import KafkaError, Producer

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce, topic_partitions
from processor.io.kafka.configs import producer_config
from processor.io.kafka.logs import with_logger
from processor.io.postgres.connections import connect_durable
from processor.io.postgres.runs_admin import insert_runs

log = logging.getLogger("ductor.chaos")

_BATCH_EVERY_S = 0.5
_RETRY_S = 0.5


class Feeder:
    """Starts ``run_ids`` evenly over ``over_s`` seconds on a thread of its own."""

    def __init__(
        self,
        settings: Settings,
        wf: WorkflowDef,
        run_ids: Sequence[str],
        over_s: float,
        copies: int,
        rng: random.Random,
        lost_starts: int = 0,
    ) -> None:
        self._settings = settings
        # Runs inserted whose start wakeup is never produced, as by a client that died (or
        # lost the broker) between the two: the processors' overdue sweep must start them.
        self.lost = set(rng.sample(list(run_ids), min(lost_starts, len(run_ids))))
        self._wf = wf
        self._run_ids = list(run_ids)
        self._over_s = over_s
        self._copies = copies
        self._rng = rng
        self._topic = TopicNames(settings.topic_prefix).wakeup("t1")
        self._conn: psycopg.Connection[Any] | None = None
        self._stop = threading.Event()
        self.started = 0  # runs inserted and their wakeups handed to the producer
        self.acknowledged = 0  # wakeups the broker acknowledged
        self.resent = 0  # wakeups sent again after a failed delivery
        self.error: BaseException | None = None
        self._refused: list[tuple[bytes, bytes]] = []  # (value, key) of failed deliveries
        self._thread = threading.Thread(target=self._run, name="chaos-feeder", daemon=True)

    @property
    def expected(self) -> int:
        return (len(self._run_ids) - len(self.lost)) * self._copies

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait until every run is started and every wakeup acknowledged; False if not."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive() and self.error is None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            # librdkafka's own lines about the broker being down would drown the run's output;
            # what matters (every wakeup acknowledged in the end) is counted here.
            config = {**producer_config(self._settings, "ductor-chaos-feeder"), "log_level": 0}
            producer = Producer(with_logger(config))
            partitions = topic_partitions(producer, [self._topic])[self._topic]
            batches = max(1, round(self._over_s / _BATCH_EVERY_S))
            size = -(-len(self._run_ids) // batches)
            began = time.monotonic()
            for i, start in enumerate(range(0, len(self._run_ids), size)):
                if self._stop.wait(max(0.0, began + i * _BATCH_EVERY_S - time.monotonic())):
                    return
                batch = self._run_ids[start : start + size]
                if not self._insert(batch):
                    return
                for run_id in batch:
                    if run_id in self.lost:
                        continue
                    wakeup = Wakeup(run_id, "start", produced_at=int(time.time() * 1000))
                    for _ in range(self._copies):
                        partition = self._rng.randrange(partitions)
                        self._send(producer, wakeup.encode(), wakeup.key(), partition)
                self.started += len(batch)
                self._resend(producer, partitions)
            while self.acknowledged < self.expected and not self._stop.is_set():
                producer.poll(0.1)
                self._resend(producer, partitions)
        except BaseException as exc:  # reported by the run, which then fails
            self.error = exc
            log.exception("the chaos feeder failed")
        finally:
            if self._conn is not None:
                self._conn.close()

    def _insert(self, batch: list[str]) -> bool:
        """Insert the batch's runs durably (an immediate restart of Postgres must not lose a
        run whose wakeups are out), reconnecting through outages; False if stopped first."""
        while True:
            try:
                if self._conn is None:
                    self._conn = connect_durable(self._settings.pg_dsn)
                insert_runs(self._conn, self._wf, [(r, {}) for r in batch], "t1")
                return True
            except (psycopg.OperationalError, psycopg.InterfaceError):
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None
                if self._stop.wait(_RETRY_S):
                    return False

    def _send(self, producer: Producer, value: bytes, key: bytes, partition: int) -> None:
        def delivered(err: KafkaError | None, _msg: Any) -> None:
            if err is None:
                self.acknowledged += 1
            else:
                self._refused.append((value, key))

        produce(producer, self._topic, value, key, partition, None, delivered)

    def _resend(self, producer: Producer, partitions: int) -> None:
        """Send again the wakeups whose delivery failed (the broker was down too long)."""
        producer.poll(0)
        refused, self._refused = self._refused, []
        for value, key in refused:
            self.resent += 1
            self._send(producer, value, key, self._rng.randrange(partitions))
