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

from processor.core.decide import Commit
from processor.core.model import initial_state
from processor.io import connections, store
from processor.io.config import Settings
from processor.io.runs_admin import insert_runs

from .conftest import sample_workflow

pytestmark = pytest.mark.integration

RUNS = 4000


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def _scans(conn: psycopg.Connection[Any], sql: str, params: Any) -> list[tuple[str, str]]:
    """(node type, relation) of every scan of a table in the plan of ``sql``."""
    row = conn.execute(b"EXPLAIN (FORMAT JSON) " + sql.encode(), params).fetchone()
    assert row is not None
    document = row[0]
    (top,) = document if isinstance(document, list) else orjson.loads(document)
    plans = [top["Plan"], *top.get("InitPlan", [])]
    return [
        (node["Node Type"], node["Relation Name"])
        for plan in plans
        for node in _plan_nodes(plan)
        if "Relation Name" in node
    ]


@pytest.mark.parametrize("batch", [1, 8, 500])
def test_load_and_commit_reach_their_runs_by_key(
    pg: psycopg.Connection[Any], base_settings: Settings, batch: int
) -> None:
    wf = sample_workflow()
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"plan-{tag}-{i}" for i in range(RUNS)]
    for start in range(0, RUNS, 2000):
        insert_runs(pg, wf, [(r, {}) for r in run_ids[start : start + 2000]], "t1")
    # An outbox as a busy instance has one: a row per transition not yet acknowledged.
    pg.execute(
        "INSERT INTO eec_outbox (run_id, seq, records)"
        " SELECT run_id, 1, '[]'::jsonb FROM eec_workflow_run"
    )
    pg.execute("VACUUM ANALYZE eec_workflow_run")
    pg.execute("VACUUM ANALYZE eec_outbox")
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
        (store._LOAD_SQL, (store._INPUT_LOAD_BYTES, ids)),
        (store._COMMIT_SQL, params),
        (store._DELETE_OUTBOX_SQL, {"acked": params["acked"]}),
    )
    with connections.connect(base_settings.pg_dsn) as coordinator:  # as the processor's own
        for sql, args in statements:
            scans = _scans(coordinator, sql, args)
            whole_table = [s for s in scans if s[0] == "Seq Scan"]
            assert not whole_table, f"{sql.split()[0:4]} scans whole tables: {scans}"
            assert scans, f"no table in the plan of {sql.split()[0:4]}"
