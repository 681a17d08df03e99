"""The worker's result insert on the real database: a result is stored once, a result of a run
that no longer exists is left out and named, and no lock on a run's row (a commit's, an
operator's) makes an insert wait: the results table has no foreign key to the runs."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from processor.core.model import StepOutcome
from processor.io.config.settings import Settings
from processor.io.postgres import connections
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.step_data import StepResultRow, insert_step_results

from .samples import sample_workflow

pytestmark = pytest.mark.integration


def _row(run_id: str, node: str = "a", output: Any = None) -> StepResultRow:
    return StepResultRow(run_id, node, 1, StepOutcome.SUCCEEDED, output, None)


def _outputs(pg: psycopg.Connection[Any], run_id: str) -> list[Any]:
    rows = pg.execute("SELECT output FROM eec_step_result WHERE run_id = %s", (run_id,))
    return [r[0] for r in rows]


def test_results_are_stored_once_and_those_of_runs_that_are_gone_are_named(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    tag = uuid.uuid4().hex[:6]
    here, gone = f"results-{tag}", f"results-gone-{tag}"
    insert_runs(pg, sample_workflow(), [(here, {})], "t1")
    with connections.connect(settings.pg_dsn) as conn:
        left = insert_step_results(conn, [_row(gone), _row(here, output={"n": 1})])
        # The same result again, with another output: the first one stands.
        again = insert_step_results(conn, [_row(here, output={"n": 2})])
    assert left == [0] and again == []
    assert _outputs(pg, here) == [{"n": 1}]
    assert _outputs(pg, gone) == []


def test_a_run_row_held_by_another_transaction_does_not_hold_its_results(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    tag = uuid.uuid4().hex[:6]
    run_id = f"results-held-{tag}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    with psycopg.connect(settings.pg_dsn) as holder:  # a transaction, open until closed
        holder.execute("SELECT 1 FROM eec_workflow_run WHERE run_id = %s FOR UPDATE", (run_id,))
        with connections.connect(settings.pg_dsn) as conn:
            # Any wait would end in this error instead of the insert.
            conn.execute("SET lock_timeout = '500ms'")
            assert insert_step_results(conn, [_row(run_id, output=[1])]) == []
    assert _outputs(pg, run_id) == [[1]]
