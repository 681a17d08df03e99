"""What a run costs the coordinator does not grow with what the run accumulated, on the real
services: every write of a map run's state is as small for a list of 300 items as for one of
20 (its items in flight only: the map's output is still every item's, in order); a load reads
the rows a tick can use, not every signal or step result the run ever got (the rows its plan
read, asked with EXPLAIN ANALYZE); admitting a dispatch under the largest rate limit over the
longest window reads and writes a few small rows, not the window (docs/performance.md,
"Bounded costs")."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import orjson
import psycopg
import pytest

from processor import StepContext, StepRegistry
from processor.core.decide import tick_batch
from processor.core.model import LoadedRun
from processor.core.routing import TopicNames
from processor.core.run_state import NodeStatus
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres import limit_store, load_sql, store
from processor.io.postgres.runs_admin import insert_runs, insert_signal
from processor.io.postgres.workflows import register_workflow

from .audit import assert_transitions_applied_once
from .children import run_ductor
from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

NAMES = TopicNames("test-costs")


def _commit_ticks(pg: psycopg.Connection[Any], run_ids: list[str]) -> None:
    """One tick of each run through the commit path's own functions (no broker needed)."""
    loaded, now = store.load_runs_at(pg, store.Definitions(), run_ids)
    commits = tick_batch(loaded, now, NAMES, limit_store.load_limits(pg, loaded))
    answer = store.commit_batch(pg, list(commits.values()), (), "test-costs")
    assert answer.committed == set(commits), answer


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def _rows_read(pg: psycopg.Connection[Any], sql: str, params: Any) -> dict[str, int]:
    """The rows each table's scans read running ``sql`` (kept or filtered out), by table."""
    row = pg.execute(b"EXPLAIN (ANALYZE, FORMAT JSON) " + sql.encode(), params).fetchone()
    assert row is not None
    (top,) = row[0] if isinstance(row[0], list) else orjson.loads(row[0])
    read: dict[str, int] = {}
    for node in _plan_nodes(top["Plan"]):
        if "Relation Name" in node:
            rows = node["Actual Rows"] + node.get("Rows Removed by Filter", 0)
            table = node["Relation Name"]
            read[table] = read.get(table, 0) + rows * node["Actual Loops"]
    return read


def test_a_maps_state_writes_are_as_small_for_a_long_list_as_for_a_short_one(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    workflow = f"shout-{uuid.uuid4().hex[:6]}"
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": workflow,
                "version": 1,
                "steps": [{"name": "m", "kind": "map", "type": "shout", "parallelism": 8}],
                "output": "m",
            }
        ),
    )
    registry = StepRegistry()

    @registry.step("shout")
    def shout(ctx: StepContext) -> str:
        return f"{ctx.item}!"

    lists = {"short": 20, "long": 300}
    processor_thread(settings)
    worker = WorkerThread(settings, registry, threads=8)
    try:
        for run_id, count in lists.items():
            started = run_ductor(
                settings,
                "start",
                workflow,
                "--run-id",
                run_id,
                "--input",
                orjson.dumps([f"w{i}" for i in range(count)]).decode(),
            )
            assert started.returncode == 0, started.stderr
        wait_for(lambda: count_terminal(pg, list(lists)) == 2, 120, "both maps to end")
    finally:
        worker.stop()
    assert run_statuses(pg, list(lists)) == {"short": "succeeded", "long": "succeeded"}
    for run_id, count in lists.items():
        output = orjson.loads(run_ductor(settings, "result", run_id).stdout)
        assert output == [f"w{i}!" for i in range(count)]
    largest = dict(
        pg.execute(
            "SELECT run_id, max(octet_length(new_nodes::text)) FROM test_run_audit GROUP BY run_id"
        ).fetchall()
    )
    # Eight items in flight at most, whatever the list: each write of the long map's state is
    # no larger than the short one's (a few bytes more for three-digit indices). Its items
    # that succeeded were recorded apart, one row each.
    assert largest["long"] <= largest["short"] * 1.2, largest
    recorded = pg.execute(
        "SELECT count(*) FROM eec_map_item WHERE run_id = 'long' AND node = 'm'"
    ).fetchone()
    assert recorded == (300,)
    inspected = run_ductor(settings, "inspect", "long").stdout
    assert "m[299]" in inspected and "m[0]  " in inspected  # every item shown
    assert_transitions_applied_once(pg)


def _waiting(pg: psycopg.Connection[Any]) -> tuple[WorkflowDef, str]:
    """A run at a wait step (for the signal ``go``) beside a map of 3,000 items, two in
    flight, committed through the commit path."""
    wf = parse_workflow(
        {
            "name": f"approve-{uuid.uuid4().hex[:6]}",
            "version": 1,
            "steps": [
                {"name": "approve", "kind": "wait", "signal": "go"},
                {"name": "ship", "type": "fast", "depends_on": ["approve"]},
                {"name": "m", "kind": "map", "type": "fast", "parallelism": 2,
                 "max_items": 10_000},
            ],
        }
    )  # fmt: skip
    register_workflow(pg, wf)
    run_id = f"waiting-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, wf, [(run_id, list(range(3000)))], "t1")
    _commit_ticks(pg, [run_id])
    return wf, run_id


def test_a_load_reads_what_the_tick_can_use_not_every_signal_and_result_of_the_run(
    pg: psycopg.Connection[Any],
) -> None:
    wf, run_id = _waiting(pg)
    params = (load_sql.INPUT_LOAD_BYTES, orjson.dumps([run_id]).decode())
    few = _rows_read(pg, load_sql.LOAD_SQL, params)
    # What a run may accumulate: signals of names nothing waits for, and the results of its
    # map's items that left the state (and late ones of an item's attempts gone by).
    pg.execute(
        "INSERT INTO eec_run_signal (run_id, signal_id, kind)"
        " SELECT %s, 'noise-' || i, 'noise' FROM generate_series(1, 3000) i",
        (run_id,),
    )
    pg.execute(
        "INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)"
        " SELECT %s, 'm[' || i || ']', 1, 'succeeded', '{}' FROM generate_series(2, 2999) i",
        (run_id,),
    )
    pg.execute(
        "INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, error)"
        " SELECT %s, 'm[0]', i, 'failed', 'late' FROM generate_series(2, 1001) i",
        (run_id,),
    )
    many = _rows_read(pg, load_sql.LOAD_SQL, params)
    # The cancel check, and the first signal of the one name the run waits for: none yet.
    assert many.get("eec_run_signal", 0) <= 3, many
    assert many.get("eec_step_result", 0) <= few.get("eec_step_result", 0) + 2, (few, many)
    # Its signal comes, after all the others: the load finds it, and the step ends with it.
    assert insert_signal(pg, run_id, "go-1", "go", {"ok": True})
    pg.execute(
        "INSERT INTO eec_run_signal (run_id, signal_id, kind)"
        " SELECT %s, 'go-late-' || i, 'go' FROM generate_series(1, 3000) i",
        (run_id,),
    )
    assert _rows_read(pg, load_sql.LOAD_SQL, params).get("eec_run_signal", 0) <= 4
    _commit_ticks(pg, [run_id])
    loaded = store.load_runs(pg, store.Definitions(), [run_id])[run_id]
    assert isinstance(loaded, LoadedRun)
    assert loaded.state.node("approve").status is NodeStatus.SUCCEEDED
    assert loaded.state.node("ship").status is NodeStatus.DISPATCHED
    output = pg.execute(
        "SELECT output FROM eec_step_result WHERE run_id = %s AND node_id = 'approve'"
        " AND attempt = 1",
        (run_id,),
    ).fetchone()
    assert output == ({"ok": True},)  # the first of its name, not a later one
    assert loaded.wf == wf


def test_admitting_under_the_largest_rate_limit_writes_a_row_not_its_window(
    pg: psycopg.Connection[Any],
) -> None:
    limit, week_ms = 100_000, 604_800_000
    name = f"api-{uuid.uuid4().hex[:6]}"
    wf = parse_workflow(
        {
            "name": name,
            "version": 1,
            "steps": [
                {
                    "name": "call",
                    "type": "fast",
                    "rate_limit": {"limit": limit, "per_s": week_ms // 1000, "name": name},
                }
            ],
        }
    )
    register_workflow(pg, wf)
    key = f"r/{name}"
    row = pg.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()
    assert row is not None
    now = int(row[0])
    # A full window: the oldest dispatch just out of it, the others in it.
    times = [now - week_ms - 1_000, *(now - week_ms // 2 + i for i in range(limit - 1))]
    pg.execute("INSERT INTO eec_limit (key, version, recent) VALUES (%s, 1, %s)", (key, times))
    has_rows = pg.execute("SELECT to_regclass('eec_limit_rate')").fetchone() != (None,)
    if has_rows:  # where the dispatches are rows (migration 0020), they are those
        pg.execute(
            "INSERT INTO eec_limit_rate (key, seq, at_ms)"
            " SELECT %s, i - 1, t FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(t, i)",
            (key, times),
        )
        pg.execute("UPDATE eec_limit SET dispatched = %s WHERE key = %s", (limit, key))
    run_ids = [f"{name}-{i}" for i in range(2)]
    insert_runs(pg, wf, [(r, {}) for r in run_ids], "t1")
    _commit_ticks(pg, run_ids)
    statuses = {}
    for run_id in run_ids:
        run = store.load_runs(pg, store.Definitions(), [run_id])[run_id]
        assert isinstance(run, LoadedRun)
        statuses[run_id] = run.state.node("call").status
    # The one slot the window had went to one run; the other waits for the next.
    assert sorted(statuses.values()) == [NodeStatus.DISPATCHED, NodeStatus.LIMIT_WAIT]
    size = pg.execute("SELECT pg_column_size(l.*) FROM eec_limit l WHERE key = %s", (key,))
    assert size.fetchone()[0] < 1_000  # type: ignore[index]
    kept = pg.execute("SELECT count(*), min(at_ms) FROM eec_limit_rate WHERE key = %s", (key,))
    assert kept.fetchone() == (limit, now - week_ms // 2)  # the oldest out, the new one in
