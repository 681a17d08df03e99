"""A run row held by a transaction that is not ours (an operator's `SELECT ... FOR UPDATE`, a
repair script left open) holds that run and nothing else: the commits skip the row and go on
with their batch, the worker records every result (its inserts never lock a run's row), and
the held run goes on once the lock is gone: not quarantined, not force-failed, its step run
once. Run on the real broker and database, with a steps module that counts its executions."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow

from . import counted_steps
from .children import Spawned
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"
NEIGHBOURS = 300


def _workflow() -> WorkflowDef:
    return parse_workflow(
        {
            "name": "held-rows",
            "version": 1,
            "steps": [
                {"name": "first", "type": "counted", "timeout_ms": 60000},
                {"name": "second", "type": "counted", "timeout_ms": 60000, "depends_on": ["first"]},
            ],
        }
    )


def _logged(child: Spawned, message: str) -> bool:
    return any(message in str(line.get("msg", "")) for line in child.log_lines())


def _recorded(pg: psycopg.Connection[Any], run_id: str) -> int:
    row = pg.execute("SELECT count(*) FROM eec_step_result WHERE run_id = %s", (run_id,)).fetchone()
    return int(row[0]) if row else 0


def _hold(dsn: str, run_id: str) -> psycopg.Connection[Any]:
    """An outside transaction holding the run's row, open until the connection is closed."""
    conn = psycopg.connect(dsn)  # not autocommit: the SELECT opens a transaction
    conn.execute("SELECT 1 FROM eec_workflow_run WHERE run_id = %s FOR UPDATE", (run_id,))
    return conn


def test_a_row_held_by_an_outside_transaction_holds_its_own_run_and_nothing_else(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    counted_steps.install(pg)
    wf = _workflow()
    register_workflow(pg, wf)
    processor = spawn(["process"], settings, "process")
    worker = spawn(["worker", "--app", APP], settings, "worker")
    wait_for(lambda: worker.owned_partitions() > 0, 60, "the worker to own step partitions")
    tag = uuid.uuid4().hex[:6]
    at_start, at_result = f"held-start-{tag}", f"held-result-{tag}"
    neighbours = [f"free-{tag}-{i}" for i in range(NEIGHBOURS)]

    # Held before its first tick: every commit of it is skipped.
    insert_runs(pg, wf, [(at_start, {})], "t1")
    holding_start = _hold(settings.pg_dsn, at_start)
    # Held while its first step runs: its result is recorded, its run cannot move on.
    start_runs(settings, wf.name, [at_result], {"sleep_ms": 1500})
    wait_for(
        lambda: len(counted_steps.executions(pg, at_result)) == 1, 30, "its first step to start"
    )
    holding_result = _hold(settings.pg_dsn, at_result)
    try:
        # A result insert takes no lock on its run's row: it is recorded while the row is
        # held, and the run moves on once the lock is gone.
        wait_for(
            lambda: _recorded(pg, at_result) == 1,
            30,
            "the worker to record the step's result while the run's row is held",
        )
        # Batched with the held run, then after it; every result after the held one.
        start_runs(settings, wf.name, [at_start, *neighbours[:150]])
        start_runs(settings, wf.name, neighbours[150:])
        wait_for(
            lambda: count_terminal(pg, neighbours) == NEIGHBOURS,
            90,
            "every other run to end while the two rows are held",
        )
        wait_for(
            lambda: _logged(processor, "another transaction holds its row"),
            10,
            "the processor to say the run's row is held",
        )
        assert run_statuses(pg, [at_start, at_result]) == {
            at_start: "pending",
            at_result: "running",
        }
    finally:
        holding_start.close()
        holding_result.close()
    held = [at_start, at_result]
    wait_for(lambda: count_terminal(pg, held) == 2, 60, "the held runs to end once released")
    everyone = [*neighbours, *held]
    assert set(run_statuses(pg, everyone).values()) == {"succeeded"}
    # What users feel: each step of each run ran once, on its first attempt.
    counts = counted_steps.executions(pg)
    assert {counts[(r, step, 1)] for r in everyone for step in ("first", "second")} == {1}
    assert counted_steps.extra_executions(counts) == 0
    quarantined = pg.execute("SELECT count(*) FROM eec_run_quarantine").fetchone()
    assert quarantined == (0,)
    processor.terminate()
    worker.terminate()
    stats = processor.final_stats()
    assert stats["ticks"].get("locked", 0) > 0
    assert not stats["force_fails"] and not stats["errors"], stats
