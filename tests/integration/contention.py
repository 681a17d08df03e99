"""A competing writer of a run row, and the livelock it drives a processor into."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import psycopg.sql

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.telemetry.setup import Telemetry

from .instances import ProcessorThread
from .runs import run_statuses
from .samples import now_ms, produce_wakeups, sample_workflow
from .waiting import wait_for

# The writer's loop runs inside Postgres, in one session per writer: each pass bumps the
# version, holds the row lock 20 ms and commits. The other writer's UPDATE is already queued on
# the lock when one commits, so the lock passes from one to the other with no gap a commit of
# ours could land in (a loop in Python left gaps: under load its thread missed its turn, a
# first tick committed in the gap, and the run then waited for a worker forever).
_WRITER_LOOP = """
DO $$
DECLARE
    moved int;
BEGIN
    LOOP
        UPDATE eec_workflow_run SET db_record_version = db_record_version + 1
         WHERE run_id = {run_id} AND status IN ('pending', 'running');
        GET DIAGNOSTICS moved = ROW_COUNT;
        EXIT WHEN moved = 0;  -- the run ended
        PERFORM pg_sleep(0.02);
        COMMIT;
    END LOOP;
END $$
"""


class OutsideWriter:
    """Keeps bumping a run's version the way a competing writer would, in transactions that
    hold the row lock. Two sessions take turns, so the lock is never free: each of our commits
    finds the row held by a writer that moves it, or matches no row, and loses the race."""

    def __init__(self, dsn: str, run_id: str) -> None:
        self._dsn = dsn
        self._run_id = run_id
        self._watch = psycopg.connect(dsn, autocommit=True)
        self._first_version = self._version()
        self._pids: list[int] = []
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(2)]
        for thread in self._threads:
            thread.start()

    def _version(self) -> int:
        row = self._watch.execute(
            "SELECT db_record_version FROM eec_workflow_run WHERE run_id = %s", (self._run_id,)
        ).fetchone()
        return 0 if row is None else int(row[0])

    @property
    def writes(self) -> int:
        """The versions the writers moved the row by so far."""
        return self._version() - self._first_version

    def _loop(self) -> None:
        loop = psycopg.sql.SQL(_WRITER_LOOP).format(run_id=psycopg.sql.Literal(self._run_id))
        with psycopg.connect(self._dsn, autocommit=True) as conn:
            self._pids.append(conn.info.backend_pid)
            with contextlib.suppress(psycopg.errors.QueryCanceled):  # stopped
                conn.execute(loop)

    def stop(self) -> None:
        """Cancel both loops (again, should one have started after the first cancel)."""
        deadline = time.monotonic() + 10
        while any(t.is_alive() for t in self._threads) and time.monotonic() < deadline:
            for pid in list(self._pids):
                self._watch.execute("SELECT pg_cancel_backend(%s)", (pid,))
            for thread in self._threads:
                thread.join(0.2)
        self._watch.close()


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
