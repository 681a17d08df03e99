"""Map steps in the pure tick and the definitions: a map over a dependency's list or the run's
input dispatches one attempt of its step type per item, at most ``parallelism`` in flight,
retries each item by the step's policy, takes each item that succeeded out of the state (named
with its attempt, for the commit to record), ends succeeded when all did, fails when an item
fails for good or its list is not one; the same in code and in JSON; a Hypothesis property:
whatever results come, in whatever order and however often, each item's result is applied
once, no more items are in the state than the bound, and a map that ended had every item
recorded once."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor import Retry, StepContext, Workflow
from processor.core.model import StepOutcome, StepResult
from processor.core.run_state import (
    MapProgress,
    NodeStatus,
    RunState,
    RunStatus,
    initial_state,
    state_from_row,
)
from processor.core.step_task import MapItem, StepData, StepTask, decode_step_task
from processor.core.tick import tick
from processor.core.tick_decision import NOOP
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import ValidationError
from processor.io.shipped.workflow_schema import workflow_validator
from processor.worker.steps import context_of

SCHEMA = workflow_validator()  # the schema the package ships, as `workflows register` checks it
RAW: dict[str, Any] = {
    "name": "images",
    "version": 1,
    "steps": [
        {"name": "list", "type": "list_images"},
        {
            "name": "resize",
            "kind": "map",
            "type": "resize_image",
            "items_from": "list",
            "depends_on": ["list"],
            "parallelism": 2,
            "max_items": 5,
            "retry": {"max_attempts": 2, "backoff_ms": 10},
        },
        {"name": "publish", "type": "publish", "depends_on": ["resize"]},
    ],
    "output": "resize",
}
WF = parse_workflow(RAW)
LISTED = StepResult("list", 1, StepOutcome.SUCCEEDED, length=4)


def _listed(length: int | None = 4) -> tuple[RunState, Any]:
    first = tick(initial_state(WF), WF, (), (), 0).new_state
    assert first is not None
    listed = StepResult("list", 1, StepOutcome.SUCCEEDED, length=length)
    decision = tick(first, WF, [listed], (), 10)
    return first, decision


def test_a_map_step_is_defined_in_json_and_in_code() -> None:
    resize = WF.step("resize")
    assert resize.maps and resize.items_from == "list" and resize.parallelism == 2
    assert WF.has_maps and WF.step_for("resize[3]") is resize
    with pytest.raises(KeyError):
        WF.step_for("list[0]")  # not a map
    assert list(SCHEMA.iter_errors(RAW)) == []
    images = Workflow("images", output="resize")

    @images.step(name="list")
    def list_images(ctx: StepContext) -> list[str]:
        return []

    @images.map(
        name="resize",
        items_from=list_images,
        parallelism=2,
        max_items=5,
        retry=Retry(2, backoff=10),
    )
    def resize_image(ctx: StepContext) -> str:
        return str(ctx.item)

    @images.step(after=[resize_image])
    def publish(ctx: StepContext) -> None:
        return None

    assert images.definition() == WF
    assert list(SCHEMA.iter_errors(images.to_json())) == []


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"name": "m", "kind": "map", "type": "t", "items_from": "x"}, "must be one of the steps"),
        ({"name": "m", "kind": "map", "type": "t", "parallelism": 0}, "parallelism: must be"),
        ({"name": "m", "kind": "map", "type": "t", "max_items": 10001}, "max_items: must be"),
        ({"name": "m", "kind": "map"}, "missing required field 'type'"),
        ({"name": "m[0]", "kind": "map", "type": "t"}, "names no step with '\\['"),
    ],
)
def test_a_wrong_map_step_is_refused(step: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        parse_workflow({"name": "x", "version": 1, "steps": [step]})


def test_its_items_are_dispatched_within_the_parallelism_and_it_ends_in_order() -> None:
    _, decision = _listed()
    state = decision.new_state
    assert state is not None
    assert [d.node for d in decision.dispatches] == ["resize[0]", "resize[1]"]
    assert {d.step_type for d in decision.dispatches} == {"resize_image"}
    # Only the items in flight are nodes of the state; the map counts the rest.
    assert [n for n, _ in state.nodes] == ["list", "resize", "resize[0]", "resize[1]", "publish"]
    assert state.maps == (("resize", MapProgress(4, 2)),)
    # Read back from its row: the same state, items and counters.
    again = state_from_row(state.status, state.nodes_json(), state.seq, state.reason, WF)
    assert again == state
    results = [LISTED, StepResult("resize[1]", 1, StepOutcome.SUCCEEDED)]
    step2 = tick(state, WF, results, (), 20)
    assert step2.new_state is not None and [d.node for d in step2.dispatches] == ["resize[2]"]
    assert step2.items_done == (("resize", 1, 1),)  # out of the state, recorded by the commit
    assert [n for n, _ in step2.new_state.nodes] == [
        "list", "resize", "resize[0]", "resize[2]", "publish"
    ]  # fmt: skip
    results += [StepResult(f"resize[{i}]", 1, StepOutcome.SUCCEEDED) for i in (0, 2, 3)]
    done = tick(step2.new_state, WF, results, (), 30)
    assert done.new_state is not None
    assert [d.node for d in done.dispatches] == ["resize[3]"]
    assert done.items_done == (("resize", 0, 1), ("resize", 2, 1))
    final = tick(done.new_state, WF, results, (), 40)
    assert final.new_state is not None
    assert final.new_state.node("resize").status is NodeStatus.SUCCEEDED
    assert final.items_done == (("resize", 3, 1),)
    assert final.mapped == (("resize", 1, 4),)  # the commit reads the four items, in order
    assert [d.node for d in final.dispatches] == ["publish"]


def test_an_item_is_retried_by_the_policy_and_one_failing_for_good_fails_the_run() -> None:
    _, decision = _listed()
    state = decision.new_state
    assert state is not None
    failed = [LISTED, StepResult("resize[0]", 1, StepOutcome.FAILED, "boom")]
    waiting = tick(state, WF, failed, (), 20).new_state
    assert waiting is not None and waiting.node("resize[0]").status is NodeStatus.RETRY_WAIT
    retried = tick(waiting, WF, failed, (), 100)
    assert [(d.node, d.attempt) for d in retried.dispatches][:1] == [("resize[0]", 2)]
    assert retried.new_state is not None
    twice = [*failed, StepResult("resize[0]", 2, StepOutcome.FAILED, "boom again")]
    ended = tick(retried.new_state, WF, twice, (), 200).new_state
    assert ended is not None and ended.status is RunStatus.FAILED
    assert ended.reason == "step 'resize[0]' failed after 2 attempt(s): boom again"


@pytest.mark.parametrize(
    ("length", "reason"),
    [
        (None, "the output of 'list' is not a list"),
        (6, "the output of 'list' has 6 items, more than max_items (5)"),
    ],
)
def test_a_map_without_its_list_fails(length: int | None, reason: str) -> None:
    _, decision = _listed(length)
    assert decision.new_state is not None and decision.new_state.status is RunStatus.FAILED
    assert decision.new_state.reason == f"step 'resize' failed after 1 attempt(s): {reason}"


def test_an_empty_list_ends_the_map_at_once_and_what_follows_starts() -> None:
    _, decision = _listed(0)
    assert decision.new_state is not None
    assert decision.new_state.node("resize").status is NodeStatus.SUCCEEDED
    assert decision.mapped == (("resize", 1, 0),)
    assert [d.node for d in decision.dispatches] == ["publish"]


def test_a_map_over_the_input_and_the_item_a_worker_hands_its_function() -> None:
    over_input = parse_workflow(
        {"name": "i", "version": 1, "steps": [{"name": "m", "kind": "map", "type": "t"}]}
    )
    decision = tick(initial_state(over_input), over_input, (), (), 0, input_length=3)
    assert [d.node for d in decision.dispatches] == ["m[0]", "m[1]", "m[2]"]
    assert tick(initial_state(over_input), over_input, (), (), 0).new_state is not None
    task = StepTask("r", "m[2]", 1, "t", 10, item=MapItem(None, 2))
    assert decode_step_task(task.encode()) == task
    ctx = context_of(task, StepData(["a", "b", "c"]))
    assert (ctx.item, ctx.index) == ("c", 2)
    assert decision.new_state is not None
    assert tick(decision.new_state, over_input, (), (), 1, input_length=3) == NOOP


@given(
    st.integers(0, 5),
    st.integers(0, 2**32 - 1),
    st.lists(st.tuples(st.integers(0, 5), st.integers(1, 2), st.booleans()), max_size=30),
)
def test_each_item_is_applied_once_within_the_bound_and_ends_in_order(
    length: int, seed: int, answers: list[tuple[int, int, bool]]
) -> None:
    rng = random.Random(seed)
    _, decision = _listed(length)
    state = decision.new_state
    assert state is not None
    stored = [StepResult("list", 1, StepOutcome.SUCCEEDED, length=length)]
    now = 20
    applied: list[tuple[str, int]] = []
    mapped: list[Any] = list(decision.mapped)
    recorded: list[tuple[str, int, int]] = list(decision.items_done)
    for index, attempt, ok in answers:
        outcome = StepOutcome.SUCCEEDED if ok else StepOutcome.FAILED
        stored.append(StepResult(f"resize[{index}]", attempt, outcome, None if ok else "no"))
        rng.shuffle(stored)
        now += rng.choice([1, 50, 5_000])
        decision = tick(state, WF, stored, (), now)
        if decision.new_state is None:
            continue
        new = decision.new_state
        after = new.node_map()
        for name, old in state.nodes:
            item = name.startswith("resize[")
            if item and old.status is NodeStatus.DISPATCHED and after.get(name) != old:
                applied.append((name, old.attempt))
        busy = (NodeStatus.DISPATCHED, NodeStatus.RETRY_WAIT)
        in_flight = [n for n, s in new.nodes if n.startswith("resize[") and s.status in busy]
        assert new.status.terminal or len(in_flight) <= 2
        # The state holds the items in flight only, never the list.
        assert len([n for n, _ in new.nodes if n.startswith("resize[")]) <= 2
        for _, done, done_attempt in decision.items_done:
            # An item recorded is one that succeeded, with the attempt that did.
            assert state.node(f"resize[{done}]").attempt == done_attempt
            assert f"resize[{done}]" not in after
        recorded += decision.items_done
        mapped += decision.mapped
        state = new
        if state.status.terminal:
            break
    assert len(applied) == len(set(applied))
    assert len(mapped) <= 1
    indices = [index for _, index, _ in recorded]
    assert len(indices) == len(set(indices))  # each item recorded once
    if mapped:
        assert mapped[0] == ("resize", 1, length)
        assert sorted(indices) == list(range(length))  # every item, before the map ended
