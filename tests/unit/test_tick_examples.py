"""Example-based tests of the tick's rules (processor/tick.py) and of force_fail."""

from __future__ import annotations

from typing import Any

import pytest

from processor.core.model import SignalKind, Started, StepOutcome, StepResult
from processor.core.run_ends import force_fail
from processor.core.run_state import NodeState, NodeStatus, RunState, RunStatus, initial_state
from processor.core.tick import tick
from processor.core.tick_decision import NOOP, Decision, Dispatch
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef

OK = StepOutcome.SUCCEEDED
FAIL = StepOutcome.FAILED


def _wf(*steps: dict[str, Any]) -> WorkflowDef:
    return parse_workflow({"name": "t", "version": 1, "steps": list(steps)})


def _advance(state: RunState, decision: Decision) -> RunState:
    assert decision.new_state is not None, "expected a transition, got a no-op"
    assert decision.new_state.seq == state.seq + 1
    return decision.new_state


SINGLE = _wf(
    {
        "name": "only",
        "type": "flaky",
        "timeout_ms": 1_000,
        "retry": {"max_attempts": 3, "backoff_ms": 100, "backoff_multiplier": 2},
    }
)

DIAMOND = _wf(
    {"name": "fetch", "type": "fast", "timeout_ms": 500},
    {"name": "left", "type": "fast", "depends_on": ["fetch"], "timeout_ms": 500},
    {"name": "right", "type": "slow", "depends_on": ["fetch"], "timeout_ms": 700},
    {"name": "join", "type": "fast", "depends_on": ["left", "right"], "timeout_ms": 500},
)


def test_the_first_tick_dispatches_the_roots_and_sets_their_deadline_timers() -> None:
    s0 = initial_state(DIAMOND)
    decision = tick(s0, DIAMOND, [], [], 1_000)
    s1 = _advance(s0, decision)
    assert s1.status is RunStatus.RUNNING
    assert decision.dispatches == (Dispatch("fetch", 1, "fast", 1_500),)
    # A deadline is no timer: the watchdog enforces it from the row's next wakeup.
    assert decision.timers == ()
    assert s1.node("fetch") == NodeState(NodeStatus.DISPATCHED, 1, due_ms=1_500)
    assert s1.node("join") == NodeState()
    assert s1.next_due_ms() == 1_500


def test_a_diamond_runs_its_branches_in_parallel_and_succeeds() -> None:
    s = _advance(initial_state(DIAMOND), tick(initial_state(DIAMOND), DIAMOND, [], [], 0))
    d = tick(s, DIAMOND, [StepResult("fetch", 1, OK)], [], 100)
    s = _advance(s, d)
    assert [x.node for x in d.dispatches] == ["left", "right"]  # definition order
    assert [x.deadline_ms for x in d.dispatches] == [600, 800]
    assert s.next_due_ms() == 600
    d = tick(s, DIAMOND, [StepResult("fetch", 1, OK), StepResult("right", 1, OK)], [], 200)
    s = _advance(s, d)
    assert d.dispatches == ()  # join still waits for left
    results = [StepResult(n, 1, OK) for n in ("fetch", "right", "left")]
    d = tick(s, DIAMOND, results, [], 300)
    s = _advance(s, d)
    assert d.dispatches == (Dispatch("join", 1, "fast", 800),)
    d = tick(s, DIAMOND, [*results, StepResult("join", 1, OK)], [], 400)
    s = _advance(s, d)
    assert s.status is RunStatus.SUCCEEDED
    assert s.reason is None
    assert s.seq == 5
    assert s.next_due_ms() is None
    assert d.dispatches == () and d.timers == ()


def test_a_result_for_a_stale_attempt_is_ignored() -> None:
    s = initial_state(SINGLE)
    s = _advance(s, tick(s, SINGLE, [], [], 0))
    s = _advance(s, tick(s, SINGLE, [StepResult("only", 1, FAIL, "boom")], [], 10))
    assert s.node("only") == NodeState(NodeStatus.RETRY_WAIT, 1, due_ms=110, error="boom")
    s = _advance(s, tick(s, SINGLE, [], [], 110))
    assert s.node("only") == NodeState(NodeStatus.DISPATCHED, 2, due_ms=1_110)
    # Attempt 1 answers again, now successfully (a redelivered task): it is stale.
    assert tick(s, SINGLE, [StepResult("only", 1, OK)], [], 120) == NOOP
    # A result for an attempt never dispatched, and for an unknown node, are ignored too.
    assert tick(s, SINGLE, [StepResult("only", 3, OK), StepResult("ghost", 2, OK)], [], 120) == NOOP
    done = _advance(s, tick(s, SINGLE, [StepResult("only", 2, OK)], [], 130))
    assert done.status is RunStatus.SUCCEEDED


def test_a_result_for_a_node_waiting_to_retry_is_ignored() -> None:
    s = initial_state(SINGLE)
    s = _advance(s, tick(s, SINGLE, [], [], 0))
    s = _advance(s, tick(s, SINGLE, [StepResult("only", 1, FAIL)], [], 10))
    assert s.node("only").status is NodeStatus.RETRY_WAIT
    # A late success of the failed attempt 1 does not resurrect it.
    assert tick(s, SINGLE, [StepResult("only", 1, OK)], [], 50) == NOOP


def _started(attempt: int, at_ms: int, beat_ms: int | None = None) -> dict[str, Started]:
    """What a worker recorded of the only step's attempt: started at ``at_ms``."""
    return {"only": Started(attempt, at_ms, beat_ms)}


def test_a_timed_out_attempt_is_retried_by_policy_then_fails_the_run() -> None:
    s = initial_state(SINGLE)
    s = _advance(s, tick(s, SINGLE, [], [], 0))
    assert s.node("only").due_ms == 1_000
    assert tick(s, SINGLE, [], [], 999) == NOOP  # the deadline has not passed yet

    # Attempt 1, started at once, times out: retry after 100 ms.
    d = tick(s, SINGLE, [], [], 1_000, started=_started(1, 0))
    s = _advance(s, d)
    assert s.node("only").status is NodeStatus.RETRY_WAIT
    assert s.node("only").due_ms == 1_100
    assert s.node("only").error == "attempt 1 timed out after 1000 ms"
    assert d.timers == (1_100,)
    assert d.dispatches == ()

    d = tick(s, SINGLE, [], [], 1_100)
    s = _advance(s, d)
    assert d.dispatches == (Dispatch("only", 2, "flaky", 2_100),)

    # Attempt 2 times out: wait 200 ms.
    s = _advance(s, tick(s, SINGLE, [], [], 2_100, started=_started(2, 1_100)))
    assert s.node("only").due_ms == 2_300
    s = _advance(s, tick(s, SINGLE, [], [], 2_300))
    assert s.node("only") == NodeState(NodeStatus.DISPATCHED, 3, due_ms=3_300)

    # Attempt 3 = max_attempts times out: the run fails.
    d = tick(s, SINGLE, [], [], 5_000, started=_started(3, 2_300))
    s = _advance(s, d)
    assert s.status is RunStatus.FAILED
    assert s.node("only").status is NodeStatus.FAILED
    assert s.node("only").attempt == 3
    assert s.reason == "step 'only' failed after 3 attempt(s): attempt 3 timed out after 1000 ms"
    assert d.dispatches == () and d.timers == ()
    assert tick(s, SINGLE, [], [], 10_000) == NOOP


def test_a_result_that_arrives_with_the_deadline_tick_still_counts() -> None:
    s = initial_state(SINGLE)
    s = _advance(s, tick(s, SINGLE, [], [], 0))
    done = _advance(s, tick(s, SINGLE, [StepResult("only", 1, OK)], [], 5_000))
    assert done.status is RunStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("retry", "failed_at", "expected_due"),
    [
        ({"backoff_ms": 100, "backoff_multiplier": 2}, [0, 0, 0], [100, 200, 400]),
        (
            {"backoff_ms": 100, "backoff_multiplier": 3, "max_backoff_ms": 500},
            [0, 0, 0],
            [100, 300, 500],
        ),
        ({"backoff_ms": 50, "backoff_multiplier": 1}, [0, 0, 0], [50, 50, 50]),
    ],
)
def test_retry_backoff_is_respected(
    retry: dict[str, Any], failed_at: list[int], expected_due: list[int]
) -> None:
    wf = _wf(
        {"name": "x", "type": "flaky", "timeout_ms": 10_000, "retry": {"max_attempts": 4, **retry}}
    )
    s = _advance(initial_state(wf), tick(initial_state(wf), wf, [], [], 0))
    now = 0
    for attempt, (extra, wait) in enumerate(zip(failed_at, expected_due, strict=True), start=1):
        now += 7 + extra
        failure = StepResult("x", attempt, FAIL, f"e{attempt}")
        d = tick(s, wf, [failure], [], now)
        s = _advance(s, d)
        node = s.node("x")
        assert node == NodeState(
            NodeStatus.RETRY_WAIT, attempt, due_ms=now + wait, error=f"e{attempt}"
        )
        assert d.timers == (now + wait,)
        # Not redispatched before its due time, whatever wakes the run.
        for early in (now, now + wait - 1):
            assert tick(s, wf, [failure], [], early) == NOOP
        d = tick(s, wf, [failure], [], now + wait)
        s = _advance(s, d)
        assert d.dispatches == (Dispatch("x", attempt + 1, "flaky", now + wait + 10_000),)
        now += wait
    # The fourth attempt fails too: out of attempts, the run fails.
    s = _advance(s, tick(s, wf, [StepResult("x", 4, FAIL, "last")], [], now + 1))
    assert s.status is RunStatus.FAILED
    assert s.reason == "step 'x' failed after 4 attempt(s): last"


def test_backoff_zero_retries_in_the_same_tick() -> None:
    wf = _wf({"name": "x", "type": "t", "timeout_ms": 100, "retry": {"backoff_ms": 0}})
    s = _advance(initial_state(wf), tick(initial_state(wf), wf, [], [], 0))
    d = tick(s, wf, [StepResult("x", 1, FAIL)], [], 40)
    s = _advance(s, d)
    assert d.dispatches == (Dispatch("x", 2, "t", 140),)
    assert s.node("x") == NodeState(NodeStatus.DISPATCHED, 2, due_ms=140)
    assert tick(s, wf, [StepResult("x", 1, FAIL)], [], 40) == NOOP


def test_a_failed_step_fails_the_run_and_cancels_the_nodes_in_flight() -> None:
    s = _advance(initial_state(DIAMOND), tick(initial_state(DIAMOND), DIAMOND, [], [], 0))
    s = _advance(s, tick(s, DIAMOND, [StepResult("fetch", 1, OK)], [], 10))
    wf_no_retry = DIAMOND  # default policy: 3 attempts
    results = [StepResult("fetch", 1, OK), StepResult("left", 1, OK)]
    s = _advance(s, tick(s, wf_no_retry, results, [], 20))
    # right fails three times
    now = 20
    for attempt in (1, 2, 3):
        results.append(StepResult("right", attempt, FAIL, f"bad {attempt}"))
        now += 1_000
        s = _advance(s, tick(s, DIAMOND, results, [], now))
        if attempt < 3:
            now += 1_000
            s = _advance(s, tick(s, DIAMOND, results, [], now))
    assert s.status is RunStatus.FAILED
    assert s.reason == "step 'right' failed after 3 attempt(s): bad 3"
    assert s.node("right").status is NodeStatus.FAILED
    assert s.node("left").status is NodeStatus.SUCCEEDED
    assert s.node("join") == NodeState(NodeStatus.CANCELLED, 0)


def test_cancel_signal_cancels_in_flight_nodes_and_keeps_finished_ones() -> None:
    s = _advance(initial_state(DIAMOND), tick(initial_state(DIAMOND), DIAMOND, [], [], 0))
    s = _advance(s, tick(s, DIAMOND, [StepResult("fetch", 1, OK)], [], 10))
    d = tick(s, DIAMOND, [StepResult("left", 1, OK)], {SignalKind.CANCEL}, 20)
    c = _advance(s, d)
    assert c.status is RunStatus.CANCELLED
    assert c.reason == "cancelled by signal"
    assert c.node("fetch").status is NodeStatus.SUCCEEDED
    assert c.node("left") == NodeState(NodeStatus.CANCELLED, 1)
    assert c.node("right") == NodeState(NodeStatus.CANCELLED, 1)
    assert c.node("join") == NodeState(NodeStatus.CANCELLED, 0)
    assert c.next_due_ms() is None
    assert d.dispatches == () and d.timers == ()


def test_force_fail_ends_a_live_run_through_the_terminal_path() -> None:
    s = _advance(initial_state(DIAMOND), tick(initial_state(DIAMOND), DIAMOND, [], [], 0))
    s = _advance(s, tick(s, DIAMOND, [StepResult("fetch", 1, OK)], [], 10))
    failed = force_fail(s, "livelock")
    assert failed is not None
    assert failed.status is RunStatus.FAILED
    assert failed.reason == "livelock"
    assert failed.seq == s.seq + 1
    assert failed.node("fetch") == s.node("fetch")
    assert {failed.node(n).status for n in ("left", "right", "join")} == {NodeStatus.CANCELLED}
    # Once ended, there is nothing to fail, and the tick absorbs everything.
    assert force_fail(failed, "stuck") is None
    assert tick(failed, DIAMOND, [StepResult("left", 1, OK)], [SignalKind.CANCEL], 99) == NOOP


def test_force_fail_of_a_pending_run() -> None:
    s = initial_state(DIAMOND)
    failed = force_fail(s, "stuck")
    assert failed is not None
    assert failed.status is RunStatus.FAILED
    assert failed.seq == 1
    assert all(n.status is NodeStatus.CANCELLED for _, n in failed.nodes)


@pytest.mark.parametrize("status", [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED])
def test_force_fail_of_an_ended_run_is_none(status: RunStatus) -> None:
    s = RunState(status=status, nodes=initial_state(SINGLE).nodes, seq=4)
    assert force_fail(s, "stuck") is None


def test_noop_decision_is_not_progress() -> None:
    assert not NOOP.progressed
    assert Decision(initial_state(SINGLE)).progressed


# Fixed (tick.py, rule 3): two results for the same (node, attempt, outcome) that differ
# only in ``error`` (one None, one a string) make ``sorted(set(results))`` compare None with str
# and the tick raises TypeError instead of applying one canonical result. The store's primary
# key (run_id, node_id, attempt) keeps this from reaching the tick today, but the pure function's
# contract ("results are applied in a canonical order") does not hold for these inputs.
def test_results_differing_only_in_error_are_ordered_without_crashing() -> None:
    s = _advance(initial_state(SINGLE), tick(initial_state(SINGLE), SINGLE, [], [], 0))
    results = [StepResult("only", 1, FAIL, None), StepResult("only", 1, FAIL, "boom")]
    first = tick(s, SINGLE, results, [], 10)
    assert first == tick(s, SINGLE, list(reversed(results)), [], 10)
    assert first.new_state is not None
    assert first.new_state.node("only").status is NodeStatus.RETRY_WAIT
