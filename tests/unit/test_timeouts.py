"""The three timeouts of a step a worker runs (core/tick.py, rule 4): start-to-close counted
from the attempt's start (what the workers recorded: ``started``), never from its dispatch;
heartbeats judged from the beats recorded; schedule-to-start and schedule-to-close. Examples,
then properties over random reachable runs."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from processor.authoring import Workflow
from processor.core.model import Started, StepOutcome, StepResult
from processor.core.run_state import NodeStatus, RunState, RunStatus, initial_state, node_state
from processor.core.tick import tick
from processor.core.tick_decision import NOOP, Decision
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import ValidationError, WorkflowDef
from processor.worker import StepContext

from .strategies import FAST, check_decision, runs, tick_inputs

FAIL = StepOutcome.FAILED


def _wf(**step: Any) -> WorkflowDef:
    only = {"name": "only", "type": "t", "timeout_ms": 1_000, **step}
    return parse_workflow({"name": "w", "version": 1, "steps": [only]})


def _advance(state: RunState, decision: Decision) -> RunState:
    assert decision.new_state is not None, "expected a transition, got a no-op"
    return decision.new_state


def _dispatched(wf: WorkflowDef, at: int = 0) -> RunState:
    return _advance(initial_state(wf), tick(initial_state(wf), wf, (), (), at))


def _start(
    attempt: int, at: int, beat: int | None = None, recorded: bool = True
) -> dict[str, Started]:
    return {"only": Started(attempt, at, beat, recorded)}


# -- start-to-close -------------------------------------------------------------------------


def test_time_in_the_queue_never_times_an_attempt_out() -> None:
    """Dispatched at 0 with a 1 s timeout, its task waits 10 s in the queue (a worker
    restarted): at each look no worker has started it, and nothing changes (nothing is
    written); once started at 10 s it has its whole second, and times out only then."""
    wf = _wf()
    s = _dispatched(wf)
    assert s.node("only").due_ms == 1_000
    for now in (1_000, 3_000, 9_999):
        assert tick(s, wf, (), (), now, started={}) == NOOP
    moved = tick(s, wf, (), (), 10_050, started=_start(1, 10_000))
    s = _advance(s, moved)
    assert s.node("only") == node_state(NodeStatus.DISPATCHED, 1, 11_000)
    assert moved.dispatches == () and moved.timers == ()
    assert tick(s, wf, (), (), 10_999, started=_start(1, 10_000)) == NOOP  # not due
    s = _advance(s, tick(s, wf, (), (), 11_000, started=_start(1, 10_000)))
    assert s.node("only").status is NodeStatus.RETRY_WAIT
    assert s.node("only").error == "attempt 1 timed out after 1000 ms"


def test_a_result_applies_whatever_the_attempt_waited() -> None:
    wf = _wf()
    s = _dispatched(wf)
    done = tick(s, wf, [StepResult("only", 1, StepOutcome.SUCCEEDED)], (), 60_000, started={})
    assert _advance(s, done).status is RunStatus.SUCCEEDED


def test_without_what_the_workers_recorded_a_due_attempt_is_left_alone() -> None:
    """The load reads the starts only for runs whose next wakeup passed: a tick given none
    (None) decides nothing about a due attempt, the next one, with them, does."""
    wf = _wf()
    s = _dispatched(wf)
    assert tick(s, wf, (), (), 5_000, started=None) == NOOP
    assert tick(s, wf, (), (), 5_000, started=_start(1, 0)).progressed


def test_the_start_of_another_attempt_is_not_this_ones() -> None:
    wf = _wf()
    s = _dispatched(wf)
    assert tick(s, wf, (), (), 5_000, started=_start(7, 0)) == NOOP


def test_a_wait_step_still_times_out_from_its_dispatch() -> None:
    wf = parse_workflow(
        {
            "name": "w",
            "version": 1,
            "steps": [{"name": "w", "kind": "wait", "signal": "go", "timeout_ms": 500}],
        }
    )
    s = _dispatched(wf)
    late = tick(s, wf, (), (), 500, started=None)
    assert _advance(s, late).node("w").error == "attempt 1 timed out after 500 ms"


def test_a_map_item_times_out_from_its_start() -> None:
    wf = parse_workflow(
        {
            "name": "m",
            "version": 1,
            "steps": [{"name": "m", "kind": "map", "type": "t", "timeout_ms": 1_000}],
        }
    )
    s = _advance(initial_state(wf), tick(initial_state(wf), wf, (), (), 0, input_length=1))
    assert s.node("m[0]").due_ms == 1_000
    assert tick(s, wf, (), (), 5_000, input_length=1, started={}) == NOOP
    moved = _advance(
        s, tick(s, wf, (), (), 5_000, input_length=1, started={"m[0]": Started(1, 4_500)})
    )
    assert moved.node("m[0]").due_ms == 5_500


# -- heartbeats -----------------------------------------------------------------------------


def test_a_silent_attempt_fails_for_its_heartbeat_from_the_beats_recorded() -> None:
    """Heartbeat timeout 200 ms, timeout 1 s: due 200 ms after its dispatch; started at 10,
    it beat at 150: due at 350; no beat since: it fails for its heartbeat, retried."""
    wf = _wf(heartbeat_timeout_ms=200)
    s = _dispatched(wf)
    assert s.node("only").due_ms == 200
    s = _advance(s, tick(s, wf, (), (), 200, started=_start(1, 10, 150)))
    assert s.node("only").due_ms == 350
    failed = _advance(s, tick(s, wf, (), (), 350, started=_start(1, 10, 150)))
    assert failed.node("only").status is NodeStatus.RETRY_WAIT
    assert failed.node("only").error == (
        "attempt 1 recorded no heartbeat for 200 ms (heartbeat_timeout_ms)"
    )


def test_a_worker_that_records_no_heartbeats_is_judged_by_its_timeout_only() -> None:
    wf = _wf(heartbeat_timeout_ms=200)
    s = _dispatched(wf)
    moved = _advance(s, tick(s, wf, (), (), 5_000, started=_start(1, 4_900, None, False)))
    assert moved.node("only").due_ms == 5_900


def test_a_heartbeat_past_the_deadline_does_not_outlive_it() -> None:
    wf = _wf(heartbeat_timeout_ms=200)
    s = _dispatched(wf)
    s = _advance(s, tick(s, wf, (), (), 300, started=_start(1, 0, 900)))
    assert s.node("only").due_ms == 1_000  # its deadline comes before its beat's bound
    failed = _advance(s, tick(s, wf, (), (), 1_000, started=_start(1, 0, 950)))
    assert failed.node("only").error == "attempt 1 timed out after 1000 ms"


# -- schedule-to-start, schedule-to-close ---------------------------------------------------


def test_an_attempt_not_started_within_its_schedule_to_start_fails_the_step() -> None:
    wf = _wf(schedule_to_start_ms=2_000)
    s = _dispatched(wf, at=100)
    assert s.node("only") == node_state(NodeStatus.DISPATCHED, 1, 1_100, since_ms=100)
    s = _advance(s, tick(s, wf, (), (), 1_100, started={}))
    assert s.node("only").due_ms == 2_100  # its schedule-to-start bound, next
    failed = _advance(s, tick(s, wf, (), (), 2_100, started={}))
    assert failed.status is RunStatus.FAILED
    assert failed.node("only").status is NodeStatus.FAILED  # final: not retried
    assert failed.node("only").error == (
        "attempt 1 was not started within 2000 ms of its dispatch (schedule_to_start_ms)"
    )


def test_an_attempt_started_in_time_has_its_whole_timeout() -> None:
    wf = _wf(schedule_to_start_ms=2_000)
    s = _dispatched(wf)
    s = _advance(s, tick(s, wf, (), (), 1_000, started={}))
    moved = _advance(s, tick(s, wf, (), (), 2_000, started=_start(1, 1_900)))
    assert moved.node("only").due_ms == 2_900


def test_schedule_to_close_bounds_the_whole_step_retries_included() -> None:
    """Schedule-to-close 1.5 s, timeout 1 s, retried after 100 ms: attempt 1 times out at
    1 s, attempt 2 is dispatched at 1.1 s and due at 1.5 s, when the step fails, final."""
    wf = _wf(schedule_to_close_ms=1_500, retry={"max_attempts": 3, "backoff_ms": 100})
    s = _dispatched(wf)
    assert s.node("only") == node_state(NodeStatus.DISPATCHED, 1, 1_000, first_ms=0)
    s = _advance(s, tick(s, wf, (), (), 1_000, started=_start(1, 0)))
    assert s.node("only") == node_state(
        NodeStatus.RETRY_WAIT, 1, 1_100, "attempt 1 timed out after 1000 ms", first_ms=0
    )
    s = _advance(s, tick(s, wf, (), (), 1_100))
    assert s.node("only") == node_state(NodeStatus.DISPATCHED, 2, 1_500, first_ms=0)
    failed = _advance(s, tick(s, wf, (), (), 1_500, started=_start(2, 1_150)))
    assert failed.status is RunStatus.FAILED
    assert "did not end within 1500 ms of its first dispatch (schedule_to_close_ms)" in (
        failed.node("only").error or ""
    )


def test_a_retry_that_would_come_after_schedule_to_close_is_not_made() -> None:
    wf = _wf(schedule_to_close_ms=1_500, retry={"max_attempts": 3, "backoff_ms": 1_000})
    s = _dispatched(wf)
    failed = _advance(s, tick(s, wf, [StepResult("only", 1, FAIL, "boom")], (), 600))
    assert failed.status is RunStatus.FAILED
    assert failed.node("only").error == (
        "boom; not retried: the step must end within 1500 ms of its first dispatch"
        " (schedule_to_close_ms)"
    )


def test_an_attempt_failed_unstarted_is_named_for_the_commit_to_mark_it() -> None:
    """The commit holds only if no worker claimed it meanwhile (io/postgres/store.py): the decision
    names the attempts it fails that no worker had started, and no other."""
    wf = _wf(schedule_to_start_ms=500)
    s = _dispatched(wf)
    assert tick(s, wf, (), (), 500, started={}).unstarted == (("only", 1),)
    timed_out = tick(s, wf, (), (), 5_000, started=_start(1, 0))
    assert timed_out.progressed and timed_out.unstarted == ()


def test_the_bounds_are_parsed_written_back_and_refused_out_of_range() -> None:
    wf = _wf(schedule_to_start_ms=2_000, schedule_to_close_ms=60_000)
    step = wf.steps[0]
    assert (step.schedule_to_start_ms, step.schedule_to_close_ms) == (2_000, 60_000)
    assert parse_workflow(workflow_to_json(wf)) == wf
    assert "schedule_to_start_ms" not in workflow_to_json(_wf())["steps"][0]
    for bad in (0, -1, 10**13, "2s", True):
        with pytest.raises(ValidationError, match="schedule_to_start_ms"):
            _wf(schedule_to_start_ms=bad)
    with pytest.raises(ValidationError, match="unknown field"):  # a wait step has no queue
        parse_workflow(
            {
                "name": "w",
                "version": 1,
                "steps": [{"name": "w", "kind": "wait", "signal": "go", "schedule_to_start_ms": 1}],
            }
        )


def test_a_workflow_in_code_declares_the_bounds_as_durations() -> None:
    wf = Workflow("coded")

    @wf.step(timeout="1s", schedule_to_start="2s", schedule_to_close="1m")
    def only(ctx: StepContext) -> None:
        return None

    step = wf.to_json()["steps"][0]
    assert (step["timeout_ms"], step["schedule_to_start_ms"], step["schedule_to_close_ms"]) == (
        1_000,
        2_000,
        60_000,
    )


# -- properties -----------------------------------------------------------------------------


@FAST
@given(st.data())
def test_no_attempt_ever_times_out_for_its_time_in_the_queue(data: st.DataObject) -> None:
    """Whatever the run and the time: with no worker having started anything, no result and
    no signal, an attempt in flight stays in flight, unless its step bounds its wait in the
    queue or the whole step (then it fails, final, saying which bound)."""
    run = data.draw(runs())
    now = run.now_ms + data.draw(st.integers(0, 10**7))
    decision = tick(run.state, run.wf, (), (), now, started={})
    check_decision(run.state, decision, run.wf)
    if decision.new_state is None:
        return
    for name, before in run.state.nodes:
        after = decision.new_state.node(name)
        if before.status is NodeStatus.DISPATCHED and after.status is not NodeStatus.DISPATCHED:
            event("a bound ended a queued attempt")
            assert after.status in (NodeStatus.FAILED, NodeStatus.CANCELLED), after
            if after.status is NodeStatus.FAILED:
                assert after.error is not None and "(schedule_to_" in after.error


@FAST
@given(st.data())
def test_an_attempt_never_times_out_before_its_start_plus_its_timeout(
    data: st.DataObject,
) -> None:
    """An attempt a worker started that leaves its flight with no result of its own and no
    cancel did so for a heartbeat, for its schedule-to-close bound, or once its start plus
    its timeout had passed."""
    run = data.draw(runs())
    inputs = data.draw(tick_inputs(run))
    decision = tick(run.state, run.wf, inputs.results, (), inputs.now_ms, started=inputs.started)
    if decision.new_state is None:
        return
    answered = {(r.node, r.attempt) for r in inputs.results}
    for name, before in run.state.nodes:
        fact = inputs.started.get(name)
        after = decision.new_state.node(name)
        if (
            before.status is not NodeStatus.DISPATCHED
            or fact is None
            or fact.attempt != before.attempt
            or (name, before.attempt) in answered
            or after.status is NodeStatus.CANCELLED  # (another node failed the run)
            or (after.status, after.attempt) == (NodeStatus.DISPATCHED, before.attempt)
        ):
            continue
        error = after.error or ""
        event(error.split(" (")[-1] if "(" in error else "timed out")
        timeout = run.wf.step_for(name).timeout_ms
        assert (
            "heartbeat" in error
            or "schedule_to_close" in error
            or inputs.now_ms >= fact.started_ms + timeout
        ), (before, fact, after)


@FAST
@given(st.data())
def test_the_starts_of_attempts_not_due_change_nothing(data: st.DataObject) -> None:
    """The load reads the starts of the due attempts only: the tick gives them to none other,
    so the starts of the others, and none at all when none is due, decide the same."""
    run = data.draw(runs())
    inputs = data.draw(tick_inputs(run))
    due = {
        name
        for name, node in run.state.nodes
        if node.status is NodeStatus.DISPATCHED
        and node.due_ms is not None
        and inputs.now_ms >= node.due_ms
    }
    only_due = {n: f for n, f in inputs.started.items() if n in due}
    args = (run.state, run.wf, inputs.results, inputs.signals, inputs.now_ms)
    expected = tick(*args, started=inputs.started)
    assert tick(*args, started=only_due) == expected
    if not due:
        assert tick(*args, started=None) == expected
