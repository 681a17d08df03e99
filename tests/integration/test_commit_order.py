"""The batched commit locks its rows in run_id order before it updates any, skipping rows another
transaction holds: two instances that commit overlapping batches, each listing the runs in its
own order, never deadlock, and every row moves exactly once per round."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.core.model import LoadedRun
from processor.core.plans import Commit
from processor.io.config.settings import Settings
from processor.io.postgres import commit_sql, connections, store
from processor.io.postgres.runs_admin import insert_runs

from .samples import sample_workflow

pytestmark = pytest.mark.integration

RUNS = 3000
ROUNDS = 6


def _batch(conn: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, Any]:
    """Parameters of the commit statement moving each run one seq on from what its row holds
    now (at that version), listed in the given order."""
    loaded = store.load_runs(conn, store.Definitions(), run_ids)
    commits = []
    for run_id in run_ids:
        run = loaded[run_id]
        assert isinstance(run, LoadedRun)
        state = replace(run.state, seq=run.state.seq + 1)
        commits.append(Commit(run_id, run.version, state, ()))
    return store.commit_params(commits, (), "test")


def test_overlapping_batches_in_opposite_orders_never_deadlock(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"order-{tag}-{i:04}" for i in range(RUNS)]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in run_ids], "t1")
    orders = [run_ids, list(reversed(run_ids))]
    errors: list[BaseException] = []
    moved: list[list[str]] = [[], []]  # the runs each committer moved, round after round
    start = threading.Barrier(2)

    def committer(side: int) -> None:
        order = orders[side]
        with connections.connect(settings.pg_dsn) as conn:
            for _ in range(ROUNDS):
                params = _batch(conn, order)  # both load the same versions, then race
                try:
                    start.wait(30)
                    # The raw statement: any error at all must surface here.
                    rows = conn.execute(commit_sql.COMMIT_SQL, params).fetchall()
                except BaseException as exc:
                    errors.append(exc)
                    start.abort()
                    return
                moved[side] += [run_id for run_id, updated in rows if updated]

    threads = [threading.Thread(target=committer, args=(side,)) for side in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert not any(t.is_alive() for t in threads)
    assert not [e for e in errors if isinstance(e, psycopg.errors.DeadlockDetected)], errors
    assert not errors, errors
    # Each row moved once for every commit that says it moved it, never more, and at least
    # one of the two moved it in most rounds (a round in which both loaded a stale version
    # moves nothing: both retry, as conflicts and as locked runs).
    times = Counter(moved[0] + moved[1])
    versions = dict(
        pg.execute(
            "SELECT run_id, db_record_version FROM eec_workflow_run WHERE run_id = ANY(%s)",
            (run_ids,),
        ).fetchall()
    )
    assert versions == {run_id: 1 + times[run_id] for run_id in run_ids}
    assert sum(times.values()) >= RUNS * ROUNDS // 2


def test_commits_and_result_inserts_on_the_same_runs_never_wait_on_each_other(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    """A worker's transaction that records results in descending run order, while batched
    commits lock the same rows in ascending order: a result insert takes no lock on its run's
    row (no foreign key), so nothing deadlocks, no commit finds a row held, no insert waits."""
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"keys-{tag}-{i:03}" for i in range(200)]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in run_ids], "t1")
    errors: list[BaseException] = []
    held: list[str] = []
    inserting = threading.Event()
    done = threading.Event()

    def recorder() -> None:
        try:
            with connections.connect(settings.pg_dsn) as conn, conn.transaction():
                for i, run_id in enumerate(reversed(run_ids)):
                    conn.execute(
                        "INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)"
                        " VALUES (%s, 'a', 1, 'succeeded', 'null')",
                        (run_id,),
                    )
                    if i == 100:
                        inserting.set()  # half the runs' rows are key-share locked now
                        assert done.wait(60)
        except BaseException as exc:
            errors.append(exc)
            inserting.set()

    thread = threading.Thread(target=recorder)
    thread.start()
    try:
        assert inserting.wait(30)
        with connections.connect(settings.pg_dsn) as conn:
            for _ in range(3):
                params = _batch(conn, run_ids)
                rows = conn.execute(commit_sql.COMMIT_SQL, params).fetchall()
                held += [run_id for run_id, updated in rows if not updated]
                assert {run_id for run_id, updated in rows if updated} == set(run_ids)
    finally:
        done.set()
        thread.join(60)
    assert not errors, errors
    assert not held
    recorded = pg.execute(
        "SELECT count(*) FROM eec_step_result WHERE run_id = ANY(%s)", (run_ids,)
    ).fetchone()
    assert recorded == (len(run_ids),)
