"""Run deadlines in the pure tick, the definitions and the doors (core/deadlines.py).

A run with a deadline fails at the first tick at or past it, with the reason, what it had in
flight cancelled and its child runs with it; never before it, whatever the clocks and however
often it is woken. Hypothesis: for any sequence of clocks, step outcomes and duplicate
wakeups, no tick before the deadline fails the run for it, every tick at or past it leaves
the run ended, ticks are deterministic, a terminal run absorbs everything, and a run that
ends before its deadline goes exactly as one without (but for the wakeup at its deadline).
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import Workflow, client
from processor.cli.common import CliError
from processor.cli.start import _timeout_ms
from processor.core.children import children_to_cancel
from processor.core.deadlines import RunDeadline, deadline_reason, timeout_problem
from processor.core.load_row import LoadRow, loaded_run
from processor.core.model import SignalKind, StepOutcome, StepResult
from processor.core.run_state import NodeStatus, RunState, RunStatus, initial_state
from processor.core.tick import tick, tick_run
from processor.core.tick_decision import NOOP, Decision
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import (
    MAX_BACKOFF_MS,
    MAX_TIMEOUT_MS,
    ValidationError,
    WorkflowDef,
)
from processor.io.config.settings import Settings
from processor.io.shipped.workflow_schema import workflow_validator
from processor.ui.api_spec import body_validator

SCHEMA = workflow_validator()

ORDER: dict[str, Any] = {
    "name": "order",
    "version": 1,
    "timeout_ms": 30_000,
    "steps": [
        {"name": "charge", "type": "charge", "retry": {"max_attempts": 2, "backoff_ms": 500}},
        {"name": "ship", "kind": "workflow", "workflow": "shipping", "depends_on": ["charge"]},
        {"name": "pause", "kind": "sleep", "duration_ms": 2_000, "depends_on": ["ship"]},
        {"name": "mail", "type": "mail", "depends_on": ["pause"]},
    ],
}
WF = parse_workflow(ORDER)
TASKS = parse_workflow(
    {
        "name": "tasks",
        "version": 1,
        "steps": [{"name": "a", "type": "a"}, {"name": "b", "type": "b", "depends_on": ["a"]}],
    }
)
OK, FAILED = StepOutcome.SUCCEEDED, StepOutcome.FAILED


# -- the definitions and the doors ------------------------------------------------------------


def test_timeout_ms_is_parsed_written_back_and_given_in_code() -> None:
    assert WF.timeout_ms == 30_000
    assert workflow_to_json(WF)["timeout_ms"] == 30_000
    assert parse_workflow(workflow_to_json(WF)) == WF
    assert "timeout_ms" not in workflow_to_json(TASKS)  # absent: written as before
    SCHEMA.validate(ORDER)
    wf = Workflow("order", timeout="30s")
    wf.step(name="charge", type="charge")(lambda ctx: None)
    assert wf.to_json()["timeout_ms"] == 30_000
    assert wf.definition().timeout_ms == 30_000
    assert "timeout_ms" not in Workflow("w").to_json()


@pytest.mark.parametrize("bad", [0, -1, True, "30s", 1.5, None, MAX_TIMEOUT_MS + 1])
def test_a_wrong_timeout_is_refused_by_parser_schema_client_and_api(bad: Any) -> None:
    raw = ORDER | {"timeout_ms": bad}
    with pytest.raises(ValidationError, match=r"workflow\.timeout_ms"):
        parse_workflow(raw)
    assert not SCHEMA.is_valid(raw)
    body = {"workflow": "order", "run_id": "r", "timeout_ms": bad}
    assert not body_validator("StartRequest").is_valid(body)
    if bad is not None:  # (None: the client's default, the workflow's own)
        with pytest.raises(client.InvalidArgument, match="timeout_ms"):  # before connecting
            client.start_run(Settings(), "order", "r", {}, timeout_ms=bad)


def test_a_timeout_in_range_is_taken_by_every_door() -> None:
    assert timeout_problem(1, "t") is None and timeout_problem(MAX_TIMEOUT_MS, "t") is None
    assert body_validator("StartRequest").is_valid(
        {"workflow": "order", "run_id": "r", "timeout_ms": 5_000}
    )
    assert _timeout_ms(argparse.Namespace(timeout="5000")) == 5_000
    assert _timeout_ms(argparse.Namespace(timeout="2m")) == 120_000
    assert _timeout_ms(argparse.Namespace(timeout=None)) is None
    for bad in ("0", "soon", "-5"):
        with pytest.raises(CliError):
            _timeout_ms(argparse.Namespace(timeout=bad))


def test_the_load_reads_a_deadline_and_the_tick_judges_by_it() -> None:
    nodes = initial_state(WF).nodes_json()
    fields: list[Any] = ["r", "order", 1, "running", nodes, 0, "x", 1, None, "t1"]
    row = LoadRow(*fields, *([None] * 7))._replace(deadline=[10_000, 30_000])
    run = loaded_run(row, WF)
    assert not isinstance(run, Exception)
    assert run.deadline == RunDeadline(10_000, 30_000)
    assert run.with_selected(()).deadline == RunDeadline(10_000, 30_000)
    assert tick_run(run, 9_999).dispatches  # (it starts charge)
    ended = tick_run(run, 10_000).new_state
    assert ended is not None and ended.reason == deadline_reason(30_000)


# -- the rule ---------------------------------------------------------------------------------


def _started(now: int, deadline: RunDeadline) -> RunState:
    decision = tick(initial_state(WF), WF, (), (), now, deadline=deadline)
    assert decision.new_state is not None
    return decision.new_state


def test_the_tick_that_starts_a_run_sets_a_wakeup_at_its_deadline() -> None:
    deadline = RunDeadline(31_000, 30_000)
    decision = tick(initial_state(WF), WF, (), (), 1_000, deadline=deadline)
    assert decision.timers == (31_000,)
    assert [d.node for d in decision.dispatches] == ["charge"]
    # Later ticks set none again; one beyond the ladder's horizon is the sweep's.
    running = decision.new_state
    assert running is not None
    later = tick(running, WF, [StepResult("charge", 1, OK)], (), 2_000, deadline=deadline)
    assert 31_000 not in later.timers
    far = RunDeadline(1_000 + MAX_BACKOFF_MS + 1, MAX_BACKOFF_MS + 1)
    assert tick(initial_state(WF), WF, (), (), 1_000, deadline=far).timers == ()
    # The tasks-only fast path too.
    assert tick(initial_state(TASKS), TASKS, (), (), 0, deadline=deadline).timers == (31_000,)


def test_past_its_deadline_a_run_fails_with_the_reason_its_steps_and_children_cancelled() -> None:
    deadline = RunDeadline(31_000, 30_000)
    running = _started(1_000, deadline)
    shipping = tick(running, WF, [StepResult("charge", 1, OK)], (), 2_000, deadline=deadline)
    assert shipping.new_state is not None
    assert shipping.new_state.node("ship").status is NodeStatus.DISPATCHED
    # Not a millisecond early, whatever woke the run (a result of the child, a duplicate).
    assert tick(shipping.new_state, WF, (), (), 30_999, deadline=deadline) == NOOP
    ended = tick(shipping.new_state, WF, [StepResult("ship", 1, OK)], (), 31_000, deadline=deadline)
    new = ended.new_state
    assert new is not None
    assert new.status is RunStatus.FAILED and new.reason == "run deadline of 30000 ms passed"
    assert new.seq == shipping.new_state.seq + 1
    assert new.node("charge").status is NodeStatus.SUCCEEDED
    assert {new.node(n).status for n in ("ship", "pause", "mail")} == {NodeStatus.CANCELLED}
    assert ended.dispatches == () and ended.timers == ()
    assert children_to_cancel("r", WF, shipping.new_state, new) == ["r/ship#1"]
    # A pending run not started before its deadline fails as well.
    late = tick(initial_state(WF), WF, (), (), 40_000, deadline=deadline).new_state
    assert late is not None and late.status is RunStatus.FAILED


def test_a_cancel_wins_over_a_deadline_and_a_delayed_start_waits_its_time() -> None:
    deadline = RunDeadline(31_000, 30_000)
    running = _started(1_000, deadline)
    cancelled = tick(running, WF, (), [SignalKind.CANCEL], 40_000, deadline=deadline)
    assert cancelled.new_state is not None and cancelled.new_state.status is RunStatus.CANCELLED
    assert tick(initial_state(WF), WF, (), (), 500, 1_000, deadline=deadline) == NOOP


# -- properties -------------------------------------------------------------------------------


def _run(
    wf: WorkflowDef,
    clocks: list[int],
    outcomes: list[bool],
    repeats: list[int],
    deadline: RunDeadline | None,
) -> tuple[RunState, list[tuple[int, Decision]]]:
    """Tick a run through ``clocks``, each tick repeated ``repeats[i]`` times on the state loaded
    before it (duplicate wakeups), every attempt dispatched answered at once with the next of
    ``outcomes`` (a child run's end is its step's result like a worker's)."""
    state = initial_state(wf)
    history: list[tuple[int, Decision]] = []
    results: list[StepResult] = []
    answered = 0
    for i, now in enumerate(clocks):
        decision = tick(state, wf, results, (), now, deadline=deadline)
        for _ in range(repeats[i % len(repeats)]):
            assert tick(state, wf, results, (), now, deadline=deadline) == decision
        history.append((now, decision))
        if decision.new_state is not None:
            state = decision.new_state
            for d in decision.dispatches:
                ok = outcomes[answered % len(outcomes)]
                answered += 1
                results.append(StepResult(d.node, d.attempt, OK if ok else FAILED, "no"))
            for node, attempt in _children_dispatched(wf, state):
                if (node, attempt) not in {(r.node, r.attempt) for r in results}:
                    ok = outcomes[answered % len(outcomes)]
                    answered += 1
                    results.append(StepResult(node, attempt, OK if ok else FAILED, "no"))
    return state, history


def _children_dispatched(wf: WorkflowDef, state: RunState) -> list[tuple[str, int]]:
    return [
        (s.name, state.node(s.name).attempt)
        for s in wf.steps
        if s.starts_child and state.node(s.name).status is NodeStatus.DISPATCHED
    ]


clocks = st.lists(st.integers(0, 60_000), min_size=1, max_size=20).map(sorted)
outcomes = st.lists(st.booleans(), min_size=1, max_size=6)
repeats = st.lists(st.integers(0, 2), min_size=1, max_size=4)
deadlines = st.integers(1, 60_000).map(lambda ms: RunDeadline(ms, ms))


@settings(max_examples=300, deadline=None)
@given(clocks, outcomes, repeats, deadlines)
def test_a_deadline_never_fires_early_and_always_fires_once_passed(
    times: list[int], answers: list[bool], dupes: list[int], deadline: RunDeadline
) -> None:
    for wf in (WF, TASKS):
        state, history = _run(wf, times, answers, dupes, deadline)
        reason = deadline_reason(deadline.timeout_ms)
        ended_at = [now for now, d in history if d.new_state and d.new_state.status.terminal]
        assert len(ended_at) <= 1  # a run ends once
        for now, decision in history:
            new = decision.new_state
            if new is not None and new.reason == reason:
                assert now >= deadline.at_ms  # never before its deadline
                assert not any(n.status is NodeStatus.DISPATCHED for _, n in new.nodes)
        if any(now >= deadline.at_ms for now in times):
            assert state.status.terminal  # past it, the run has ended, one way or another
        if state.reason == reason:
            first_past = min(now for now in times if now >= deadline.at_ms)
            assert ended_at == [first_past]


@settings(max_examples=200, deadline=None)
@given(clocks, outcomes, repeats, deadlines)
def test_a_run_that_ended_absorbs_every_later_tick(
    times: list[int], answers: list[bool], dupes: list[int], deadline: RunDeadline
) -> None:
    state, _ = _run(WF, [*times, deadline.at_ms], answers, dupes, deadline)
    assert state.status.terminal
    for later in (deadline.at_ms, deadline.at_ms + 1, 10**13):
        assert tick(state, WF, [StepResult("charge", 1, OK)], (), later, deadline=deadline) == NOOP


@settings(max_examples=300, deadline=None)
@given(clocks, outcomes, repeats, st.integers(0, 120_000))
def test_a_run_that_ends_before_its_deadline_goes_as_one_without(
    times: list[int], answers: list[bool], dupes: list[int], slack: int
) -> None:
    for wf in (WF, TASKS):
        plain_state, plain = _run(wf, times, answers, dupes, None)
        ended = [now for now, d in plain if d.new_state and d.new_state.status.terminal]
        if not ended:
            continue
        deadline = RunDeadline(ended[0] + 1 + slack, 10**9)
        state, history = _run(wf, times, answers, dupes, deadline)
        assert state == plain_state
        for i, ((_, with_it), (_, without)) in enumerate(zip(history, plain, strict=True)):
            timers = tuple(t for t in with_it.timers if t != deadline.at_ms)
            assert with_it._replace(timers=timers) == without._replace(
                timers=tuple(t for t in without.timers if t != deadline.at_ms)
            )
            if i == 0:  # the tick that starts it sets a wakeup at its deadline
                assert with_it.new_state is not None
                assert deadline.at_ms in with_it.timers or with_it.new_state.status.terminal
