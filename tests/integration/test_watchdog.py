"""The watchdog against the real broker and database: lost wakeups are re-woken, stuck runs are
force-failed, and a run that is waiting legitimately, or that moves while being swept, is not."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.model import LoadedRun
from processor.core.plans import Commit
from processor.core.routing import TopicNames, partition_for
from processor.core.run_state import NodeState, NodeStatus, RunStatus, initial_state, state_checksum
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.store import Definitions, commit_batch, load_runs
from processor.io.postgres.workflows import register_workflow
from processor.io.runtime.faults import Faults, Point

from .children import run_ductor
from .instances import ProcessorThread, WorkerThread
from .kcat import end_offset, read_partition
from .runs import count_terminal, run_statuses, step_attempts
from .samples import now_ms, sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _set(pg: psycopg.Connection[Any], run_id: str, assignments: str) -> None:
    pg.execute(f"UPDATE eec_workflow_run SET {assignments} WHERE run_id = %s", (run_id,))


def _dispatched(
    pg: psycopg.Connection[Any], run_id: str, due_ms: int | None, long_ago: bool = True
) -> None:
    """Write the run as running its first step (attempt 1, deadline ``due_ms``; None: no
    deadline, a state no tick can move without a result), last moved an hour ago, with no
    wakeup due: what a row looks like after its result's wakeup was lost."""
    initial = initial_state(sample_workflow())
    nodes = initial.node_map()
    nodes["fetch"] = NodeState(NodeStatus.DISPATCHED, 1, due_ms)
    state = replace(initial.with_nodes(nodes), status=RunStatus.RUNNING, seq=1)
    pg.execute(
        "UPDATE eec_workflow_run SET status = %s, node_states = %s, last_transition_seq = 1,"
        " state_checksum = %s, next_wakeup_at = NULL"
        + (", last_transition_at = now() - interval '1 hour'" if long_ago else "")
        + " WHERE run_id = %s",
        (
            state.status.value,
            orjson.dumps(state.nodes_json()).decode(),
            state_checksum(state),
            run_id,
        ),
    )


def _reason(pg: psycopg.Connection[Any], run_id: str) -> str | None:
    row = pg.execute(
        "SELECT failure_reason FROM eec_workflow_run WHERE run_id = %s", (run_id,)
    ).fetchone()
    return None if row is None else row[0]


def test_the_watchdog_rewakes_overdue_runs_and_fails_stuck_ones(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """A run whose wakeup was lost (never produced) is re-woken from next_wakeup_at; a run
    with no transition past the threshold, nothing to wait for and nothing a tick could
    move (a step in flight without a deadline, no result) is force-failed (stuck)."""
    settings = replace(settings, sweep_grace_s=0.0, stuck_after_s=3.0)
    lost, stuck = f"lost-{uuid.uuid4().hex[:6]}", f"stuck-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(lost, {}), (stuck, {})], "t1")
    _set(pg, lost, "next_wakeup_at = now() - interval '1 minute'")
    _dispatched(pg, stuck, due_ms=None)
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
    # The stuck run's force-fail is an end of its workflow; its start was written by hand.
    name = sample_workflow().name
    ended = {(name, RunStatus.SUCCEEDED): 1, (name, RunStatus.FAILED): 1}
    wait_for(lambda: instance.stats.runs.ended == ended, 10, "both ends to be counted")
    assert instance.stats.runs.started == {name: 1}


def test_a_stuck_run_with_a_recorded_result_is_woken_not_failed(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The run's first step succeeded, but the result's wakeup never reached a processor (all
    of them were down longer than the threshold); its deadline passed long ago and nothing
    else will wake it. The stuck sweep ticks it with its result, finds it can move, and wakes
    it: the run goes on and succeeds, its recorded result kept, its step not run again."""
    settings = replace(settings, sweep_grace_s=0.0, stuck_after_s=2.0)
    run_id = f"recorded-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    _dispatched(pg, run_id, due_ms=now_ms() - 3_600_000)
    pg.execute(
        "INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)"
        " VALUES (%s, 'fetch', 1, 'succeeded', '{\"from\": \"the lost wakeup\"}')",
        (run_id,),
    )
    instance: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, [run_id]) == 1, 60, "the run to end")
    finally:
        worker.stop()
    assert run_statuses(pg, [run_id]) == {run_id: "succeeded"}
    assert not instance.stats.force_fails
    assert step_attempts(pg, run_id)["fetch"] == [(1, "succeeded")]


def test_a_run_waiting_for_a_deadline_ahead_is_not_stuck(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """No transition for longer than the threshold, but a step's deadline is still ahead (a
    long step): the run is waiting legitimately. Once that deadline is long past and nothing
    moved, it is stuck (here: its state has nothing a tick could move)."""
    settings = replace(settings, stuck_after_s=2.0)
    waiting, overdue = f"waiting-{uuid.uuid4().hex[:6]}", f"overdue-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(waiting, {}), (overdue, {})], "t1")
    long_ago = "last_transition_at = now() - interval '1 hour'"
    _set(pg, waiting, f"{long_ago}, next_wakeup_at = now() + interval '1 hour'")
    _dispatched(pg, overdue, due_ms=None)
    _set(pg, overdue, "next_wakeup_at = now() - interval '30 minutes'")
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


def test_runs_whose_start_wakeup_never_reached_the_broker_are_started_by_the_sweep(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """`ductor start` while the broker cannot be reached (from the start command only): the
    runs are created and the command says their start was not announced; a processor's
    overdue sweep starts them, and each runs once to its end."""
    register_workflow(pg, sample_workflow())
    prefix = f"unannounced-{uuid.uuid4().hex[:6]}"
    unreachable = replace(settings, bootstrap_servers="127.0.0.1:1")
    started = run_ductor(unreachable, "start", "sample", "--run-id", prefix, "--count", "3")
    assert started.returncode == 0, started.stderr
    assert "start wakeups were not delivered" in started.stderr
    run_ids = [f"{prefix}-{i}" for i in range(3)]
    assert run_statuses(pg, run_ids) == dict.fromkeys(run_ids, "pending")
    instance: ProcessorThread = processor_thread(replace(settings, sweep_grace_s=0.5))
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, run_ids) == 3, 60, "the runs to end")
    finally:
        worker.stop()
    assert run_statuses(pg, run_ids) == dict.fromkeys(run_ids, "succeeded")
    assert instance.processor.watchdog.rewoken >= 3
    # Every effect acknowledged: nothing counts against the intake's bound any more.
    executor = instance.processor.executor
    wait_for(lambda: executor.waiting_records == 0, 10, "every effect to be acknowledged")
    for run_id in run_ids:  # started once: its first step dispatched once
        assert step_attempts(pg, run_id)["fetch"] == [(1, "succeeded")]


def test_an_overdue_run_is_rewoken_on_its_own_tier_and_not_on_every_sweep(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """An interactive-tier (t0) run overdue by a minute that a tick does not move: it is
    re-woken on t0 (never behind the bulk tier's backlog), and not again on the sweeps that
    follow: only once it has been overdue since for as long again."""
    settings = replace(settings, sweep_grace_s=0.0)
    run_id = f"overdue-t0-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t0")
    _dispatched(pg, run_id, due_ms=None, long_ago=False)
    _set(pg, run_id, "next_wakeup_at = now() - interval '1 minute'")
    instance: ProcessorThread = processor_thread(settings)
    watchdog = instance.processor.watchdog
    wait_for(lambda: watchdog.rewoken >= 1, 30, "the run to be re-woken")
    sweeps = watchdog.sweeps
    wait_for(lambda: watchdog.sweeps >= sweeps + 5, 30, "five more sweeps")
    assert watchdog.rewoken == 1
    names = TopicNames(settings.topic_prefix)
    for tier, expected in (("t0", 1), ("t2", 0)):
        topic = names.wakeup(tier)
        partition = partition_for(run_id, instance.processor.partitions[topic])
        records = read_partition(
            settings, topic, partition, 0, end_offset(settings, topic, partition)
        )
        woken = [
            r
            for r in records
            if r.value
            and orjson.loads(r.value).get("reason") == "sweep"
            and orjson.loads(r.value)["run_id"] == run_id
        ]
        assert len(woken) == expected, tier
