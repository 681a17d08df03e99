"""The coordinator's batched statements find their runs through the primary key, whatever the
size of the run table and of the batch, and whatever the statistics say of the step results:
Postgres's plans for them, asked with EXPLAIN (no timing is asserted; the plan's shape is what
made a batch of a few runs cost milliseconds when it scanned a table of a few thousand, and a
load cost seconds when it scanned the step results once per run)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.model import StepOutcome
from processor.core.plans import Commit
from processor.core.run_state import initial_state
from processor.core.step_task import StepData, StepTask
from processor.io.config.settings import Settings
from processor.io.postgres import (
    commit_sql,
    connections,
    load_sql,
    outbox,
    step_attempts,
    step_data,
    store,
    sweeps,
    worker_registry,
)
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow

from .samples import sample_workflow

pytestmark = pytest.mark.integration

RUNS = 4000


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def _top(document: Any) -> dict[str, Any]:
    """EXPLAIN (FORMAT JSON)'s one document (a list, or its text where no loader parsed it)."""
    (top,) = document if isinstance(document, list) else orjson.loads(document)
    return dict(top)


def _explained(conn: psycopg.Connection[Any], sql: str, params: Any) -> dict[str, Any]:
    """The plan Postgres makes for ``sql`` (not run)."""
    row = conn.execute(b"EXPLAIN (FORMAT JSON) " + sql.encode(), params).fetchone()
    assert row is not None
    return _top(row[0])


def _scans(conn: psycopg.Connection[Any], sql: str, params: Any) -> list[tuple[str, str, bool]]:
    """(node type, relation, whole) of every scan of a table in the plan of ``sql``; whole:
    it reads every row, a sequential scan or an index scan without a condition (a plan made
    while the statistics said the table was empty scans the whole index once and keeps it,
    instead of looking each key up)."""
    top = _explained(conn, sql, params)
    plans = [top["Plan"], *top.get("InitPlan", [])]
    return [
        (
            node["Node Type"],
            node["Relation Name"],
            node["Node Type"] == "Seq Scan"
            or ("Index" in node["Node Type"] and "Index Cond" not in node),
        )
        for plan in plans
        for node in _plan_nodes(plan)
        if "Relation Name" in node
    ]


def _assert_by_key(conn: psycopg.Connection[Any], sql: str, params: Any) -> None:
    scans = _scans(conn, sql, params)
    assert scans, f"no table in the plan of {sql.split()[0:4]}"
    whole_table = [s for s in scans if s[2]]
    assert not whole_table, f"{sql.split()[0:4]} scans whole tables: {scans}"


@pytest.mark.parametrize("batch", [1, 8, 500])
@pytest.mark.parametrize("statistics", ["of the rows", "of empty tables"])
def test_load_and_commit_reach_their_runs_by_key(
    pg: psycopg.Connection[Any], base_settings: Settings, batch: int, statistics: str
) -> None:
    wf = sample_workflow()
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"plan-{tag}-{i}" for i in range(RUNS)]

    def fill() -> None:
        for start in range(0, RUNS, 2000):
            insert_runs(pg, wf, [(r, {}) for r in run_ids[start : start + 2000]], "t1")
        # An outbox as a busy instance has one: a row per transition not yet acknowledged.
        pg.execute(
            "INSERT INTO eec_outbox (run_id, seq, records)"
            " SELECT run_id, 1, '[]'::jsonb FROM eec_workflow_run"
        )

    fill()
    if statistics == "of empty tables":
        # A quiet system the retention sweep emptied, analysed, then a burst of runs planned
        # for before the next autoanalyze.
        pg.execute("DELETE FROM eec_outbox")
        pg.execute("DELETE FROM eec_workflow_run")
    pg.execute("VACUUM ANALYZE eec_workflow_run")
    pg.execute("VACUUM ANALYZE eec_outbox")
    if statistics == "of empty tables":
        fill()
    # No step results yet (as when the runs have only just started): a plan made now (and
    # kept: the processor's statements are prepared) must still reach the step results by
    # key, since the table fills while the plan lives.
    pg.execute("DELETE FROM eec_step_result")
    pg.execute("VACUUM ANALYZE eec_step_result")
    some = run_ids[:batch]
    ids = orjson.dumps(some).decode()
    state = replace(initial_state(wf), seq=1)
    commits = [Commit(r, 1, state) for r in some]
    params = store.commit_params(commits, [(r, 1) for r in some], "test")
    statements = (
        (load_sql.LOAD_SQL, (load_sql.INPUT_LOAD_BYTES, ids)),
        (commit_sql.COMMIT_SQL, params),
        (outbox.DELETE_OUTBOX_SQL, {"acked": params["acked"]}),
    )
    with connections.connect(base_settings.pg_dsn) as coordinator:  # as the processor's own
        for sql, args in statements:
            _assert_by_key(coordinator, sql, args)


@pytest.mark.parametrize("batch", [1, 40, 500])
def test_the_workers_statements_reach_their_rows_by_key(
    pg: psycopg.Connection[Any], base_settings: Settings, batch: int
) -> None:
    """The worker's claim, result insert and stale check, planned while the statistics say
    the step results and attempts are empty (a quiet system whose rows the retention sweep
    deleted, then analysed): measured, the claim planned then read the whole attempt index
    on every statement as the table refilled, 330 µs per task instead of 15, until the next
    autoanalyze made it plan again."""
    wf = sample_workflow()
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"plan-{tag}-{i}" for i in range(RUNS)]
    # Tables that had rows, emptied and analysed: the statistics say empty, the files are not.
    for start in range(0, RUNS, 2000):
        insert_runs(pg, wf, [(r, {}) for r in run_ids[start : start + 2000]], "t1")
    pg.execute(
        "INSERT INTO eec_step_attempt (run_id, node_id, attempt, worker_id)"
        " SELECT run_id, 's0', 1, 'gone' FROM eec_workflow_run"
    )
    for table in ("eec_step_attempt", "eec_step_result", "eec_workflow_run"):
        pg.execute(f"DELETE FROM {table}")
        pg.execute(f"VACUUM ANALYZE {table}")
    # Then a burst of runs, planned for before the next autoanalyze.
    for start in range(0, RUNS, 2000):
        insert_runs(pg, wf, [(r, {}) for r in run_ids[start : start + 2000]], "t1")
    some = run_ids[:batch]
    tasks = [
        StepTask(r, "s1", 1, "fast", 2**62, dep_attempts=(("s0", 1),), data=None) for r in some
    ]
    claim = step_attempts.claim_params(
        tasks, "me", max_starts=2, may_judge=True, gone_after_s=10.0, seqs=range(batch)
    )
    rows = [
        step_data.StepResultRow(r, "s1", 1, StepOutcome.SUCCEEDED, {}, None, True) for r in some
    ]
    tagged = [row._replace(tags={"customer": "c-42"}) for row in rows]
    statements = (
        (step_attempts._CLAIM_SQL, claim),
        (step_attempts._CLAIM_SQL, {**claim, "reruns": True}),
        (step_data._INSERT_RESULTS_SQL, {"results": step_data.results_param(rows), "me": "w"}),
        (
            step_data._INSERT_TAGGED_RESULTS_SQL,
            {"results": step_data.results_param(tagged), "me": "w"},
        ),
        (step_attempts._NOT_CURRENT_SQL, (step_attempts.attempts_param([t.key for t in tasks]),)),
    )
    with connections.connect_durable(base_settings.pg_dsn) as worker:  # as the worker's own
        for sql, args in statements:
            _assert_by_key(worker, sql, args)


@pytest.mark.parametrize("carried", [True, False])
def test_a_claim_reads_the_data_only_of_tasks_that_do_not_carry_it(
    pg: psycopg.Connection[Any], base_settings: Settings, carried: bool
) -> None:
    """Tasks the coordinator sent with their data: the claim takes them without reading any
    (pulled up into a join, the data of every task was read, then dropped by the join's
    filter). Tasks without: it reads theirs (the same plan, so this test can fail)."""
    wf = sample_workflow()
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"plan-data-{tag}-{i}" for i in range(20)]
    register_workflow(pg, wf)
    insert_runs(pg, wf, [(r, {}) for r in run_ids], "t1")
    pg.execute(
        "UPDATE eec_workflow_run SET status = 'running', node_states = jsonb_set(node_states,"
        """ '{fetch}', '{"status": "dispatched", "attempt": 1}') WHERE run_id = ANY(%s)""",
        (run_ids,),
    )
    data = StepData({}, {}) if carried else None
    tasks = [StepTask(r, "fetch", 1, "fast", 2**62, data=data) for r in run_ids]
    claim = step_attempts.claim_params(
        tasks, f"me-{tag}", max_starts=2, may_judge=True, gone_after_s=10.0, seqs=range(1, 21)
    )
    # EXPLAIN ANALYZE runs the claim: rolled back after.
    with connections.connect_durable(base_settings.pg_dsn) as worker, worker.transaction():
        row = worker.execute(
            b"EXPLAIN (ANALYZE, FORMAT JSON) " + step_attempts._CLAIM_SQL.encode(), claim
        ).fetchone()
        taken = worker.execute(
            "SELECT count(*) FROM eec_step_attempt WHERE worker_id = %s", (f"me-{tag}",)
        ).fetchone()
        raise psycopg.Rollback()
    assert row is not None and taken == (20,)
    top = _top(row[0])
    nodes = [n for plan in [top["Plan"], *top.get("InitPlan", [])] for n in _plan_nodes(plan)]
    # Tasks without dependencies are read by their definition: one lookup per task read.
    definition_reads = sum(
        n["Actual Loops"] for n in nodes if n.get("Relation Name") == "eec_workflow_definition"
    )
    assert definition_reads == (0 if carried else 20)


def _index_of(conn: psycopg.Connection[Any], sql: str, params: Any, table: str) -> set[str]:
    """The indexes through which the plan of ``sql`` reads ``table``."""
    top = _explained(conn, sql, params)
    plans = [top["Plan"], *top.get("InitPlan", [])]
    return {
        node.get("Index Name", node["Node Type"])
        for plan in plans
        for node in _plan_nodes(plan)
        if node.get("Relation Name") == table and node["Node Type"] != "ModifyTable"
    }


@pytest.mark.parametrize("statistics", ["of the rows", "of empty tables"])
def test_the_sweeps_walk_their_index_and_reach_the_marks_by_key(
    pg: psycopg.Connection[Any], base_settings: Settings, statistics: str
) -> None:
    """The overdue and stuck sweeps read the live runs through their partial indexes, in
    order, and reach each run's re-wake mark and quarantine flag (tables of their own since
    the run row has one writer) through their primary keys: never a scan of a whole table,
    however many marks and flags there are."""
    wf = sample_workflow()
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"sweep-{tag}-{i}" for i in range(RUNS)]

    def fill() -> None:
        for start in range(0, RUNS, 2000):
            insert_runs(pg, wf, [(r, {}) for r in run_ids[start : start + 2000]], "t1")
        # Every run overdue and stuck, re-woken long ago; a tenth of them quarantined.
        pg.execute(
            "UPDATE eec_workflow_run SET next_wakeup_at = now() - interval '1 hour',"
            " last_transition_at = now() - interval '2 hours'"
        )
        pg.execute(
            "INSERT INTO eec_run_rewake (run_id, rewoken_at)"
            " SELECT run_id, now() - interval '3 hours' FROM eec_workflow_run"
        )
        pg.execute(
            "INSERT INTO eec_run_quarantine (run_id, run_version, quarantined_at, reason)"
            " SELECT run_id, db_record_version, now(), 'x' FROM eec_workflow_run"
            " WHERE right(run_id, 1) = '7'"
        )

    tables = ("eec_workflow_run", "eec_run_rewake", "eec_run_quarantine")
    fill()
    if statistics == "of empty tables":
        for table in tables:
            pg.execute(f"DELETE FROM {table}")
    for table in tables:
        pg.execute(f"VACUUM ANALYZE {table}")
    if statistics == "of empty tables":
        fill()
    shards = {"modulus": 3, "shards": [0, 1, 2], "limit": 100}
    overdue = (sweeps._REWAKE_DUE_SQL, {**shards, "grace_s": 2.0})
    stuck = (sweeps._STUCK_SQL, {**shards, "stuck_s": 3600.0, "grace_s": 2.0})
    marks = (sweeps._MARK_SQL, (orjson.dumps(run_ids[:100]).decode(),))
    with connections.connect(base_settings.pg_dsn) as coordinator:  # as the processor's own
        for sql, args in (overdue, stuck, marks):
            _assert_by_key(coordinator, sql, args)
        assert _index_of(coordinator, *overdue, "eec_workflow_run") == {"eec_workflow_run_due_idx"}
        assert _index_of(coordinator, *stuck, "eec_workflow_run") == {"eec_workflow_run_stuck_idx"}
        for sql, args in (overdue, stuck):
            for table in ("eec_run_rewake", "eec_run_quarantine"):
                assert _index_of(coordinator, sql, args, table) == {f"{table}_pkey"}, table


def _jit_planned(conn: psycopg.Connection[Any], sql: str, params: Any) -> bool:
    """Whether Postgres would compile ``sql`` with JIT (its plan's "JIT" part; not run)."""
    return "JIT" in _explained(conn, sql, params)


def test_no_statement_of_the_coordinator_is_compiled_with_jit(base_settings: Settings) -> None:
    """The registry's served versions (read when a run starts, once a second) have no index
    to use: with ``enable_seqscan = off`` the planner adds 1e10 to the scan's cost, far above
    ``jit_above_cost``, and a Postgres with JIT compiled that 1 ms statement for 100-300 ms
    each time (idle start-to-first-dispatch p99 150-250 ms in `make bench-latency`). The
    connections of the processor and the worker say ``jit = off``."""
    statement, params = worker_registry.SERVED_VERSIONS_SQL, (30.0,)
    with psycopg.connect(base_settings.pg_dsn, autocommit=True) as plain:
        (available,) = plain.execute("SELECT pg_jit_available()").fetchone() or (False,)
        if not available:
            pytest.skip("this Postgres has no JIT")
        plain.execute("SET enable_seqscan = off")
        assert _jit_planned(plain, statement, params)  # the case this test guards is real
    with connections.connect(base_settings.pg_dsn) as conn:
        assert not _jit_planned(conn, statement, params)
    with connections.connect_durable(base_settings.pg_dsn) as conn:
        assert not _jit_planned(conn, statement, params)
