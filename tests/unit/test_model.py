"""Workflow parsing and validation, RetryPolicy, RunState helpers, checksum and rows
(processor/core/workflow.py, processor/core/model.py)."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import pytest
from hypothesis import given

from processor.core.model import LoadedRun
from processor.core.run_state import (
    NodeState,
    NodeStatus,
    RunState,
    RunStatus,
    initial_state,
    node_state,
    row_checksum,
    state_checksum,
    state_from_row,
)
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import RetryPolicy, ValidationError, WorkflowOutput

from .strategies import FAST, Run, runs, workflow_json

BASE: dict[str, Any] = {
    "name": "wf",
    "version": 2,
    "description": "two steps",
    "steps": [
        {"name": "a", "type": "fast"},
        {
            "name": "b",
            "type": "slow",
            "depends_on": ["a"],
            "timeout_ms": 5,
            "retry": {
                "max_attempts": 5,
                "backoff_ms": 7,
                "backoff_multiplier": 1.5,
                "max_backoff_ms": 9,
            },
        },
    ],
}


def _with(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """BASE with the field at ``path`` set (or removed when value is ...)."""
    raw = copy.deepcopy(BASE)
    target: Any = raw
    for key in path[:-1]:
        target = target[key]
    if value is ...:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return raw


def test_parse_a_definition_with_defaults() -> None:
    wf = parse_workflow(BASE)
    assert wf.key == ("wf", 2)
    a, b = wf.steps
    assert (a.name, a.step_type, a.depends_on, a.timeout_ms) == ("a", "fast", (), 30_000)
    assert a.retry == RetryPolicy(3, 100, 2.0, 60_000)
    assert b.depends_on == ("a",)
    assert b.retry == RetryPolicy(5, 7, 1.5, 9)
    assert b.timeout_ms == 5
    assert wf.step("b") is b
    with pytest.raises(KeyError):
        wf.step("zzz")


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ([], "workflow: expected a JSON object"),
        (_with(("name",), ...), "missing required field 'name'"),
        (_with(("name",), ""), "workflow.name: must be 1 to 200 characters"),
        (_with(("name",), "x" * 201), "workflow.name"),
        (_with(("name",), 3), "workflow.name: expected str"),
        (_with(("version",), 0), "workflow.version: must be >= 1"),
        (_with(("version",), True), "workflow.version: expected int"),
        (_with(("version",), 1.0), "workflow.version: expected int"),
        (_with(("extra",), 1), "unknown field(s) extra"),
        (_with(("steps",), []), "at least one step"),
        (_with(("steps",), {}), "workflow.steps: expected list"),
        (_with(("steps", 0), "a"), "workflow.steps[0]: expected an object"),
        (_with(("steps", 0, "type"), ...), "workflow.steps[0]: missing required field 'type'"),
        (_with(("steps", 0, "name"), 7), "workflow.steps[0].name: expected str"),
        (_with(("steps", 1, "oops"), 1), "workflow.steps[1]: unknown field(s) oops"),
        (_with(("steps", 1, "depends_on"), "a"), "workflow.steps[1].depends_on: expected list"),
        (_with(("steps", 1, "depends_on"), [1]), "depends_on: expected a list of step names"),
        (_with(("steps", 1, "depends_on"), ["zz"]), "'b' depends on unknown step 'zz'"),
        (_with(("steps", 1, "depends_on"), ["b"]), "'b' depends on itself"),
        (_with(("steps", 1, "timeout_ms"), 0), "workflow.steps[1].timeout_ms: must be >= 1"),
        (_with(("steps", 1, "name"), "a"), "step name 'a' is used twice"),
        (_with(("steps", 1, "name"), ""), "a step name is empty"),
        (_with(("steps", 1, "retry"), 3), "workflow.steps[1].retry: expected an object"),
        (_with(("steps", 1, "retry", "max_attempts"), 0), "retry.max_attempts: must be between"),
        (_with(("steps", 1, "retry", "max_attempts"), 101), "retry.max_attempts"),
        (_with(("steps", 1, "retry", "backoff_ms"), -1), "backoff values must be >= 0"),
        (_with(("steps", 1, "retry", "max_backoff_ms"), -1), "backoff values must be >= 0"),
        (_with(("steps", 1, "retry", "backoff_multiplier"), 0.5), "backoff_multiplier"),
        (_with(("steps", 1, "retry", "backoff_multiplier"), 11), "backoff_multiplier"),
        (_with(("steps", 1, "retry", "backoff_multiplier"), True), "backoff_multiplier"),
        (_with(("steps", 1, "retry", "jitter"), 1), "retry: unknown field(s) jitter"),
        (_with(("output",), "zz"), "workflow.output: 'zz' is not a step of this workflow"),
        (_with(("output",), ""), "workflow.output: '' is not a step of this workflow"),
        (_with(("output",), None), "workflow.output: expected a step name or an object"),
        (_with(("output",), ["a"]), "workflow.output: expected a step name or an object"),
        (_with(("output",), {}), "workflow.output: an object of names needs at least one name"),
        (_with(("output",), {"": "a"}), "workflow.output: a name is empty"),
        (_with(("output",), {"x": 1}), "workflow.output.x: expected a step name, got 1"),
        (_with(("output",), {"x": "a", "y": "zz"}), "workflow.output.y: 'zz' is not a step"),
    ],
)
def test_invalid_definitions_name_the_offending_field(raw: Any, message: str) -> None:
    with pytest.raises(ValidationError) as info:
        parse_workflow(raw)
    assert message in str(info.value)


def test_a_declared_output_is_one_step_or_a_mapping_of_names_to_steps() -> None:
    assert parse_workflow(BASE).output is None
    assert parse_workflow(_with(("output",), "b")).output == WorkflowOutput(step="b")
    mapping = parse_workflow(_with(("output",), {"total": "b", "first": "a", "again": "b"}))
    assert mapping.output == WorkflowOutput(fields=(("again", "b"), ("first", "a"), ("total", "b")))
    assert mapping.output.to_json() == {"total": "b", "first": "a", "again": "b"}


def test_a_definition_read_back_from_jsonb_equals_the_one_registered() -> None:
    """jsonb keeps an object's keys in an order of its own (shorter first): the output's
    names are kept sorted, so a definition stored and read back is the same one (it was
    not, and registering the orders example twice was refused as a different definition)."""
    written = _with(("output",), {"confirmation": "b", "charges": "a", "x": "a"})
    jsonb_order = _with(("output",), {"x": "a", "charges": "a", "confirmation": "b"})
    assert parse_workflow(written) == parse_workflow(jsonb_order)


def test_a_definition_without_output_keeps_its_canonical_json() -> None:
    # Definitions registered before outputs existed compare equal to their re-registration.
    assert "output" not in workflow_to_json(parse_workflow(BASE))
    assert workflow_to_json(parse_workflow(_with(("output",), "a")))["output"] == "a"


def test_a_dependency_cycle_is_rejected() -> None:
    raw = {
        "name": "cyc",
        "version": 1,
        "steps": [
            {"name": "root", "type": "t"},
            {"name": "x", "type": "t", "depends_on": ["root", "z"]},
            {"name": "y", "type": "t", "depends_on": ["x"]},
            {"name": "z", "type": "t", "depends_on": ["y"]},
        ],
    }
    with pytest.raises(ValidationError, match=r"dependency cycle among \['x', 'y', 'z'\]"):
        parse_workflow(raw)


def test_a_cycle_error_names_only_the_steps_on_the_cycle() -> None:
    raw = {
        "name": "cyc",
        "version": 1,
        "steps": [
            {"name": "a", "type": "t", "depends_on": ["b"]},
            {"name": "b", "type": "t", "depends_on": ["a"]},
            {"name": "after", "type": "t", "depends_on": ["b"]},
        ],
    }
    with pytest.raises(ValidationError, match=r"dependency cycle among \['a', 'b'\]$"):
        parse_workflow(raw)


def test_forward_dependencies_are_fine_when_acyclic() -> None:
    raw = {
        "name": "fwd",
        "version": 1,
        "steps": [{"name": "b", "type": "t", "depends_on": ["a"]}, {"name": "a", "type": "t"}],
    }
    assert parse_workflow(raw).step("b").depends_on == ("a",)


@FAST
@given(workflow_json(compensate=True))
def test_workflow_json_round_trips(raw: dict[str, Any]) -> None:
    wf = parse_workflow(raw)
    again = parse_workflow(orjson.loads(orjson.dumps(workflow_to_json(wf))))
    assert again == wf
    assert workflow_to_json(again) == workflow_to_json(wf)


@pytest.mark.parametrize(
    ("policy", "delays"),
    [
        (RetryPolicy(), [100, 200, 400, 800]),
        (
            RetryPolicy(backoff_ms=100, backoff_multiplier=3, max_backoff_ms=1_000),
            [100, 300, 900, 1_000],
        ),
        (RetryPolicy(backoff_ms=0), [0, 0, 0, 0]),
        (RetryPolicy(backoff_ms=250, backoff_multiplier=1), [250, 250, 250, 250]),
        (RetryPolicy(backoff_ms=10, backoff_multiplier=1.5), [10, 15, 22, 33]),
    ],
)
def test_retry_delay_after(policy: RetryPolicy, delays: list[int]) -> None:
    assert [policy.delay_after(a) for a in (1, 2, 3, 4)] == delays
    assert policy.delay_after(0) == policy.delay_after(1)


def test_delay_after_with_a_huge_attempt_is_capped() -> None:
    policy = RetryPolicy(max_attempts=100, backoff_ms=1_000, backoff_multiplier=10)
    assert policy.delay_after(100) == policy.max_backoff_ms


def test_run_state_helpers() -> None:
    wf = parse_workflow(BASE)
    s = initial_state(wf)
    assert s.status is RunStatus.PENDING and s.seq == 0 and s.reason is None
    assert [n for n, _ in s.nodes] == ["a", "b"]
    assert s.next_due_ms() is None
    moved = s.with_nodes(
        {
            "b": NodeState(NodeStatus.RETRY_WAIT, 1, due_ms=50),
            "a": NodeState(NodeStatus.DISPATCHED, 2, 70),
        }
    )
    assert [n for n, _ in moved.nodes] == ["a", "b"]  # definition order, whatever the mapping's
    assert moved.next_due_ms() == 50
    assert moved.nodes_json() == {
        "a": {"status": "dispatched", "attempt": 2, "due_ms": 70},
        "b": {"status": "retry_wait", "attempt": 1, "due_ms": 50},
    }
    ended = RunState(RunStatus.FAILED, moved.nodes, 3, "x")
    assert ended.next_due_ms() is None
    with pytest.raises(KeyError):
        s.node("zzz")
    assert {st.terminal for st in RunStatus} == {True, False}
    assert {st for st in RunStatus if st.terminal} == {
        RunStatus.SUCCEEDED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
    }


def test_node_state_json_omits_absent_fields() -> None:
    assert NodeState().to_json() == {"status": "pending", "attempt": 0}
    full = NodeState(NodeStatus.FAILED, 3, due_ms=5, error="e")
    assert NodeState.from_json(full.to_json()) == full
    assert NodeState.from_json({"status": "pending", "attempt": 0, "due_ms": None}) == NodeState()


def test_state_from_row_fills_missing_nodes_and_ignores_unknown_ones() -> None:
    wf = parse_workflow(BASE)
    rows = {"b": {"status": "succeeded", "attempt": 1}, "gone": {"status": "failed", "attempt": 9}}
    s = state_from_row("running", rows, 4, None, wf)
    assert s == RunState(
        RunStatus.RUNNING, (("a", NodeState()), ("b", NodeState(NodeStatus.SUCCEEDED, 1))), 4
    )


def test_checksum_covers_every_part_of_the_state() -> None:
    wf = parse_workflow(BASE)
    s = initial_state(wf)
    base = state_checksum(s)
    variants = [
        RunState(RunStatus.RUNNING, s.nodes),
        RunState(s.status, s.nodes, seq=1),
        RunState(s.status, s.nodes, reason="r"),
        s.with_nodes({"a": NodeState(attempt=1), "b": NodeState()}),
        s.with_nodes({"a": NodeState(error="e"), "b": NodeState()}),
        s.with_nodes({"a": NodeState(due_ms=1), "b": NodeState()}),
    ]
    assert len({base, *(state_checksum(v) for v in variants)}) == len(variants) + 1


@FAST
@given(runs())
def test_loaded_run_checksum_ok(run: Run) -> None:
    checksum = state_checksum(run.state)
    loaded = LoadedRun("r1", run.wf, run.state, 1, "t1", stored_checksum=checksum)
    assert loaded.checksum_ok
    tampered = RunState(run.state.status, run.state.nodes, run.state.seq, "edited by hand")
    assert not LoadedRun("r1", run.wf, tampered, 1, "t1", stored_checksum=checksum).checksum_ok


@FAST
@given(runs())
def test_the_checksum_of_a_row_as_stored_is_the_checksum_of_its_state(run: Run) -> None:
    """The loader checks the raw row (no decoding first): the same checksum for every row the
    processor writes, and a different one for a key it would not have written."""
    state = run.state
    stored = orjson.loads(orjson.dumps(state.nodes_json()))  # what node_states gives back
    assert row_checksum(state.status.value, stored, state.seq, state.reason) == state_checksum(
        state
    )
    name = next(iter(stored))
    stored[name] = {**stored[name], "note": "added by hand"}
    assert row_checksum(state.status.value, stored, state.seq, state.reason) != state_checksum(
        state
    )


def test_node_state_makes_what_the_named_tuple_makes() -> None:
    made = node_state(NodeStatus.RETRY_WAIT, 3, 1_000, "boom", 2)
    assert type(made) is NodeState
    assert made == NodeState(NodeStatus.RETRY_WAIT, 3, 1_000, "boom", 2)
    assert (made.status, made.attempt, made.due_ms, made.error, made.attempts_before) == (
        NodeStatus.RETRY_WAIT,
        3,
        1_000,
        "boom",
        2,
    )
    assert node_state() == NodeState() and type(node_state()) is NodeState
    assert node_state(NodeStatus.DISPATCHED, 1)._replace(attempt=2) == NodeState(
        NodeStatus.DISPATCHED, 2
    )
