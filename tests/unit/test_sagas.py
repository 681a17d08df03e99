"""Compensation (a saga) in the pure tick, the definitions and the code-first API
(core/sagas.py, core/tick.py rule 2c).

A run that fails or is cancelled runs the compensation of each step that succeeded, one at a
time, the last done first, each retried by its own policy, and then ends as it was to end,
saying whether its compensation completed. Hypothesis: for any walk of results, failures,
duplicate deliveries, cancels and clocks, a compensation is dispatched only for a step that
succeeded, in reverse order of completion, one at a time, once per attempt; the saga never
starts again; ticks are deterministic and duplicate inputs change nothing; a terminal run
absorbs everything; a run whose saga ended says what became of it.
"""

from __future__ import annotations

import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import Compensate, Retry, Workflow
from processor.core.deadlines import RunDeadline
from processor.core.effects import transition_sends
from processor.core.model import LoadedRun, RunInput, SignalKind, StepOutcome, StepResult
from processor.core.routing import TopicNames
from processor.core.run_ends import force_fail
from processor.core.run_state import (
    NodeStatus,
    RunState,
    RunStatus,
    initial_state,
    state_checksum,
    state_from_row,
    undo_order,
)
from processor.core.sagas import CANCEL_REASON, Compensation, compensation_of, undoing
from processor.core.tick import tick
from processor.core.tick_decision import NOOP, Decision
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import ValidationError, WorkflowDef
from processor.io.shipped.workflow_schema import workflow_validator
from tests.unit.strategies import seeds, workflow_json

SCHEMA = workflow_validator()
OK, FAILED = StepOutcome.SUCCEEDED, StepOutcome.FAILED

TRIP: dict[str, Any] = {
    "name": "trip",
    "version": 1,
    "steps": [
        {"name": "flight", "type": "book_flight", "compensate": {"type": "cancel_flight"}},
        {
            "name": "hotel",
            "type": "book_hotel",
            "depends_on": ["flight"],
            "compensate": {"type": "cancel_hotel", "retry": {"max_attempts": 2, "backoff_ms": 50}},
        },
        {"name": "car", "type": "book_car", "depends_on": ["hotel"], "retry": {"max_attempts": 1}},
    ],
}
WF = parse_workflow(TRIP)


class Walk:
    """A run of ``wf`` ticked step by step, as a processor would."""

    def __init__(self, wf: WorkflowDef = WF, now: int = 1_000) -> None:
        self.wf, self.now = wf, now
        self.state = initial_state(wf)
        self.results: list[StepResult] = []
        self.dispatched: list[tuple[str, int]] = []
        self.tick()

    def tick(self, *results: StepResult, cancel: bool = False, later: int = 10) -> Decision:
        self.now += later
        self.results += results
        signals = [SignalKind.CANCEL] if cancel else []
        decision = tick(self.state, self.wf, self.results, signals, self.now)
        if decision.new_state is not None:
            self.state = decision.new_state
        self.dispatched += [(d.node, d.attempt) for d in decision.dispatches]
        return decision

    def status(self, node: str) -> NodeStatus:
        return self.state.node(node).status


# -- the definitions and the doors ------------------------------------------------------------


def test_a_compensation_is_parsed_written_back_and_validated() -> None:
    SCHEMA.validate(TRIP)
    hotel = WF.step("hotel")
    assert hotel.compensate is not None
    assert hotel.compensate.name == "undo(hotel)"
    assert hotel.compensate.step_type == "cancel_hotel"
    assert hotel.compensate.depends_on == ("hotel",)
    assert hotel.compensate.retry.max_attempts == 2
    assert WF.step_map["undo(flight)"].step_type == "cancel_flight"
    assert parse_workflow(workflow_to_json(WF)) == WF
    assert list(SCHEMA.iter_errors(workflow_to_json(WF))) == []
    car = {"name": "car", "type": "book_car"}
    assert WF.compensates and not parse_workflow({**TRIP, "steps": [car]}).compensates


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"name": "w", "kind": "wait", "signal": "s", "compensate": {"type": "x"}}, "compensate"),
        ({"name": "m", "kind": "map", "type": "t", "compensate": {"type": "x"}}, "only a task"),
        ({"name": "t", "type": "t", "compensate": "x"}, "expected an object"),
        ({"name": "t", "type": "t", "compensate": {"type": "x", "when": "true"}}, "when"),
        ({"name": "t", "type": "t", "compensate": {}}, "type"),
    ],
)
def test_a_wrong_compensation_is_refused_by_parser_and_schema(
    step: dict[str, Any], message: str
) -> None:
    raw = {"name": "w", "version": 1, "steps": [step]}
    with pytest.raises(ValidationError, match=message):
        parse_workflow(raw)
    assert not SCHEMA.is_valid(raw)


def test_a_workflow_with_compensations_names_no_step_undo() -> None:
    steps = [*TRIP["steps"], {"name": "undo(car)", "type": "t"}]
    with pytest.raises(ValidationError, match=r"names no step undo"):
        parse_workflow({**TRIP, "steps": steps})
    parse_workflow({"name": "w", "version": 1, "steps": [{"name": "undo(x)", "type": "t"}]})


def test_a_compensation_in_code_is_its_json_and_its_function_is_registered() -> None:
    wf = Workflow("trip")

    def cancel_flight(ctx: Any) -> None:
        return None

    @wf.step(compensate=cancel_flight)
    def flight(ctx: Any) -> None:
        return None

    @wf.step(after=[flight], compensate="cancel_hotel")
    def hotel(ctx: Any) -> None:
        return None

    raw = wf.to_json()
    assert raw["steps"][0]["compensate"]["type"] == "cancel_flight"
    assert raw["steps"][1]["compensate"]["type"] == "cancel_hotel"
    assert wf.registry.get("cancel_flight") is cancel_flight
    assert wf.definition() == parse_workflow(raw)
    assert list(SCHEMA.iter_errors(raw)) == []


# -- the rule, by example ---------------------------------------------------------------------


def test_a_failed_run_undoes_its_succeeded_steps_last_first_then_ends_failed() -> None:
    walk = Walk()
    walk.tick(StepResult("flight", 1, OK))
    walk.tick(StepResult("hotel", 1, OK))
    failing = walk.tick(StepResult("car", 1, FAILED, "no cars"))
    assert walk.state.status is RunStatus.RUNNING and undoing(walk.state)
    assert walk.state.reason == "step 'car' failed after 1 attempt(s): no cars"
    assert [d.node for d in failing.dispatches] == ["undo(hotel)"]
    assert walk.status("undo(flight)") is NodeStatus.PENDING
    assert compensation_of(walk.state, WF) == Compensation("running")
    # Its first attempt fails: retried by its own policy, and nothing else starts meanwhile.
    retried = walk.tick(StepResult("undo(hotel)", 1, FAILED, "busy"))
    assert retried.timers and walk.status("undo(hotel)") is NodeStatus.RETRY_WAIT
    walk.tick(later=100)
    walk.tick(StepResult("undo(hotel)", 2, OK))
    walk.tick(StepResult("undo(flight)", 1, OK))
    assert walk.state.status.terminal and walk.state.status.value == "failed"
    assert walk.state.reason == "step 'car' failed after 1 attempt(s): no cars"
    assert compensation_of(walk.state, WF) == Compensation("completed")
    assert walk.dispatched[-3:] == [("undo(hotel)", 1), ("undo(hotel)", 2), ("undo(flight)", 1)]
    assert walk.tick(StepResult("undo(flight)", 1, OK), cancel=True) == NOOP


def test_a_cancel_undoes_what_succeeded_and_a_second_cancel_changes_nothing() -> None:
    walk = Walk()
    walk.tick(StepResult("flight", 1, OK))
    cancelled = walk.tick(cancel=True)
    assert [d.node for d in cancelled.dispatches] == ["undo(flight)"]
    assert walk.status("hotel") is NodeStatus.CANCELLED  # in flight: cancelled, not undone
    assert [n for n, _ in walk.state.nodes][-1] == "undo(flight)"
    before = walk.state
    assert walk.tick(StepResult("hotel", 1, OK), cancel=True) == NOOP  # late, and again
    assert walk.state == before
    walk.tick(StepResult("undo(flight)", 1, OK), cancel=True)
    assert walk.state.status is RunStatus.CANCELLED
    assert walk.state.reason == CANCEL_REASON
    assert compensation_of(walk.state, WF) == Compensation("completed")
    assert walk.dispatched.count(("undo(flight)", 1)) == 1


def test_a_compensation_that_fails_for_good_stops_the_saga_and_says_where() -> None:
    walk = Walk()
    walk.tick(StepResult("flight", 1, OK))
    walk.tick(StepResult("hotel", 1, OK))
    walk.tick(StepResult("car", 1, FAILED, "no cars"))
    walk.tick(StepResult("undo(hotel)", 1, FAILED, "hotel closed"))
    walk.tick(later=1_000)
    walk.tick(StepResult("undo(hotel)", 2, FAILED, "hotel closed"))
    assert walk.state.status is RunStatus.FAILED
    assert walk.status("undo(flight)") is NodeStatus.CANCELLED  # never run
    assert ("undo(flight)", 1) not in walk.dispatched
    compensation = compensation_of(walk.state, WF)
    assert compensation == Compensation("failed", "hotel", "hotel closed")
    assert str(compensation) == "failed (undoing 'hotel': hotel closed)"


def test_a_run_with_nothing_to_undo_ends_at_once() -> None:
    walk = Walk()
    walk.tick(StepResult("flight", 1, FAILED, "x"), later=0)
    walk.tick(later=1_000)
    walk.tick(StepResult("flight", 2, FAILED, "x"))
    walk.tick(later=1_000)
    walk.tick(StepResult("flight", 3, FAILED, "x"))
    assert walk.state.status is RunStatus.FAILED
    assert compensation_of(walk.state, WF) == Compensation("none")
    assert not any(n.startswith("undo(") for n, _ in walk.state.nodes)


def test_a_deadline_passed_during_the_saga_changes_nothing_and_force_fail_skips_it() -> None:
    walk = Walk()
    walk.tick(StepResult("flight", 1, OK))
    deadline = RunDeadline(walk.now + 5, 5)
    walk.now += 10
    began = tick(walk.state, WF, walk.results, (), walk.now, deadline=deadline)
    assert began.new_state is not None and undoing(began.new_state)
    assert began.new_state.reason == "run deadline of 5 ms passed"
    again = tick(began.new_state, WF, walk.results, (), walk.now + 50, deadline=deadline)
    assert again == NOOP
    forced = force_fail(began.new_state, "stuck")
    assert forced is not None and forced.status is RunStatus.FAILED
    assert compensation_of(forced, WF) == Compensation("stopped")


def test_a_state_in_its_saga_reads_back_from_its_row() -> None:
    walk = Walk()
    walk.tick(StepResult("flight", 1, OK))
    walk.tick(StepResult("hotel", 1, OK))
    walk.tick(StepResult("car", 1, FAILED, "x"))
    state = walk.state
    row = state_from_row(state.status, state.nodes_json(), state.seq, state.reason, WF)
    assert row == state
    assert state_checksum(row) == state_checksum(state)
    assert state.node("hotel").done_seq == 3 and state.node("flight").done_seq == 2


def test_steps_done_in_the_same_transition_are_undone_later_in_the_definition_first() -> None:
    wf = parse_workflow(
        {
            "name": "pair",
            "version": 1,
            "steps": [
                {"name": "a", "type": "t", "compensate": {"type": "u"}},
                {"name": "b", "type": "t", "compensate": {"type": "u"}},
                {"name": "c", "type": "t", "depends_on": ["a", "b"], "retry": {"max_attempts": 1}},
            ],
        }
    )
    walk = Walk(wf)
    walk.tick(StepResult("a", 1, OK), StepResult("b", 1, OK))
    walk.tick(StepResult("c", 1, FAILED, "x"))
    assert undo_order(wf, walk.state.node_map()) == ["b", "a"]
    assert walk.dispatched[-1] == ("undo(b)", 1)


# -- the properties ---------------------------------------------------------------------------


def _answer(rng: random.Random, state: RunState, stored: dict[tuple[str, int], StepResult]) -> None:
    for name, node in state.nodes:
        if node.status is NodeStatus.DISPATCHED and rng.random() < 0.6:
            ok = rng.random() < (0.75 if not name.startswith("undo(") else 0.6)
            result = StepResult(name, node.attempt, OK if ok else FAILED, None if ok else "boom")
            stored.setdefault((name, node.attempt), result)


def _check_tick(state: RunState, wf: WorkflowDef, decision: Decision, inputs: Any) -> None:
    """What every tick of the walk keeps: determinism, duplicate inputs change nothing."""
    results, signals, now = inputs
    assert tick(state, wf, results, signals, now) == decision
    assert tick(state, wf, [*results, *results], [*signals, *signals], now) == decision
    new = decision.new_state
    if new is not None:
        assert new.seq == state.seq + 1
        row = state_from_row(new.status, new.nodes_json(), new.seq, new.reason, wf)
        assert row == new


@settings(max_examples=150, deadline=None)
@given(workflow_json(compensate=True), seeds)
def test_any_walk_undoes_only_what_succeeded_last_first_once_per_attempt(
    raw: dict[str, Any], seed: int
) -> None:
    wf = parse_workflow(raw)
    rng = random.Random(seed)
    state, now = initial_state(wf), 0
    stored: dict[tuple[str, int], StepResult] = {}
    sent: list[tuple[str, int]] = []
    expected: list[str] | None = None  # the steps the saga undoes, in order, once it began
    for _ in range(80):
        _answer(rng, state, stored)
        now += rng.choice([0, 5, 50, 500, 5_000])
        signals = [SignalKind.CANCEL] if rng.random() < 0.04 else []
        decision = tick(state, wf, list(stored.values()), signals, now)
        _check_tick(state, wf, decision, (list(stored.values()), signals, now))
        sent += [(d.node, d.attempt) for d in decision.dispatches]
        new = decision.new_state or state
        saga = [n for n, _ in new.nodes if n.startswith("undo(")]
        if (saga or undoing(new)) and expected is None:  # it began: the last done first
            expected = undo_order(wf, new.node_map())
            assert saga == [f"undo({s})" for s in expected]
            assert all(new.node(s).status is NodeStatus.SUCCEEDED for s in expected)
            done = [new.node(s).done_seq or 0 for s in expected]
            assert done == sorted(done, reverse=True)  # the last done, undone first
        elif expected is not None:  # it never begins again, nor changes what it undoes
            assert saga == [f"undo({s})" for s in expected]
        handled = [n for n, _ in new.nodes if n == "on_failure" and wf.on_failure is not None]
        if handled:  # a failure's handler, never a cancel's; it begins with the saga
            assert (new.reason != CANCEL_REASON and expected is not None) or not saga
        in_flight = [n for n in [*handled, *saga] if new.node(n).status is NodeStatus.DISPATCHED]
        assert len(in_flight) <= 1  # one at a time
        state = new
        if state.status.terminal:
            break
    undos = [n for n, _ in sent if n.startswith("undo(")]
    assert len(set(sent)) == len(sent)  # each attempt dispatched once
    assert list(dict.fromkeys(undos)) == [f"undo({s})" for s in expected or []][: len(set(undos))]
    if state.status.terminal:
        assert tick(state, wf, list(stored.values()), [SignalKind.CANCEL], now + 1) == NOOP
        compensation = compensation_of(state, wf)
        assert (compensation.outcome == "none") == (not expected)
        assert compensation.outcome not in ("running", "stopped")
        if compensation.outcome == "completed":
            assert state.status in (RunStatus.FAILED, RunStatus.CANCELLED)


@settings(max_examples=100, deadline=None)
@given(st.data())
def test_workflows_without_compensations_tick_as_before(data: st.DataObject) -> None:
    wf = parse_workflow(data.draw(workflow_json()))
    assert not wf.compensates
    state = tick(initial_state(wf), wf, (), (), 0).new_state
    assert state is not None
    assert all(s.done_seq is None for _, s in state.nodes)
    assert compensation_of(state, wf) == Compensation("none")


# -- the failure handler ----------------------------------------------------------------------

HANDLED = parse_workflow(TRIP | {"on_failure": {"type": "page", "retry": {"max_attempts": 2}}})


def test_a_failure_handler_is_parsed_written_back_and_given_in_code() -> None:
    assert HANDLED.on_failure is not None
    assert HANDLED.on_failure.name == "on_failure"
    assert HANDLED.on_failure.depends_on == ("failure",)
    assert parse_workflow(workflow_to_json(HANDLED)) == HANDLED
    SCHEMA.validate(workflow_to_json(HANDLED))
    for name in ("failure", "on_failure", "undo(x)"):
        raw = {"name": "w", "version": 1, "on_failure": {"type": "p"}}
        with pytest.raises(ValidationError, match="names no step"):
            parse_workflow(raw | {"steps": [{"name": name, "type": "t"}]})
    with pytest.raises(ValidationError, match=r"workflow\.on_failure"):
        parse_workflow(TRIP | {"on_failure": {"type": "p", "compensate": {}}})
    assert not SCHEMA.is_valid(TRIP | {"on_failure": {"type": "p", "depends_on": []}})
    wf = Workflow("trip", on_failure=Compensate(_page, retry=Retry(2)))
    wf.step(name="flight", type="book_flight")(lambda ctx: None)
    assert wf.registry.get("_page") is _page
    assert wf.definition() == parse_workflow(wf.to_json())
    assert wf.to_json()["on_failure"]["retry"]["max_attempts"] == 2


def _page(ctx: Any) -> None:
    return None


def test_a_failed_run_runs_its_handler_with_the_failure_then_its_compensations() -> None:
    walk = Walk(HANDLED)
    walk.tick(StepResult("flight", 1, OK))
    walk.tick(StepResult("hotel", 1, OK))
    failing = walk.tick(StepResult("car", 1, FAILED, "no cars"))
    assert [d.node for d in failing.dispatches] == ["on_failure"]
    assert failing.settled == (
        (
            "failure",
            1,
            '{"attempt":1,"error":"no cars","reason":"step \'car\' failed after 1 attempt(s):'
            ' no cars","step":"car"}',
        ),
    )
    names = [n for n, _ in walk.state.nodes]
    assert names[3:] == ["failure", "on_failure", "undo(hotel)", "undo(flight)"]
    row = walk.state
    assert state_from_row(row.status, row.nodes_json(), row.seq, row.reason, HANDLED) == row
    # Its failure (its attempts spent) stops nothing: the compensations run after it.
    walk.tick(StepResult("on_failure", 1, FAILED, "pager down"))
    walk.tick(later=1_000)
    walk.tick(StepResult("on_failure", 2, FAILED, "pager down"))
    assert walk.status("on_failure") is NodeStatus.FAILED
    assert walk.dispatched[-1] == ("undo(hotel)", 1)
    walk.tick(StepResult("undo(hotel)", 1, OK))
    walk.tick(StepResult("undo(flight)", 1, OK))
    assert walk.state.status.terminal and walk.state.status.value == "failed"
    assert compensation_of(walk.state, HANDLED) == Compensation("completed")


def test_a_handler_runs_for_a_deadline_and_alone_but_never_for_a_cancel() -> None:
    car = {"name": "car", "type": "book_car", "retry": {"max_attempts": 1}}
    alone = parse_workflow(TRIP | {"steps": [car], "on_failure": {"type": "page"}})
    walk = Walk(alone)
    walk.tick(StepResult("car", 1, FAILED, "x"))
    assert walk.dispatched[-1] == ("on_failure", 1) and undoing(walk.state)
    walk.tick(StepResult("on_failure", 1, OK))
    assert walk.state.status.terminal
    assert compensation_of(walk.state, alone) == Compensation("none")
    cancelled = Walk(HANDLED)
    cancelled.tick(StepResult("flight", 1, OK), cancel=True)
    assert "on_failure" not in [n for n, _ in cancelled.state.nodes]
    late = Walk(HANDLED)
    late.now += 10
    began = tick(late.state, HANDLED, (), (), late.now, deadline=RunDeadline(late.now, 5))
    assert [d.node for d in began.dispatches] == ["on_failure"]
    assert '"step":null' in began.settled[0][2] and "run deadline of 5 ms" in began.settled[0][2]


def test_a_map_without_its_list_fails_its_run_into_the_handler_with_what_it_ended() -> None:
    wf = parse_workflow(
        {
            "name": "maps",
            "version": 1,
            "on_failure": {"type": "page"},
            "steps": [
                {"name": "a", "type": "t", "compensate": {"type": "u"}},
                {"name": "m", "kind": "map", "type": "t", "depends_on": ["a"]},
            ],
        }
    )
    state = tick(initial_state(wf), wf, (), (), 10).new_state
    assert state is not None
    decision = tick(state, wf, [StepResult("a", 1, OK)], (), 20, input_length=None)
    assert decision.new_state is not None and undoing(decision.new_state)
    assert [d.node for d in decision.dispatches] == ["on_failure"]
    assert [n for n, _, _ in decision.settled] == ["failure"]
    assert '"step":"m"' in decision.settled[0][2]
    assert [n for n, _ in decision.new_state.nodes][-3:] == ["failure", "on_failure", "undo(a)"]


def test_a_compensation_runs_its_own_version_never_its_step_s_pin() -> None:
    raw = {
        "name": "pinned",
        "version": 1,
        "on_failure": {"type": "page", "version": 4},
        "steps": [
            {"name": "a", "type": "t", "compensate": {"type": "u", "version": 3}},
            {"name": "b", "type": "t", "compensate": {"type": "v"}},
            {"name": "c", "type": "t", "depends_on": ["a", "b"], "retry": {"max_attempts": 1}},
        ],
    }
    wf = parse_workflow(raw)
    assert workflow_to_json(wf)["on_failure"]["version"] == 4
    state = tick(initial_state(wf), wf, (), (), 10, served={("default", "t"): 2}).new_state
    assert state is not None and dict(state.versions) == {"a": 2, "b": 2, "c": 2}
    walk = Walk(wf)
    walk.state = state
    run_input = RunInput({})
    sent: dict[str, Any] = {}
    for results in (
        [StepResult("a", 1, OK), StepResult("b", 1, OK)],
        [StepResult("c", 1, FAILED, "x")],
        [StepResult("on_failure", 1, OK)],
        [StepResult("undo(b)", 1, OK)],
    ):
        decision = walk.tick(*results)
        run = LoadedRun("r", wf, walk.state, 1, "t1", input=run_input)
        for send in transition_sends(run, decision, walk.now, TopicNames("d")):
            if send.value is not None and b"step_type" in send.value:
                task = orjson.loads(send.value)
                sent[task["node"]] = task.get("step_version", 1)
    assert sent == {"c": 2, "on_failure": 4, "undo(b)": 1, "undo(a)": 3}
