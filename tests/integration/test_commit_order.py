"""The batched commit locks its rows in run_id order before it updates any: two instances that
commit overlapping batches, each listing the runs in its own order, never deadlock."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.decide import Commit
from processor.core.model import LoadedRun
from processor.io import connections, store
from processor.io.config import Settings
from processor.io.runs_admin import insert_runs

from .conftest import sample_workflow

pytestmark = pytest.mark.integration

RUNS = 3000
ROUNDS = 6


def _batch(conn: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, str]:
    """Parameters of the commit statement moving each run one seq on from what its row holds
    now (at that version), listed in the given order."""
    loaded = store.load_runs(conn, store.Definitions(), run_ids)
    rows = []
    for run_id in run_ids:
        run = loaded[run_id]
        assert isinstance(run, LoadedRun)
        state = replace(run.state, seq=run.state.seq + 1)
        rows.append(store._commit_row(Commit(run_id, run.version, state, ())))
    return {
        "ids": orjson.dumps(run_ids).decode(),
        "batch": orjson.dumps(rows).decode(),
        "acked": "[]",
        "owner": "test",
    }


def test_overlapping_batches_in_opposite_orders_never_deadlock(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"order-{tag}-{i:04}" for i in range(RUNS)]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in run_ids], "t1")
    orders = [run_ids, list(reversed(run_ids))]
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def committer(order: list[str]) -> None:
        with connections.connect(settings.pg_dsn) as conn:
            for _ in range(ROUNDS):
                params = _batch(conn, order)  # both load the same versions, then race
                try:
                    start.wait(30)
                    # The raw statement: commit_batch would absorb a deadlock as conflicts.
                    conn.execute(store._COMMIT_SQL, params).fetchall()
                except BaseException as exc:
                    errors.append(exc)
                    start.abort()
                    return

    threads = [threading.Thread(target=committer, args=(order,)) for order in orders]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not [e for e in errors if isinstance(e, psycopg.errors.DeadlockDetected)], errors
    assert not errors, errors
    # Each round one of the two won every row and the other conflicted on all of them.
    versions = pg.execute(
        "SELECT DISTINCT db_record_version FROM eec_workflow_run WHERE run_id = ANY(%s)",
        (run_ids,),
    ).fetchall()
    assert versions == [(1 + ROUNDS,)]
