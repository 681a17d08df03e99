"""The watchdog against the real broker and database: lost wakeups are re-woken, stuck runs are
force-failed, and a run that is waiting legitimately, or that moves while being swept, is not."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.core.decide import Commit
from processor.core.model import LoadedRun, RunStatus
from processor.engine.faults import Faults, Point
from processor.io.config import Settings
from processor.io.runs_admin import insert_runs
from processor.io.store import Definitions, commit_batch, load_runs

from .conftest import (
    ProcessorThread,
    WorkerThread,
    count_terminal,
    run_statuses,
    sample_workflow,
    wait_for,
)

pytestmark = pytest.mark.integration


def _set(pg: psycopg.Connection[Any], run_id: str, assignments: str) -> None:
    pg.execute(f"UPDATE eec_workflow_run SET {assignments} WHERE run_id = %s", (run_id,))


def _reason(pg: psycopg.Connection[Any], run_id: str) -> str | None:
    row = pg.execute(
        "SELECT failure_reason FROM eec_workflow_run WHERE run_id = %s", (run_id,)
    ).fetchone()
    return None if row is None else row[0]


def test_the_watchdog_rewakes_overdue_runs_and_fails_stuck_ones(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """A run whose wakeup was lost (never produced) is re-woken from next_wakeup_at; a run
    with no transition past the threshold and nothing to wait for is force-failed (stuck)."""
    settings = replace(settings, sweep_grace_s=0.0, stuck_after_s=3.0)
    lost, stuck = f"lost-{uuid.uuid4().hex[:6]}", f"stuck-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(lost, {}), (stuck, {})], "t1")
    _set(pg, lost, "next_wakeup_at = now() - interval '1 minute'")
    _set(pg, stuck, "last_transition_at = now() - interval '1 hour', next_wakeup_at = NULL")
    instance: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, [lost, stuck]) == 2, 60, "both runs to end")
    finally:
        worker.stop()
    assert run_statuses(pg, [lost, stuck]) == {lost: "succeeded", stuck: "failed"}
    assert _reason(pg, stuck) == "stuck"
    assert instance.stats.force_fails == {"stuck": 1}
    assert instance.processor.watchdog.rewoken >= 1


def test_a_run_waiting_for_a_deadline_ahead_is_not_stuck(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """No transition for longer than the threshold, but a step's deadline is still ahead (a
    long step): the run is waiting legitimately. Once that deadline is long past and nothing
    moved, it is stuck."""
    settings = replace(settings, stuck_after_s=2.0)
    waiting, overdue = f"waiting-{uuid.uuid4().hex[:6]}", f"overdue-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(waiting, {}), (overdue, {})], "t1")
    long_ago = "last_transition_at = now() - interval '1 hour'"
    _set(pg, waiting, f"{long_ago}, next_wakeup_at = now() + interval '1 hour'")
    _set(pg, overdue, f"{long_ago}, next_wakeup_at = now() - interval '30 minutes'")
    instance: ProcessorThread = processor_thread(settings)
    wait_for(lambda: instance.stats.force_fails["stuck"] == 1, 30, "the overdue run to fail")
    sweeps = instance.processor.watchdog.sweeps
    wait_for(lambda: instance.processor.watchdog.sweeps >= sweeps + 2, 30, "two more sweeps")
    assert run_statuses(pg, [waiting, overdue]) == {waiting: "pending", overdue: "failed"}
    assert instance.stats.force_fails == {"stuck": 1}


def test_a_run_that_moves_while_being_swept_is_not_force_failed(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The sweep selects a stuck run; before its force-fail is written, a transition commits
    (forced at the watchdog's fault point). The run has progressed: it must not be failed."""
    settings = replace(settings, stuck_after_s=2.0)
    run_id = f"moving-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    _set(pg, run_id, "last_transition_at = now() - interval '1 hour', next_wakeup_at = NULL")
    moved: list[str] = []

    def commit_a_transition(selected: list[str]) -> None:
        if run_id not in selected or moved:
            return
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            run = load_runs(conn, Definitions(), [run_id])[run_id]
            assert isinstance(run, LoadedRun)
            state = replace(run.state, status=RunStatus.RUNNING, seq=run.state.seq + 1)
            assert commit_batch(conn, [Commit(run_id, run.version, state)]).committed == {run_id}
        moved.append(run_id)

    instance: ProcessorThread = processor_thread(
        settings, faults=Faults({Point.STUCK_SELECTED: commit_a_transition})
    )
    wait_for(lambda: bool(moved), 30, "the sweep to select the run")
    sweeps = instance.processor.watchdog.sweeps
    wait_for(lambda: instance.processor.watchdog.sweeps > sweeps, 30, "the sweep to finish")
    assert run_statuses(pg, [run_id]) == {run_id: "running"}
    assert _reason(pg, run_id) is None
    assert not instance.stats.force_fails
