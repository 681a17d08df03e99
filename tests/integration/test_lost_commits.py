"""A commit the database loses after its effects went out (a crash with ``synchronous_commit``
off, a failover to a standby that had not received it): the step task it dispatched reaches a
worker while the run's row is back at the state before. Nothing else would wake the run before
that row's next deadline (300 s here). The worker skips the task, which its row never
dispatched, and wakes the run; the processor dispatches the attempt again from the row it has,
the step runs once, and the run ends.

The loss is made by hand, as the crash leaves it: the row written back as it was before the
lost transaction (its version and checksum included), the trail of that transaction gone with
it, and the offsets the processor had committed for the wakeups it consumed kept."""

from __future__ import annotations

import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.topics import create_topics
from processor.io.postgres.workflows import register_workflow
from processor.tools.audit import assert_transitions_applied_once
from processor.worker import StepContext, StepRegistry
from processor.worker.options import WorkerOptions

from .instances import WorkerThread
from .runs import run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

_WORKFLOW = {
    "name": "lost-commit",
    "version": 1,
    "steps": [
        # Deadlines far beyond the test: only a wakeup can move the run in time.
        {"name": "a", "type": "first-half", "timeout_ms": 300_000},
        {
            "name": "b",
            "type": "second-half",
            "queue": "later",  # served only once the commit is lost
            "depends_on": ["a"],
            "timeout_ms": 300_000,
        },
    ],
}


def _node(pg: psycopg.Connection[Any], run_id: str, node: str) -> tuple[str, int]:
    row = pg.execute(
        "SELECT node_states -> %s ->> 'status', (node_states -> %s ->> 'attempt')::int"
        " FROM eec_workflow_run WHERE run_id = %s",
        (node, node, run_id),
    ).fetchone()
    assert row is not None
    return row[0], row[1]


def _row_back_to(pg: psycopg.Connection[Any], run_id: str, saved: str) -> None:
    """Write the run's row back as ``saved`` holds it, and drop the trail of the writes since:
    what a database that lost those commits shows."""
    columns = [
        name
        for (name,) in pg.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'eec_workflow_run' AND column_name <> 'run_id'"
        ).fetchall()
    ]
    listed = ", ".join(columns)
    version = pg.execute(f"SELECT db_record_version FROM {saved}").fetchone()
    assert version is not None
    pg.execute(
        f"UPDATE eec_workflow_run r SET ({listed}) = (SELECT {listed} FROM {saved})"
        " WHERE r.run_id = %s",
        (run_id,),
    )
    pg.execute(
        "DELETE FROM test_run_audit WHERE run_id = %s AND (new_version > %s OR old_version > %s)",
        (run_id, version[0], version[0]),
    )


def test_a_task_whose_dispatch_the_database_lost_wakes_its_run_and_runs_once(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    executions: Counter[tuple[str, int]] = Counter()
    first, then = StepRegistry(), StepRegistry()

    @first.step("first-half")
    def first_half(ctx: StepContext) -> Any:
        return {"half": 1}

    @then.step("second-half")
    def second_half(ctx: StepContext) -> Any:
        executions[(ctx.run_id, ctx.attempt)] += 1
        return {"half": 2}

    register_workflow(pg, parse_workflow(_WORKFLOW))
    create_topics(settings, queues=["later"])
    run_id = f"lost-{uuid.uuid4().hex[:8]}"
    processor = processor_thread(settings)
    start_runs(settings, "lost-commit", [run_id])
    wait_for(lambda: _node(pg, run_id, "a") == ("dispatched", 1), 60, "step a dispatched")
    pg.execute(
        "CREATE TEMP TABLE before_the_loss AS SELECT * FROM eec_workflow_run WHERE run_id = %s",
        (run_id,),
    )
    # The transition to lose: a's result applied, b dispatched and its task sent.
    one = WorkerThread(settings, first, options=WorkerOptions(queues=("default",)))
    try:
        wait_for(lambda: _node(pg, run_id, "b") == ("dispatched", 1), 60, "step b dispatched")
    finally:
        one.stop()
    processor.stop()
    _row_back_to(pg, run_id, "before_the_loss")
    assert _node(pg, run_id, "b") == ("pending", 0)

    processor_thread(settings)  # a new instance, as after the database's crash
    two = WorkerThread(settings, then, options=WorkerOptions(queues=("later",)))
    try:
        wait_for(
            lambda: run_statuses(pg, [run_id]) == {run_id: "succeeded"},
            60,
            "the run to end (without a wakeup from the worker it waits 300 s)",
        )
    finally:
        two.stop()
    assert two.worker.stats.skipped["ahead"] == 1, two.worker.stats.skipped
    assert executions == {(run_id, 1): 1}, "b ran other than once"
    assert_transitions_applied_once(pg, run_id)
