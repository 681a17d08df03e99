"""Children follow their parent on the real services, when a run is force-failed rather than
ended by a tick (core/children.py, rule 4): a parent the stuck sweep or the livelock guard
fails cancels its child in flight, so that `ductor runs retry` of it runs one child of its
step, not two; a child the stuck sweep fails wakes its parent at once, not at the step's
deadline; and a registration that would close a cycle of child workflows is refused."""

from __future__ import annotations

import threading
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from processor import StepContext, StepRegistry
from processor.client import SignalRefused, send_signal
from processor.core.child_graph import ChildCycle
from processor.core.decide import force_fail_write
from processor.core.model import LoadedRun
from processor.core.outcomes import ForceFailReason
from processor.core.routing import TopicNames
from processor.core.run_state import NodeStatus, state_checksum
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.store import Definitions, load_runs
from processor.io.postgres.store import force_fail_write as store_force_fail
from processor.io.postgres.workflows import register_workflow

from .children import run_ductor
from .contention import OutsideWriter
from .instances import ProcessorThread, WorkerThread
from .runs import run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _register(pg: psycopg.Connection[Any], *raws: dict[str, Any]) -> None:
    for raw in raws:
        register_workflow(pg, parse_workflow(raw))


def _gated_child(name: str) -> dict[str, Any]:
    """A child that waits for the signal ``go``, then runs ``work`` on a worker."""
    return {
        "name": name,
        "version": 1,
        "steps": [
            {"name": "gate", "kind": "wait", "signal": "go"},
            {"name": "work", "type": "count_work", "depends_on": ["gate"]},
        ],
    }


def _counting_registry(executed: list[str]) -> StepRegistry:
    registry = StepRegistry()
    lock = threading.Lock()

    @registry.step("count_work")
    def count_work(ctx: StepContext) -> str:
        with lock:
            executed.append(ctx.run_id)
        return "done"

    return registry


def _start(settings: Settings, workflow: str, run_id: str) -> None:
    started = run_ductor(settings, "start", workflow, "--run-id", run_id, "--input", "{}")
    assert started.returncode == 0, started.stderr


def _make_stuck(pg: psycopg.Connection[Any], run_id: str, node: str) -> None:
    """Write the run as it is, but for ``node`` in flight without a deadline, last moved an
    hour ago and with no wakeup due: a state no tick can move (what the stuck sweep fails)."""
    run = load_runs(pg, Definitions(), [run_id])[run_id]
    assert isinstance(run, LoadedRun)
    nodes = run.state.node_map()
    assert nodes[node].status is NodeStatus.DISPATCHED
    nodes[node] = nodes[node]._replace(due_ms=None)
    state = run.state.with_nodes(nodes)
    updated = pg.execute(
        "UPDATE eec_workflow_run SET node_states = %s, state_checksum = %s,"
        " next_wakeup_at = NULL, last_transition_at = now() - interval '1 hour'"
        " WHERE run_id = %s AND db_record_version = %s",
        (orjson.dumps(state.nodes_json()).decode(), state_checksum(state), run_id, run.version),
    )
    assert updated.rowcount == 1


def _reason(pg: psycopg.Connection[Any], run_id: str) -> str | None:
    row = pg.execute(
        "SELECT failure_reason FROM eec_workflow_run WHERE run_id = %s", (run_id,)
    ).fetchone()
    return None if row is None else row[0]


def _status_is(pg: psycopg.Connection[Any], run_id: str, status: str) -> bool:
    return run_statuses(pg, [run_id]).get(run_id) == status


def test_a_stuck_parent_cancels_its_child_and_its_retry_runs_one_child(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The stuck sweep fails the parent while its child waits: the child ends cancelled (its
    cancel written with the parent's end). Retried, the parent starts one new child; both are
    told to go on, and the step's work runs once, in the new child only."""
    tag = uuid.uuid4().hex[:6]
    child, parent = f"gated-{tag}", f"holder-{tag}"
    _register(
        pg,
        _gated_child(child),
        {
            "name": parent,
            "version": 1,
            "steps": [{"name": "hold", "kind": "workflow", "workflow": child}],
        },
    )
    instance: ProcessorThread = processor_thread(replace(settings, stuck_after_s=2.0))
    executed: list[str] = []
    worker = WorkerThread(settings, _counting_registry(executed))
    try:
        _start(settings, parent, "p1")
        wait_for(lambda: _status_is(pg, "p1/hold#1", "running"), 60, "p1's child to wait")
        _make_stuck(pg, "p1", "hold")
        wait_for(lambda: _status_is(pg, "p1", "failed"), 60, "the stuck sweep to fail p1")
        assert _reason(pg, "p1") == "stuck"
        wait_for(lambda: _status_is(pg, "p1/hold#1", "cancelled"), 30, "p1's child to cancel")
        assert instance.stats.force_fails == {"stuck": 1}

        retried = run_ductor(settings, "runs", "retry", "p1")
        assert retried.returncode == 0, retried.stderr
        wait_for(lambda: _status_is(pg, "p1/hold#2", "running"), 60, "p1's new child to wait")
        with pytest.raises(SignalRefused):  # the cancelled child takes no signal any more
            send_signal(settings, "p1/hold#1", "go")
        send_signal(settings, "p1/hold#2", "go")
        wait_for(lambda: _status_is(pg, "p1", "succeeded"), 60, "the retried p1 to succeed")
        children = pg.execute(
            "SELECT run_id, status FROM eec_workflow_run WHERE parent_run_id = 'p1' ORDER BY run_id"
        ).fetchall()
        assert children == [("p1/hold#1", "cancelled"), ("p1/hold#2", "succeeded")]
        assert executed == ["p1/hold#2"]  # one child's work, once
        # The force-fail's records (the child's wakeup) left the outbox once sent.
        wait_for(
            lambda: (
                pg.execute("SELECT count(*) FROM eec_outbox WHERE run_id = 'p1'").fetchone() == (0,)
            ),
            30,
            "p1's outbox rows to be deleted",
        )
    finally:
        worker.stop()


def test_a_livelocked_parent_cancels_its_child(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The parent's commits all lose to an outside writer until the livelock guard fails it:
    its child, waiting, ends cancelled."""
    tag = uuid.uuid4().hex[:6]
    child, parent = f"gated-{tag}", f"racing-{tag}"
    _register(
        pg,
        _gated_child(child),
        {
            "name": parent,
            "version": 1,
            "steps": [
                {"name": "hold", "kind": "workflow", "workflow": child},
                {"name": "poke", "kind": "wait", "signal": "poke"},
            ],
        },
    )
    instance: ProcessorThread = processor_thread(replace(settings, livelock_requeues=2))
    _start(settings, parent, "p2")
    wait_for(lambda: _status_is(pg, "p2/hold#1", "running"), 60, "p2's child to wait")
    writer = OutsideWriter(settings.pg_dsn, "p2")
    try:
        wait_for(lambda: writer.writes > 0, 10, "the outside writer to start")
        send_signal(settings, "p2", "poke")  # a tick with a change to commit, which loses
        wait_for(lambda: _status_is(pg, "p2", "failed"), 90, "the livelock force-fail")
    finally:
        writer.stop()
    assert _reason(pg, "p2") == "livelock"
    wait_for(lambda: _status_is(pg, "p2/hold#1", "cancelled"), 30, "p2's child to cancel")
    assert instance.stats.force_fails == {"livelock": 1}


def test_a_stuck_child_wakes_its_parent_at_once(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The stuck sweep fails a child whose parent waits an hour for it: the parent applies
    the child's end within seconds (its step fails, and with it the run), not at its step's
    deadline."""
    tag = uuid.uuid4().hex[:6]
    child, parent = f"stalled-{tag}", f"patient-{tag}"
    _register(
        pg,
        {"name": child, "version": 1, "steps": [{"name": "gate", "kind": "wait", "signal": "go"}]},
        {
            "name": parent,
            "version": 1,
            "steps": [
                {"name": "hold", "kind": "workflow", "workflow": child, "timeout_ms": 3_600_000}
            ],
        },
    )
    processor_thread(replace(settings, stuck_after_s=2.0))
    _start(settings, parent, "p3")
    wait_for(lambda: _status_is(pg, "p3/hold#1", "running"), 60, "p3's child to wait")
    _make_stuck(pg, "p3/hold#1", "gate")
    wait_for(lambda: _status_is(pg, "p3/hold#1", "failed"), 60, "the stuck sweep to fail it")
    wait_for(lambda: _status_is(pg, "p3", "failed"), 30, "p3 to apply its child's end")
    reason = _reason(pg, "p3")
    assert reason is not None and "child run p3/hold#1 failed: stuck" in reason
    lag = pg.execute(
        "SELECT extract(epoch FROM p.last_transition_at - c.last_transition_at)"
        " FROM eec_workflow_run p, eec_workflow_run c"
        " WHERE p.run_id = 'p3' AND c.run_id = 'p3/hold#1'"
    ).fetchone()
    assert lag is not None
    print(f"the parent ended {float(lag[0]):.3f} s after its child was force-failed")


def test_a_force_fail_whose_writer_died_before_sending_still_cancels_the_child(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The force-fail of a parent is written (as the livelock guard or a sweep writes it) by
    an instance that dies before it sends anything: the child's cancel is in the database and
    its wakeup in the outbox, which a live processor's relay sends; the child ends cancelled."""
    tag = uuid.uuid4().hex[:6]
    child, parent = f"gated-{tag}", f"orphaned-{tag}"
    _register(
        pg,
        _gated_child(child),
        {
            "name": parent,
            "version": 1,
            "steps": [{"name": "hold", "kind": "workflow", "workflow": child}],
        },
    )
    processor_thread(settings)
    _start(settings, parent, "p4")
    wait_for(lambda: _status_is(pg, "p4/hold#1", "running"), 60, "p4's child to wait")
    run = load_runs(pg, Definitions(), ["p4"])["p4"]
    assert isinstance(run, LoadedRun)
    names = TopicNames(settings.topic_prefix)
    write = force_fail_write(run, ForceFailReason.LIVELOCK, int(time.time() * 1000), names)
    assert write is not None and write.cancel_children == ("p4/hold#1",)
    assert store_force_fail(
        pg, "p4", write.loaded_checksum, write.state, write.cancel_children, write.effects
    ).written
    # Written again (a retry whose first answer was lost): nothing more lands.
    assert not store_force_fail(
        pg, "p4", write.loaded_checksum, write.state, write.cancel_children, write.effects
    ).written
    wait_for(lambda: _status_is(pg, "p4/hold#1", "cancelled"), 30, "the relay to cancel it")
    assert _status_is(pg, "p4", "failed")
    signals = pg.execute(
        "SELECT count(*) FROM eec_run_signal WHERE run_id = 'p4/hold#1' AND kind = 'cancel'"
    ).fetchone()
    assert signals == (1,)


def _flows(tag: str) -> dict[str, dict[str, Any]]:
    """Definitions for the cycles: each a version 1 with one task, and what closes cycles."""

    def plain(name: str, version: int = 1) -> dict[str, Any]:
        return {"name": name, "version": version, "steps": [{"name": "a", "type": "a"}]}

    def starts(name: str, version: int, *children: str | tuple[str, int]) -> dict[str, Any]:
        steps: list[dict[str, Any]] = []
        for i, c in enumerate(children):
            step: dict[str, Any] = {"name": f"c{i}", "kind": "workflow"}
            if isinstance(c, tuple):
                step |= {"workflow": c[0], "version": c[1]}
            else:
                step["workflow"] = c
            steps.append(step)
        return {"name": name, "version": version, "steps": steps}

    a, b, c = f"a-{tag}", f"b-{tag}", f"c-{tag}"
    return {
        "b1": plain(b),
        "a1": starts(a, 1, b),  # a v1 starts b (the latest)
        "b2": starts(b, 2, a),  # b v2 starts a v1, which starts b v2: a cycle
        "b2_pinned": starts(b, 2, (a, 1)),  # the same cycle: a v1's step is unpinned
        "c1": plain(c),
        "b3": starts(b, 3, c),  # b v3 -> c v1
        "c2": starts(c, 2, a),  # c v2 -> a v1 -> b v3 -> c v2: a longer cycle
        "self": starts(a, 2, a),  # a v2 starting a
    }


def test_a_registration_that_closes_a_cycle_of_children_is_refused(
    settings: Settings, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    """`ductor workflows register` refuses (exit 2) a definition that would close a cycle,
    naming it: two workflows, three, a version pinned along it, a workflow starting itself,
    and the same written in Python (the code-first path); nothing of it is registered."""
    tag = uuid.uuid4().hex[:6]
    flows = _flows(tag)
    a, b, c = f"a-{tag}", f"b-{tag}", f"c-{tag}"

    def register(key: str) -> Any:
        path = tmp_path / f"{key}.json"
        path.write_bytes(orjson.dumps(flows[key]))
        return run_ductor(settings, "workflows", "register", str(path))

    for key in ("b1", "a1", "c1"):
        assert register(key).returncode == 0
    for key in ("b2", "b2_pinned"):
        refused = register(key)
        assert refused.returncode == 2, refused.stderr
        assert f"{b} v2 -> {a} v1 -> {b} v2" in refused.stderr
    assert register("b3").returncode == 0  # b v3 -> c v1: no cycle
    refused = register("c2")
    assert refused.returncode == 2
    assert f"{c} v2 -> {a} v1 -> {b} v3 -> {c} v2" in refused.stderr
    itself = register("self")
    assert itself.returncode == 2 and "would start a run of this workflow itself" in itself.stderr
    versions = pg.execute(
        "SELECT name, version FROM eec_workflow_definition WHERE name LIKE %s ORDER BY 1, 2",
        (f"%-{tag}",),
    ).fetchall()
    assert versions == [(a, 1), (b, 1), (b, 3), (c, 1)]

    # The code-first path: Workflow objects in a module, registered in order.
    (tmp_path / f"flows_{tag}.py").write_text(
        f"""
from processor import Workflow
d1 = Workflow("d-{tag}", version=1)
d1.step(name="a", type="a")(lambda ctx: None)
e1 = Workflow("e-{tag}", version=1)
e1.child("c", workflow=d1)
d2 = Workflow("d-{tag}", version=2)
d2.child("c", workflow=e1)
flows = [d1, e1, d2]
"""
    )
    code = run_ductor(settings, "workflows", "register", f"flows_{tag}:flows", cwd=tmp_path)
    assert code.returncode == 2, code.stderr
    assert f"d-{tag} v2 -> e-{tag} v1 -> d-{tag} v2" in code.stderr


def test_two_registrations_at_once_cannot_each_close_half_a_cycle(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    """a v2 (starting b) and b v2 (starting a) are each fine alone, a cycle together. The
    first is held uncommitted while the second registers: the second waits for it, then sees
    it and is refused."""
    tag = uuid.uuid4().hex[:6]
    a, b = f"a-{tag}", f"b-{tag}"
    plain = [{"name": "a", "type": "a"}]
    _register(pg, {"name": a, "version": 1, "steps": plain})
    _register(pg, {"name": b, "version": 1, "steps": plain})
    a2 = parse_workflow(
        {"name": a, "version": 2, "steps": [{"name": "c", "kind": "workflow", "workflow": b}]}
    )
    b2 = parse_workflow(
        {"name": b, "version": 2, "steps": [{"name": "c", "kind": "workflow", "workflow": a}]}
    )
    outcome: list[BaseException | bool] = []
    with psycopg.connect(settings.pg_dsn, autocommit=True) as first:
        with first.transaction():
            assert register_workflow(first, a2)  # in the open transaction: not yet committed

            def second() -> None:
                with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
                    try:
                        outcome.append(register_workflow(conn, b2))
                    except ChildCycle as exc:
                        outcome.append(exc)

            thread = threading.Thread(target=second, daemon=True)
            thread.start()
            wait_for(  # the first commits as this block ends
                lambda: (
                    pg.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                        " AND database = (SELECT oid FROM pg_database"
                        "                  WHERE datname = current_database())"
                    ).fetchone()
                    == (1,)
                ),
                10,
                "the second registration to wait for the first",
            )
        thread.join(10)
    assert len(outcome) == 1 and isinstance(outcome[0], ChildCycle), outcome
    assert f"{b} v2 -> {a} v2 -> {b} v2" in str(outcome[0])
