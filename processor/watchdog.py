"""The watchdog: re-wakes runs whose next wakeup is overdue and force-fails stuck runs.

Sweeps are split across the live instances without a lock or a lease: a run belongs to the
wakeup partition its id hashes to (the same partition its wakeups go to), and an instance only
sweeps the runs of the bulk-tier (t2) partitions the consumer group assigned to it. The group
protocol already guarantees one owner per partition; a brief overlap during a rebalance only
produces a duplicate wakeup, which a no-op tick absorbs.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import psycopg

from processor.config import Settings
from processor.envelope import Wakeup
from processor.kafka_io import partition_for
from processor.store import sweep_due, sweep_stuck

if TYPE_CHECKING:
    from processor.runner import Processor

log = logging.getLogger("ductor.watchdog")


class Watchdog:
    def __init__(self, processor: Processor, settings: Settings) -> None:
        self._processor = processor
        self._settings = settings
        self.next_at: float | None = time.monotonic() + settings.sweep_interval_s
        self.rewoken = 0
        self._conn: psycopg.Connection[Any] | None = None  # its own: a batch may use the other

    def shards(self) -> tuple[int, list[int]]:
        topic = self._processor.names.wakeup("t2")
        owned = sorted(p for t, p in self._processor.assigned if t == topic)
        return self._processor.partitions[topic], owned

    def maybe_sweep(self) -> None:
        now = time.monotonic()
        if self.next_at is not None and now < self.next_at:
            return
        self.next_at = now + self._settings.sweep_interval_s
        modulus, owned = self.shards()
        if not owned:
            return
        try:
            self.sweep(modulus, owned)
        except psycopg.Error as exc:
            self._processor.stats.errors[type(exc).__name__] += 1
            self.close()
            log.error("watchdog sweep failed: %s", exc)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def sweep(self, modulus: int, owned: list[int]) -> None:
        coordinator = self._processor.coordinator
        if self._conn is None or self._conn.closed:
            self._conn = self._processor.connect()
        conn = self._conn
        limit = self._settings.sweep_limit
        for run_id in sweep_stuck(conn, modulus, owned, self._settings.stuck_after_s, limit):
            coordinator.force_fail_stuck(conn, run_id)
        due = sweep_due(conn, modulus, owned, self._settings.sweep_grace_s, limit)
        topic = self._processor.names.wakeup("t2")
        now_ms = int(time.time() * 1000)
        for run_id, _tier in due:
            wakeup = Wakeup(run_id=run_id, reason="sweep", produced_at=now_ms)
            partition = partition_for(run_id, self._processor.partitions[topic])
            self._processor.outbox.send(topic, wakeup.encode(), wakeup.key(), self._sent, partition)
        self.rewoken += len(due)
        if due:
            log.info("watchdog re-woke %d overdue run(s)", len(due))

    def _sent(self, err: object) -> None:
        if err is not None:
            # The run stays overdue, so the next sweep sends it again.
            self._processor.stats.errors["produce"] += 1
            log.error("watchdog wakeup not delivered: %s", err)
