"""The watchdog: re-wakes runs whose next wakeup is overdue and force-fails stuck runs.

Sweeps are split across the live instances without a lock or a lease: a run belongs to the
wakeup partition its id hashes to (the same partition its wakeups go to), and an instance only
sweeps the runs of the bulk-tier (t2) partitions the consumer group assigned to it. The group
protocol already guarantees one owner per partition; a brief overlap during a rebalance only
produces a duplicate wakeup, which a no-op tick absorbs.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg

from processor.core.envelope import Wakeup
from processor.core.outcomes import Outcome
from processor.core.routing import partition_for
from processor.io.config import Settings
from processor.io.store import sweep_due, sweep_stuck

if TYPE_CHECKING:
    from processor.engine.processor import Processor

log = logging.getLogger("ductor.watchdog")


@dataclass(frozen=True)
class SweepResult:
    """What one sweep found and did, handed from the sweep thread to the poll loop."""

    overdue: list[str] = field(default_factory=list)  # runs to re-wake
    force_failed: list[str] = field(default_factory=list)  # runs failed as stuck
    error: psycopg.Error | None = None


class Watchdog:
    """Sweeps on a daemon thread with its own connection, so a slow or hung database never
    holds the poll loop (nor a shutdown); the poll loop produces the re-wakes and meters."""

    def __init__(self, processor: Processor, settings: Settings) -> None:
        self._processor = processor
        self._settings = settings
        self.next_at: float | None = time.monotonic() + settings.sweep_interval_s
        self.rewoken = 0
        self._conn: psycopg.Connection[Any] | None = None
        self._results: queue.SimpleQueue[SweepResult] = queue.SimpleQueue()
        self._sweeping = threading.Event()  # one sweep at a time

    def shards(self) -> tuple[int, list[int]]:
        topic = self._processor.names.wakeup("t2")
        owned = sorted(p for t, p in set(self._processor.assigned) if t == topic)
        return self._processor.partitions[topic], owned

    def maybe_sweep(self) -> None:
        """Called every loop turn: hand finished sweeps on, start the next one when due."""
        while not self._results.empty():
            self._apply(self._results.get_nowait())
        now = time.monotonic()
        if (self.next_at is not None and now < self.next_at) or self._sweeping.is_set():
            return
        self.next_at = now + self._settings.sweep_interval_s
        modulus, owned = self.shards()
        if owned:
            self._sweeping.set()
            threading.Thread(
                target=self._sweep_thread, args=(modulus, owned), name="ductor-sweep", daemon=True
            ).start()

    def _sweep_thread(self, modulus: int, owned: list[int]) -> None:
        try:
            self._results.put(self.sweep(modulus, owned))
        except psycopg.Error as exc:
            self.close()
            self._results.put(SweepResult(error=exc))
        finally:
            self._sweeping.clear()

    def sweep(self, modulus: int, owned: list[int]) -> SweepResult:
        """Force-fail stuck runs and find overdue ones (database work only)."""
        if self._conn is None or self._conn.closed:
            self._conn = self._processor.connect()
        conn, limit = self._conn, self._settings.sweep_limit
        coordinator = self._processor.coordinator
        stuck = sweep_stuck(conn, modulus, owned, self._settings.stuck_after_s, limit)
        failed = [run_id for run_id in stuck if coordinator.force_fail_stuck(conn, run_id)]
        due = sweep_due(conn, modulus, owned, self._settings.sweep_grace_s, limit)
        return SweepResult(overdue=[run_id for run_id, _tier in due], force_failed=failed)

    def _apply(self, result: SweepResult) -> None:
        stats = self._processor.stats
        if result.error is not None:
            stats.errors[type(result.error).__name__] += 1
            log.error("watchdog sweep failed: %s", result.error)
            return
        for run_id in result.force_failed:
            stats.force_fails["stuck"] += 1
            stats.ticks[Outcome.FORCE_FAILED] += 1
            log.warning(
                "run %s force-failed: stuck", run_id, extra={"run_id": run_id, "reason": "stuck"}
            )
        topic = self._processor.names.wakeup("t2")
        now_ms = int(time.time() * 1000)
        for run_id in result.overdue:
            wakeup = Wakeup(run_id=run_id, reason="sweep", produced_at=now_ms)
            partition = partition_for(run_id, self._processor.partitions[topic])
            self._processor.outbox.send(topic, wakeup.encode(), wakeup.key(), self._sent, partition)
        self.rewoken += len(result.overdue)
        if result.overdue:
            log.info("watchdog re-woke %d overdue run(s)", len(result.overdue))

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _sent(self, err: object) -> None:
        if err is not None:
            # The run stays overdue, so the next sweep sends it again.
            self._processor.stats.errors["produce"] += 1
            log.error("watchdog wakeup not delivered: %s", err)
