"""Wait steps and the signals that carry data, in the pure tick and the definitions: a wait
step in flight ends with the first signal of its name (sent before it began waiting or after),
at once and with what follows it when its signal came first; it times out as its policy says;
its end is applied once; no worker is sent anything for it. Hypothesis: whatever signals come,
in whatever batches, a wait step ends once, with the first of its name."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor import Workflow
from processor.core.model import SignalKind, StepOutcome, StepResult
from processor.core.run_state import NodeStatus, RunState, RunStatus, initial_state
from processor.core.tick import tick
from processor.core.tick_decision import NOOP
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WAIT_TIMEOUT_MS, ValidationError
from processor.io.shipped.workflow_schema import workflow_validator

SCHEMA = workflow_validator()  # the schema the package ships, as `workflows register` checks it

APPROVAL: dict[str, Any] = {
    "name": "approval",
    "version": 1,
    "steps": [
        {"name": "price", "type": "price"},
        {"name": "approve", "kind": "wait", "signal": "approved", "depends_on": ["price"]},
        {"name": "confirm", "type": "confirm", "depends_on": ["approve"]},
    ],
    "output": {"approval": "approve", "confirmation": "confirm"},
}
WF = parse_workflow(APPROVAL)


def _priced(now: int = 0) -> RunState:
    """The run with price done: ``approve`` waiting (dispatched, no task sent)."""
    first = tick(initial_state(WF), WF, (), (), now).new_state
    assert first is not None

    done = tick(first, WF, [StepResult("price", 1, StepOutcome.SUCCEEDED)], (), now + 1)
    assert done.new_state is not None and done.dispatches == ()
    assert done.new_state.node("approve").status is NodeStatus.DISPATCHED
    return done.new_state


def test_a_wait_step_is_defined_with_its_signal_and_matches_the_schema() -> None:
    step = WF.step("approve")
    assert step.waits and step.signal == "approved" and step.step_type == ""
    assert step.timeout_ms == WAIT_TIMEOUT_MS and step.retry.max_attempts == 1
    assert list(SCHEMA.iter_errors(APPROVAL)) == []
    in_code = Workflow("approval", output={"approval": "approve", "confirmation": "confirm"})
    in_code.step(name="price", type="price")(lambda ctx: None)
    in_code.wait("approve", signal="approved", after=["price"], timeout="7d")
    in_code.step(name="confirm", type="confirm", after=["approve"])(lambda ctx: None)
    assert in_code.definition() == WF
    assert list(SCHEMA.iter_errors(in_code.to_json())) == []


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"name": "w", "kind": "wait"}, "missing required field 'signal'"),
        ({"name": "w", "kind": "wait", "signal": "ok", "type": "t"}, "unknown field(s) type"),
        ({"name": "w", "kind": "wait", "signal": "cancel"}, "'cancel' cancels the run"),
        ({"name": "w", "kind": "wait", "signal": "no way"}, "must be 1 to 100 letters"),
        (
            {"name": "w", "kind": "nap", "type": "t"},
            "must be 'task', 'wait', 'workflow', 'map' or 'sleep'",
        ),
    ],
)
def test_a_wrong_wait_step_is_refused(step: dict[str, Any], message: str) -> None:
    raw = {"name": "x", "version": 1, "steps": [step]}
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_workflow(raw)
    assert list(SCHEMA.iter_errors(raw)) != []


def test_a_signal_sent_while_it_waits_ends_it_and_starts_what_follows() -> None:
    waiting = _priced()
    assert tick(waiting, WF, (), (), 5, named=[("other", "s-0")]) == NOOP
    decision = tick(waiting, WF, (), (), 5, named=[("other", "s-0"), ("approved", "s-1")])
    assert decision.new_state is not None
    assert decision.new_state.node("approve").status is NodeStatus.SUCCEEDED
    assert decision.signalled == (("approve", 1, "s-1"),)
    assert [d.node for d in decision.dispatches] == ["confirm"]
    # Applied once: the same signals again (and more of the name) change nothing more.
    again = tick(
        decision.new_state, WF, (), (), 6, named=[("approved", "s-1"), ("approved", "s-2")]
    )
    assert again == NOOP


def test_a_signal_sent_before_it_began_waiting_ends_it_in_the_same_tick() -> None:
    first = tick(initial_state(WF), WF, (), (), 0, named=[("approved", "early")]).new_state
    assert first is not None and first.node("approve").status is NodeStatus.PENDING

    decision = tick(
        first,
        WF,
        [StepResult("price", 1, StepOutcome.SUCCEEDED)],
        (),
        1,
        named=[("approved", "early")],
    )
    assert decision.new_state is not None
    assert decision.new_state.node("approve").status is NodeStatus.SUCCEEDED
    assert decision.signalled == (("approve", 1, "early"),)
    assert [d.node for d in decision.dispatches] == ["confirm"]


def test_the_first_of_its_name_wins_and_a_wait_times_out_as_its_policy_says() -> None:
    waiting = _priced()
    decision = tick(waiting, WF, (), (), 5, named=[("approved", "b"), ("approved", "a")])
    assert decision.signalled == (("approve", 1, "b"),)  # received first, whatever its id
    deadline = waiting.node("approve").due_ms
    assert deadline is not None
    late = tick(waiting, WF, (), (), deadline)
    assert late.new_state is not None and late.new_state.status is RunStatus.FAILED
    assert "attempt 1 timed out" in (late.new_state.reason or "")
    # A signal received by then is applied first: it came in time.
    in_time = tick(waiting, WF, (), (), deadline, named=[("approved", "s")])
    assert in_time.new_state is not None and in_time.new_state.status is RunStatus.RUNNING


def test_a_wait_that_ends_the_run_names_its_signal_and_a_cancel_still_wins() -> None:
    last = parse_workflow(
        {
            "name": "ends",
            "version": 1,
            "steps": [{"name": "w", "kind": "wait", "signal": "go"}],
            "output": "w",
        }
    )
    waiting = tick(initial_state(last), last, (), (), 0).new_state
    assert waiting is not None and waiting.status is RunStatus.RUNNING
    ended = tick(waiting, last, (), (), 1, named=[("go", "g-1")])
    assert ended.new_state is not None and ended.new_state.status is RunStatus.SUCCEEDED
    assert ended.signalled == (("w", 1, "g-1"),)
    cancelled = tick(waiting, last, (), [SignalKind.CANCEL], 1, named=[("go", "g-1")])
    assert cancelled.new_state is not None
    assert cancelled.new_state.status is RunStatus.CANCELLED and cancelled.signalled == ()


@given(
    st.lists(
        st.lists(
            st.tuples(st.sampled_from(["approved", "other"]), st.integers(0, 5).map(str)),
            max_size=3,
        ),
        min_size=1,
        max_size=6,
    )
)
def test_a_wait_ends_once_with_the_first_signal_of_its_name(batches: list[list[Any]]) -> None:
    state = _priced()
    received: list[tuple[str, str]] = []
    ended: list[tuple[str, int, str]] = []
    for i, batch in enumerate(batches):
        for signal in batch:
            if signal[1] not in {sid for _, sid in received}:  # (an id is recorded once)
                received.append(signal)
        decision = tick(state, WF, (), (), 10 + i, named=received)
        ended += decision.signalled
        if decision.new_state is not None:
            state = decision.new_state
    firsts = [sid for name, sid in received if name == "approved"]
    if firsts:
        assert ended == [("approve", 1, firsts[0])]
        assert state.node("approve").status is NodeStatus.SUCCEEDED
    else:
        assert ended == [] and state.node("approve").status is NodeStatus.DISPATCHED
