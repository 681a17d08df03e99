"""Child workflows in the pure core: definitions, the child each workflow step's attempt starts,
the children a transition cancels, and (Hypothesis) one child per attempt and a child's end
applied once, whatever results come and however often."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor import Workflow
from processor.core.children import (
    ChildStart,
    child_run_id,
    children_started,
    children_to_cancel,
)
from processor.core.envelope import MAX_RUN_ID_LENGTH
from processor.core.model import SignalKind, StepOutcome, StepResult
from processor.core.run_state import NodeStatus, RunState, RunStatus, initial_state
from processor.core.tick import tick
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import CHILD_TIMEOUT_MS, ValidationError
from processor.io.shipped.workflow_schema import workflow_validator

SCHEMA = workflow_validator()  # the schema the package ships, as `workflows register` checks it
PARENT: dict[str, Any] = {
    "name": "order",
    "version": 1,
    "steps": [
        {"name": "price", "type": "price"},
        {
            "name": "ship",
            "kind": "workflow",
            "workflow": "shipping",
            "input_from": "price",
            "depends_on": ["price"],
            "retry": {"max_attempts": 2},
            "timeout_ms": 5000,
        },
        {"name": "notify", "type": "notify", "depends_on": ["ship"]},
    ],
}
WF = parse_workflow(PARENT)


def _shipping(now: int = 0) -> tuple[RunState, RunState]:
    """(before, after) the tick that dispatches ``ship``'s first attempt."""
    first = tick(initial_state(WF), WF, (), (), now).new_state
    assert first is not None
    priced = [StepResult("price", 1, StepOutcome.SUCCEEDED)]
    after = tick(first, WF, priced, (), now + 1)
    assert after.new_state is not None and after.dispatches == ()  # no task for a worker
    return first, after.new_state


def test_a_workflow_step_is_defined_in_json_and_in_code() -> None:
    ship = WF.step("ship")
    assert ship.starts_child and ship.child_workflow == "shipping" and ship.input_from == "price"
    assert WF.has_children and list(SCHEMA.iter_errors(PARENT)) == []
    in_code = Workflow("order")
    in_code.step(name="price", type="price")(lambda ctx: None)
    in_code.child(
        "ship",
        workflow=Workflow("shipping"),
        input_from="price",
        after=["price"],
        timeout="5s",
        retry=None,
    )
    in_code.step(name="notify", type="notify", after=["ship"])(lambda ctx: None)
    expected = parse_workflow(
        {
            **PARENT,
            "steps": [
                {**s, "retry": {"max_attempts": 1}} if s["name"] == "ship" else s
                for s in PARENT["steps"]
            ],
        }
    )
    assert in_code.definition() == expected
    default = parse_workflow(
        {"name": "p", "version": 1, "steps": [{"name": "c", "kind": "workflow", "workflow": "x"}]}
    )
    assert default.step("c").timeout_ms == CHILD_TIMEOUT_MS


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"name": "c", "kind": "workflow"}, "missing required field 'workflow'"),
        ({"name": "c", "kind": "workflow", "workflow": "x", "type": "t"}, "unknown field"),
        ({"name": "c", "kind": "workflow", "workflow": "x", "input_from": "a"}, "must be one of"),
        ({"name": "c", "kind": "workflow", "workflow": "p"}, "a run of this workflow itself"),
    ],
)
def test_a_wrong_workflow_step_is_refused(step: dict[str, Any], message: str) -> None:
    raw = {"name": "p", "version": 1, "steps": [step]}
    with pytest.raises(ValidationError, match=message):
        parse_workflow(raw)


def test_an_attempt_starts_its_child_and_the_childs_end_is_its_result() -> None:
    before, after = _shipping()
    assert children_started("o-1", WF, before, after) == [
        ChildStart("o-1/ship#1", "ship", 1, "shipping", None, "price", 1)
    ]
    # Ticked again (a redelivery, a conflict's retry): the attempt is in flight, no new child.
    assert children_started("o-1", WF, after, after) == []
    ended = tick(after, WF, [StepResult("ship", 1, StepOutcome.SUCCEEDED)], (), 5)
    assert ended.new_state is not None
    assert ended.new_state.node("ship").status is NodeStatus.SUCCEEDED
    assert [d.node for d in ended.dispatches] == ["notify"]
    assert children_to_cancel("o-1", WF, after, ended.new_state) == []


def test_a_child_that_outlives_its_step_is_cancelled_and_a_new_one_started() -> None:
    _, after = _shipping()
    deadline = after.node("ship").due_ms
    assert deadline is not None
    timed_out = tick(after, WF, (), (), deadline).new_state
    assert timed_out is not None and timed_out.node("ship").status is NodeStatus.RETRY_WAIT
    assert children_to_cancel("o-1", WF, after, timed_out) == ["o-1/ship#1"]
    due = timed_out.node("ship").due_ms
    assert due is not None
    again = tick(timed_out, WF, (), (), due).new_state
    assert again is not None
    assert [c.run_id for c in children_started("o-1", WF, timed_out, again)] == ["o-1/ship#2"]


def test_a_parent_cancelled_or_failed_cancels_its_child_in_flight() -> None:
    _, after = _shipping()
    cancelled = tick(after, WF, (), [SignalKind.CANCEL], 3).new_state
    assert cancelled is not None and cancelled.status is RunStatus.CANCELLED
    assert children_to_cancel("o-1", WF, after, cancelled) == ["o-1/ship#1"]


def test_a_child_run_id_stays_within_the_bound() -> None:
    long = child_run_id("r" * MAX_RUN_ID_LENGTH, "step", 3)
    assert len(long) <= MAX_RUN_ID_LENGTH and long != child_run_id(
        "r" * MAX_RUN_ID_LENGTH, "step", 4
    )
    assert child_run_id("o-1", "ship", 2) == "o-1/ship#2"


@given(
    st.lists(
        st.tuples(st.integers(1, 3), st.sampled_from(list(StepOutcome)), st.integers(0, 6000)),
        max_size=8,
    )
)
def test_one_child_per_attempt_and_its_end_applied_once(
    events: list[tuple[int, StepOutcome, int]],
) -> None:
    """Whatever results come for ``ship`` (stale, duplicate, of attempts that never ran), at
    whatever times: each attempt dispatched starts exactly one child, every child started is
    of an attempt dispatched, and an attempt's result changes the node at most once."""
    state = _shipping()[1]
    started = {1}
    stored: list[StepResult] = [StepResult("price", 1, StepOutcome.SUCCEEDED)]
    applied: list[int] = []
    now = 10
    for attempt, outcome, step in events:
        now += step
        stored.append(StepResult("ship", attempt, outcome))
        decision = tick(state, WF, stored, (), now)
        if decision.new_state is None:
            continue
        new = decision.new_state
        for child in children_started("o", WF, state, new):
            assert child.attempt not in started
            started.add(child.attempt)
        old_ship, new_ship = state.node("ship"), new.node("ship")
        if old_ship.status is NodeStatus.DISPATCHED and new_ship != old_ship:
            applied.append(old_ship.attempt)
        state = new
    assert len(applied) == len(set(applied))
    assert started <= set(range(1, 3))
