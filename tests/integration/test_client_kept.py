"""What the client keeps between calls (processor/client/kept.py) and how it waits for a run
(told by the run's end, schemas/migrations/0040_run_ended_notify.sql), on the real services."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from processor import client
from processor.client import kept, reads
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs

from .samples import sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh_keep() -> Iterator[None]:
    kept.forget_all()
    yield
    kept.forget_all()


def _client_sessions(pg: psycopg.Connection[Any]) -> list[int]:
    """The backends of this database other than the test's own."""
    rows = pg.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
        " AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    ).fetchall()
    return [int(pid) for (pid,) in rows]


def test_successive_calls_share_one_connection(
    settings: Settings, pg: psycopg.Connection[Any], fresh_keep: None
) -> None:
    """Starting runs, reading them and signalling them one call at a time goes through one
    session, kept open between the calls, not one per call."""
    run_ids = [f"kept-{i}-{time.monotonic_ns()}" for i in range(3)]
    client.start_run(settings, "sample", run_ids[0])
    first = _client_sessions(pg)
    assert len(first) == 1
    for run_id in run_ids:
        client.start_run(settings, "sample", run_id)
        client.get_run(settings, run_id)
        client.send_signal(settings, run_id)  # a cancel
    assert _client_sessions(pg) == first


def test_a_kept_connection_the_server_ended_is_replaced(
    settings: Settings, pg: psycopg.Connection[Any], fresh_keep: None
) -> None:
    """A Postgres restart (here: the kept session terminated) costs the next call a new
    connection, not an error."""
    run_id = f"cut-{time.monotonic_ns()}"
    client.start_run(settings, "sample", run_id)
    [pid] = _client_sessions(pg)
    pg.execute("SELECT pg_terminate_backend(%s)", (pid,))
    wait_for(
        lambda: (
            pg.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
            == (0,)
        ),
        10,
        "the kept session to end",
    )
    assert client.get_run(settings, run_id).run_id == run_id


def test_a_wait_is_told_of_the_end(
    settings: Settings,
    pg: psycopg.Connection[Any],
    fresh_keep: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The run ends after the wait read it: the wait returns on the notification, long before
    it would have read the row again (its re-read pushed out to a minute here)."""
    monkeypatch.setattr(reads, "RECHECK_S", 60.0)
    run_id = f"told-{time.monotonic_ns()}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")

    def end_once_waiting() -> None:
        # The wait listens, then reads the row, then waits to be told: end the run only once
        # its session is idle after that read.
        wait_for(
            lambda: (
                pg.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND state = 'idle'"
                    " AND query LIKE 'SELECT status, output, failure_reason%%'"
                ).fetchone()
                == (1,)
            ),
            30,
            "the wait to have read the row",
        )
        pg.execute("UPDATE eec_workflow_run SET status = 'cancelled' WHERE run_id = %s", (run_id,))

    ender = threading.Thread(target=end_once_waiting)
    ender.start()
    started = time.monotonic()
    result = client.wait_for_run(settings, run_id, timeout_s=120)
    waited = time.monotonic() - started
    ender.join(30)
    assert result.status.value == "cancelled"
    assert waited < reads.RECHECK_S  # told, not found by the next read a minute later


def test_only_a_runs_end_notifies(pg: psycopg.Connection[Any], settings: Settings) -> None:
    """The trigger tells the end of a run (whatever wrote it) and nothing else."""
    run_id = f"notify-{time.monotonic_ns()}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    with psycopg.connect(settings.pg_dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {reads.ENDED_CHANNEL}")

        def told() -> list[str]:
            return [n.payload for n in listener.notifies(timeout=0.5)]

        for status in ("running", "failed", "failed"):
            pg.execute(
                "UPDATE eec_workflow_run SET status = %s WHERE run_id = %s", (status, run_id)
            )
        assert told() == [run_id]
