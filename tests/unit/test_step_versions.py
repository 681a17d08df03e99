"""Versioned step code (core/versions.py): the pinning rule, a run's pins in its state and its
tasks, the task record both ways (with records from before versions), the registry's versions,
the hand-back by version and `runs upgrade`'s rule, without Kafka or Postgres."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.decide import tick_batch
from processor.core.handback import RunHere, SendTo, Server, route
from processor.core.model import LoadedRun, StepOutcome, StepResult
from processor.core.routing import TopicNames
from processor.core.run_state import (
    RunState,
    RunStatus,
    initial_state,
    state_checksum,
    state_from_row,
)
from processor.core.step_task import (
    STEP_TASK_VERSION,
    STEP_VERSION_TASK_VERSION,
    MapItem,
    StepData,
    StepTask,
    decode_step_task,
)
from processor.core.tick import tick
from processor.core.versions import (
    newest_served,
    parse_served,
    pin_of,
    pin_versions,
    served_key,
    step_versions,
    upgrade,
)
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import ValidationError
from processor.io.postgres.worker_registry import LiveWorker, ServedCache, unserved
from processor.ui.dag import step_states
from processor.worker.steps import RegistrationError, StepRegistry, execute_step

from .strategies import FAST, runs

NAMES = TopicNames("ductor")
NOW_MS = 1_700_000_000_000

WF = parse_workflow(
    {
        "name": "pay",
        "version": 1,
        "steps": [
            {"name": "charge", "type": "charge"},
            {"name": "refund", "type": "charge", "depends_on": ["charge"]},
            {"name": "mail", "type": "mail", "queue": "mails", "depends_on": ["charge"]},
            {"name": "fixed", "type": "audit", "version": 3, "depends_on": ["charge"]},
            {"name": "wait", "kind": "wait", "signal": "go", "depends_on": ["charge"]},
        ],
    }
)


def _run(state: RunState, served: dict[tuple[str, str], int] | None = None, **kw: Any) -> LoadedRun:
    run = LoadedRun("r", WF, state, 1, "t1", stored_checksum=state_checksum(state), **kw)
    return run if served is None else run.with_served(served)


# -- the served keys --------------------------------------------------------------------------


def test_a_served_key_names_the_version_past_1() -> None:
    assert served_key("charge", 1) == "charge"
    assert served_key("charge", 2) == "charge@2"
    assert parse_served("charge@2") == ("charge", 2)
    assert parse_served("charge") == ("charge", 1)
    # What is no version mark is the type's own name, version 1.
    assert parse_served("mail@home") == ("mail@home", 1)
    assert parse_served("x@0") == ("x@0", 1)
    assert parse_served("@2") == ("@2", 1)


def test_the_newest_served_version_is_per_queue_and_type() -> None:
    workers = [
        (["default"], ["charge"]),
        (["default", "mails"], ["charge", "charge@2", "mail"]),
        (["other"], ["charge@5"]),
    ]
    assert newest_served(workers) == {
        ("default", "charge"): 2,
        ("mails", "charge"): 2,
        ("other", "charge"): 5,
    }


# -- the pinning rule -------------------------------------------------------------------------


def test_a_run_pins_the_steps_own_version_else_the_newest_served_else_1() -> None:
    served = {("default", "charge"): 2, ("default", "mail"): 4, ("default", "audit"): 7}
    pins = pin_versions(WF, served)
    # mail runs on queue "mails", where nobody serves a version 2; audit declares 3.
    assert pins == (("charge", 2), ("refund", 2), ("fixed", 3))
    assert step_versions(WF, pins) == {"charge": 2, "refund": 2, "mail": 1, "fixed": 3}
    assert pin_versions(WF, {}) == (("fixed", 3),)
    assert pin_of(pins, "mail") == 1


def test_the_first_tick_pins_the_run_and_its_tasks_carry_their_versions() -> None:
    run = _run(initial_state(WF), {("default", "charge"): 2})
    commit = tick_batch({"r": run}, NOW_MS, NAMES)["r"]
    assert commit.state.versions == (("charge", 2), ("refund", 2), ("fixed", 3))
    (send,) = commit.effects
    task = decode_step_task(send.value)
    assert (task.node, task.step_version) == ("charge", 2)
    assert orjson.loads(send.value or b"")["task_version"] == STEP_VERSION_TASK_VERSION
    # The pins are stored in the steps' entries and read back with the state.
    nodes = commit.state.nodes_json()
    assert nodes["charge"]["version"] == 2 and "version" not in nodes["mail"]
    back = state_from_row("running", nodes, commit.state.seq, None, WF)
    assert back.versions == commit.state.versions
    assert state_checksum(back) == state_checksum(commit.state)


def test_a_running_run_keeps_its_pins_whatever_is_served_now() -> None:
    first = tick_batch({"r": _run(initial_state(WF), {})}, NOW_MS, NAMES)["r"].state
    assert first.versions == (("fixed", 3),)
    # A worker with charge v2 started since: the run's next steps still run version 1.
    done = StepResult("charge", 1, StepOutcome.SUCCEEDED)
    later = _run(first, {("default", "charge"): 2}, results=(done,))
    commit = tick_batch({"r": later}, NOW_MS + 10, NAMES)["r"]
    tasks = {t.node: t for t in (decode_step_task(s.value) for s in commit.effects)}
    assert {n: t.step_version for n, t in tasks.items()} == {"refund": 1, "mail": 1, "fixed": 3}
    assert commit.state.versions == first.versions


def test_a_state_from_before_versions_keeps_its_checksum_and_runs_version_1() -> None:
    old = tick(initial_state(WF), WF, (), (), NOW_MS).new_state
    assert old is not None
    nodes = old.nodes_json()
    del nodes["fixed"]["version"]  # as a coordinator from before versions wrote it
    before = RunState(old.status, old.nodes, old.seq, old.reason, old.maps)
    assert state_checksum(before) == state_checksum(state_from_row("running", nodes, 1, None, WF))
    assert state_from_row("running", nodes, 1, None, WF).versions == ()


@FAST
@given(st.data())
def test_property_pins_are_decided_once_as_a_run_starts(data: st.DataObject) -> None:
    run = data.draw(runs(live_only=True))
    types = sorted({(s.queue, s.step_type) for s in run.wf.steps})
    served = data.draw(st.dictionaries(st.sampled_from(types), st.integers(1, 4)))
    decision = tick(run.state, run.wf, run.stored, (), run.now_ms, served=served)
    again = tick(run.state, run.wf, run.stored, (), run.now_ms, served=dict(served))
    assert decision == again  # deterministic
    if decision.new_state is None:
        return
    if run.state.status is RunStatus.PENDING:
        assert decision.new_state.versions == pin_versions(run.wf, served)
    else:  # a running run: whatever is served now, its pins are its own
        assert decision.new_state.versions == run.state.versions
    # Terminal states absorb: nothing is pinned again.
    if decision.new_state.status.terminal:
        assert tick(decision.new_state, run.wf, (), (), run.now_ms, served=served).new_state is None


# -- the task record --------------------------------------------------------------------------


def test_a_task_at_version_1_is_the_record_every_worker_reads() -> None:
    task = StepTask("r", "charge", 1, "charge", NOW_MS)
    raw = orjson.loads(task.encode())
    assert raw["task_version"] == STEP_TASK_VERSION and "step_version" not in raw
    assert decode_step_task(task.encode()).step_version == 1


@pytest.mark.parametrize("item", [None, MapItem("fetch", 3)])
def test_a_task_at_a_later_version_is_version_3_both_ways(item: MapItem | None) -> None:
    task = StepTask("r", "charge", 2, "charge", NOW_MS, "t0", item=item, step_version=4)
    raw = orjson.loads(task.encode())
    assert raw["task_version"] == STEP_VERSION_TASK_VERSION and raw["step_version"] == 4
    assert decode_step_task(task.encode()) == task


def test_a_record_from_before_versions_runs_version_1() -> None:
    old = b'{"task_version":1,"run_id":"r","node":"a","attempt":1,"step_type":"t",'
    old += b'"deadline_ms":1700000000000,"tier":"t1"}'
    assert decode_step_task(old).step_version == 1
    with pytest.raises(ValidationError, match="step_version comes only with task_version 3"):
        decode_step_task(old[:-1] + b',"step_version":2}')


# -- the worker's registry and the hand-back --------------------------------------------------


def test_a_registry_holds_each_version_as_its_own_function() -> None:
    registry = StepRegistry()

    @registry.step("charge")
    def v1(ctx: Any) -> str:
        return "v1"

    @registry.step("charge", version=2)
    def v2(ctx: Any) -> str:
        return "v2"

    assert registry.get("charge") is v1 and registry.get("charge", 2) is v2
    assert registry.get("charge", 3) is None
    assert registry.types() == ["charge"]
    assert registry.served() == ["charge", "charge@2"]
    with pytest.raises(RegistrationError, match="version 2 is registered twice"):
        registry.step("charge", version=2)(lambda ctx: None)
    for bad in (0, 10_000, "2"):
        with pytest.raises(RegistrationError, match="version must be an integer"):
            registry.step("charge", version=bad)  # type: ignore[arg-type]
    with pytest.raises(RegistrationError, match="marks a version"):
        registry.step("charge@3")


def test_a_worker_runs_a_task_with_the_function_of_its_version_only() -> None:
    registry = StepRegistry()
    registry.step("charge")(lambda ctx: "v1")
    registry.step("charge", version=2)(lambda ctx: "v2")
    data = decode_step_task(StepTask("r", "a", 1, "charge", NOW_MS).encode())
    assert execute_step(registry, data, StepData(None)).output == "v1"
    v2 = StepTask("r", "a", 1, "charge", NOW_MS, step_version=2)
    assert execute_step(registry, v2, StepData(None)).output == "v2"
    missing = execute_step(
        registry, StepTask("r", "a", 1, "charge", NOW_MS, step_version=3), StepData(None)
    )
    assert missing.outcome is StepOutcome.FAILED
    assert missing.error is not None
    assert "type 'charge' version 3" in missing.error


def _server(name: str, *keys: str) -> Server:
    return Server(name, frozenset({"default"}), frozenset(keys), {"ductor.steps": (0,)}, True)


def test_a_task_goes_only_to_a_worker_with_its_version() -> None:
    servers = [_server("old", "charge"), _server("new", "charge", "charge@2")]
    assert route(servers, "me", "default", "charge@2", "ductor.steps", 7, 0.0) == SendTo(0, "new")
    assert route(servers[:1], "me", "default", "charge@2", "ductor.steps", 7, 0.0) == RunHere(
        "no live worker of queue 'default' has step type 'charge' version 2"
    )


# -- runs upgrade's rule ----------------------------------------------------------------------


def test_an_upgrade_moves_the_pins_of_a_type_or_of_every_type_to_the_newest() -> None:
    pins = (("fixed", 3),)
    moved, moves = upgrade(WF, pins, {}, "charge", 2)
    assert moved == (("charge", 2), ("refund", 2), ("fixed", 3))
    assert [(m.step, m.old, m.new) for m in moves] == [("charge", 1, 2), ("refund", 1, 2)]
    served = {("default", "charge"): 2, ("default", "audit"): 4}
    latest, moves = upgrade(WF, pins, served, None, None)
    assert latest == (("charge", 2), ("refund", 2), ("fixed", 4))
    assert upgrade(WF, latest, served, None, None)[1] == ()  # nothing left to move
    back, _ = upgrade(WF, latest, {}, "charge", 1)
    assert back == (("fixed", 4),)


def test_the_page_s_steps_carry_their_pinned_versions() -> None:
    document = {
        "steps": [
            {"name": "hold", "kind": "wait", "type": "", "after": []},
            {"name": "charge", "kind": "task", "type": "charge", "after": ["hold"], "version": 2},
        ],
        "nodes": [{"node": "charge", "status": "succeeded", "attempt": 1}],
    }
    assert [s.version for s in step_states(document)] == [None, 2]


def _worker(*keys: str) -> LiveWorker:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return LiveWorker("w", None, "h", 1, ("default",), keys, 4, "0", None, {}, at, at)


def test_a_step_with_its_own_version_needs_a_worker_with_that_version() -> None:
    pinned = parse_workflow(
        {
            "name": "p",
            "version": 1,
            "steps": [
                {"name": "a", "type": "charge", "version": 2},
                {"name": "b", "type": "mail"},
            ],
        }
    )
    assert unserved(pinned, [_worker("charge", "mail@3")]) == [("default", "charge@2")]
    assert unserved(pinned, [_worker("charge@2", "mail@3")]) == []


class _Rows:
    def __init__(self, rows: list[tuple[Any, Any]]) -> None:
        self.rows, self.reads = rows, 0

    def execute(self, *_args: Any) -> _Rows:
        self.reads += 1
        return self

    def fetchall(self) -> list[tuple[Any, Any]]:
        return self.rows


def test_the_processor_reads_what_is_served_at_most_once_a_second() -> None:
    now = [100.0]
    cache = ServedCache(5.0, monotonic=lambda: now[0])
    conn = _Rows([(["default"], ["charge", "charge@2"]), (None, None)])
    assert cache.get(conn) == {("default", "charge"): 2}  # type: ignore[arg-type]
    conn.rows = [(["default"], ["charge", "charge@3"])]
    now[0] += 0.5
    assert cache.get(conn) == {("default", "charge"): 2}  # type: ignore[arg-type]
    now[0] += 0.5
    assert cache.get(conn) == {("default", "charge"): 3}  # type: ignore[arg-type]
    assert conn.reads == 2


def test_a_map_s_items_run_their_map_s_version() -> None:
    wf = parse_workflow(
        {"name": "m", "version": 1, "steps": [{"name": "each", "kind": "map", "type": "charge"}]}
    )
    state = initial_state(wf)
    run = LoadedRun("r", wf, state, 1, "t1", stored_checksum=state_checksum(state), input_length=2)
    commit = tick_batch({"r": run.with_served({("default", "charge"): 2})}, NOW_MS, NAMES)["r"]
    tasks = [decode_step_task(s.value) for s in commit.effects]
    assert [(t.node, t.item, t.step_version) for t in tasks] == [
        ("each[0]", MapItem(None, 0), 2),
        ("each[1]", MapItem(None, 1), 2),
    ]
    assert commit.state.versions == (("each", 2),)
