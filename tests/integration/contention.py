"""A competing writer of a run row, and the livelock it drives a processor into."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import psycopg

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.telemetry.setup import Telemetry

from .instances import ProcessorThread
from .runs import run_statuses
from .samples import now_ms, produce_wakeups, sample_workflow
from .waiting import wait_for


class OutsideWriter:
    """Keeps bumping a run's version the way a competing writer would, in transactions that
    hold the row lock. Two connections take turns, so the lock is almost never free: each of
    our commits finds the row held by a writer that moves it, or matches no row, and loses the
    race, but for the rare instant between two writers' locks (a first tick landed there once
    in CI: test_business_metrics allows for it)."""

    def __init__(self, dsn: str, run_id: str) -> None:
        self.writes = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(dsn, run_id), daemon=True) for _ in range(2)
        ]
        for thread in self._threads:
            thread.start()

    def _loop(self, dsn: str, run_id: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                with conn.transaction():
                    cur = conn.execute(
                        "UPDATE eec_workflow_run SET db_record_version = db_record_version + 1"
                        " WHERE run_id = %s AND status IN ('pending', 'running')",
                        (run_id,),
                    )
                    if cur.rowcount == 0:
                        return  # the run ended
                    conn.execute("SELECT pg_sleep(0.02)")
                self.writes += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


def drive_into_livelock(
    settings: Settings,
    pg: psycopg.Connection[Any],
    start_processor: Callable[..., ProcessorThread],
    telemetry: Telemetry | None = None,
) -> tuple[str, ProcessorThread]:
    """Start a run, make every commit of it lose to an outside writer, and wait until the
    processor force-fails it for livelock. Returns the run id and the processor."""
    run_id = f"livelock-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    writer = OutsideWriter(settings.pg_dsn, run_id)
    wait_for(lambda: writer.writes > 0, 10, "the outside writer to start")
    instance = start_processor(settings, telemetry)
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    try:
        produce_wakeups(settings, [(topic, Wakeup(run_id, "start", produced_at=now_ms()), None)])
        wait_for(
            lambda: run_statuses(pg, [run_id])[run_id] == "failed", 60, "the livelock force-fail"
        )
    finally:
        writer.stop()
    wait_for(lambda: instance.stats.ticks["force_failed"] == 1, 10, "the force-fail to be counted")
    return run_id, instance
