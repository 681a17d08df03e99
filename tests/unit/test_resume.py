"""Hypothesis properties of ``resume_failed`` (processor/core/tick.py), the pure half of
`ductor runs retry`: on random DAG workflows and failed runs reached the ways production
reaches them (a step out of attempts, a force-fail of a live run)."""

from __future__ import annotations

import random

import orjson
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from processor.core.model import LoadedRun, StepOutcome, StepResult
from processor.core.run_ends import NotResumable, force_fail, resume_failed
from processor.core.run_state import (
    NodeState,
    NodeStatus,
    RunState,
    RunStatus,
    row_checksum,
    state_checksum,
    state_from_row,
)
from processor.core.tick import tick
from processor.core.workflow_def import WorkflowDef

from .strategies import (
    FAST,
    Run,
    check_decision,
    claimed_long_ago,
    runs,
    seeds,
    terminal_states,
)

Stored = dict[tuple[str, int], StepResult]


def _drive(
    wf: WorkflowDef, state: RunState, now: int, stored: Stored, rng: random.Random, p_ok: float
) -> tuple[RunState, int, list[tuple[str, int]]]:
    """Tick the run to its end with workers that answer every dispatch at once (success with
    probability ``p_ok``), the clock jumping to the next due time. Returns the final state,
    the time and the attempts dispatched; fails if an attempt is dispatched whose (node,
    attempt) the store already holds (the step results' primary key)."""
    dispatched: list[tuple[str, int]] = []
    for _ in range(500):
        if state.status.terminal:
            return state, now, dispatched
        decision = tick(state, wf, stored.values(), (), now, started=claimed_long_ago(state))
        check_decision(state, decision, wf)
        if decision.new_state is not None:
            for d in decision.dispatches:
                assert (d.node, d.attempt) not in stored, f"attempt {d} was dispatched before"
                ok = rng.random() < p_ok
                outcome = StepOutcome.SUCCEEDED if ok else StepOutcome.FAILED
                stored[(d.node, d.attempt)] = StepResult(d.node, d.attempt, outcome, "boom")
                dispatched.append((d.node, d.attempt))
            state = decision.new_state
        now = max(now + 1, state.next_due_ms() or now)
    pytest.fail(f"the run did not end: {state}")


@st.composite
def failed_runs(draw: st.DrawFn) -> tuple[Run, Stored]:
    """A failed run and the results its store holds (of every attempt ever dispatched,
    including those still in flight when the run failed)."""
    run = draw(runs(live_only=True))
    stored = {(r.node, r.attempt): r for r in run.stored}
    rng = random.Random(draw(seeds))
    if draw(st.booleans()):
        state: RunState | None = force_fail(run.state, "stuck")
        assert state is not None
        now = run.now_ms
        event("force-failed")
    else:  # workers fail some attempts until a step is out of them
        state, now, _ = _drive(run.wf, run.state, run.now_ms, stored, rng, p_ok=0.5)
        if state.status is not RunStatus.FAILED:  # it succeeded: force-fail a fresh one
            state = force_fail(run.state, "livelock")
            assert state is not None
            stored = {(r.node, r.attempt): r for r in run.stored}
            now = run.now_ms
        event(f"failed by {'a step' if state.reason and 'step' in state.reason else 'force'}")
    # Late answers to the attempts that were in flight when the run failed.
    for name, node in run.state.nodes:
        if node.status is NodeStatus.DISPATCHED and rng.random() < 0.5:
            late = StepResult(name, node.attempt, StepOutcome.SUCCEEDED)
            stored.setdefault((name, node.attempt), late)
    return Run(run.wf, state, now, tuple(stored.values())), stored


@FAST
@given(failed_runs())
def test_resume_keeps_succeeded_nodes_and_reopens_the_others(drawn: tuple[Run, Stored]) -> None:
    run, _ = drawn
    resumed = resume_failed(run.state)
    assert resumed.status is RunStatus.RUNNING
    assert resumed.seq == run.state.seq + 1
    assert resumed.reason is None
    assert [n for n, _ in resumed.nodes] == [n for n, _ in run.state.nodes]
    for (name, before), (_, after) in zip(run.state.nodes, resumed.nodes, strict=True):
        if before.status is NodeStatus.SUCCEEDED:
            assert after == before
        else:
            assert after.status is NodeStatus.PENDING
            assert (after.attempt, after.attempts_before) == (before.attempt, before.attempt)
            assert (after.due_ms, after.error) == (None, None), name


@FAST
@given(failed_runs())
def test_the_resumed_state_is_one_the_model_reads_back_with_its_checksum(
    drawn: tuple[Run, Stored],
) -> None:
    """Written as the commit writes it (canonical JSON) and loaded as the loader loads it:
    the same state, and a checksum the processors accept (no quarantine)."""
    run, _ = drawn
    resumed = resume_failed(run.state)
    stored_nodes = orjson.loads(orjson.dumps(resumed.nodes_json()))
    status = str(resumed.status)
    loaded = state_from_row(status, stored_nodes, resumed.seq, resumed.reason, run.wf)
    assert loaded == resumed
    checksum = row_checksum(status, stored_nodes, resumed.seq, resumed.reason)
    assert checksum == state_checksum(resumed) != state_checksum(run.state)
    assert LoadedRun("r", run.wf, loaded, 2, "t1", stored_checksum=checksum).checksum_ok


@FAST
@given(failed_runs(), seeds)
def test_a_resumed_run_dispatches_only_new_attempts_and_never_reruns_a_succeeded_step(
    drawn: tuple[Run, Stored], seed: int
) -> None:
    run, stored = drawn
    before = run.state.node_map()
    resumed = resume_failed(run.state)
    # Its first tick, with every result of the earlier attempts in the store: nothing old
    # applies, and at least one step starts (a resumed run is never left with nothing to do).
    first = tick(resumed, run.wf, stored.values(), (), run.now_ms)
    check_decision(resumed, first, run.wf)
    assert first.dispatches, "a resumed run must dispatch something"
    for d in first.dispatches:
        assert before[d.node].status is not NodeStatus.SUCCEEDED
        assert d.attempt == before[d.node].attempt + 1
    final, _, dispatched = _drive(
        run.wf, resumed, run.now_ms, stored, random.Random(seed), p_ok=0.7
    )
    event(f"resumed run {final.status}")
    assert final.status in (RunStatus.SUCCEEDED, RunStatus.FAILED)
    for name, attempt in dispatched:
        assert before[name].status is not NodeStatus.SUCCEEDED
        assert attempt > before[name].attempt
    for name, node in before.items():
        if node.status is NodeStatus.SUCCEEDED:
            assert final.node(name) == node


@FAST
@given(failed_runs())
def test_each_resume_gives_a_failing_step_its_whole_retry_budget_again(
    drawn: tuple[Run, Stored],
) -> None:
    """Workers that fail everything: after each resume, the step that fails the run again
    used exactly its policy's ``max_attempts`` new attempts, numbered on from the last."""
    run, stored = drawn
    state, now = run.state, run.now_ms
    rng = random.Random(0)
    for _ in range(3):
        reached = state.node_map()
        state, now, _ = _drive(run.wf, resume_failed(state), now, stored, rng, p_ok=0.0)
        assert state.status is RunStatus.FAILED
        failed = [(n, s) for n, s in state.nodes if s.status is NodeStatus.FAILED]
        assert failed
        name, node = failed[0]
        assert node.attempts_before == reached[name].attempt
        # All of its policy's attempts, or fewer when its schedule-to-close bound ended it
        # (a bound each resume gives whole again too: counted from its first new dispatch).
        made = node.attempt - node.attempts_before
        assert made == run.wf.step(name).retry.max_attempts or (
            made >= 1 and "(schedule_to_close_ms)" in (node.error or "")
        )
        assert state.reason is not None and repr(name) in state.reason


@FAST
@given(st.one_of(terminal_states(), runs(live_only=True).map(lambda r: (r.wf, r.state))))
def test_only_a_failed_run_can_be_resumed(drawn: tuple[WorkflowDef, RunState]) -> None:
    _, state = drawn
    if state.status is RunStatus.FAILED:
        assert resume_failed(state).status is RunStatus.RUNNING
        return
    with pytest.raises(NotResumable, match=str(state.status)):
        resume_failed(state)


def test_attempts_before_is_written_only_when_set_so_older_states_keep_their_checksum() -> None:
    plain = NodeState(NodeStatus.FAILED, 3, error="boom")
    assert "attempts_before" not in plain.to_json()
    assert NodeState.from_json(plain.to_json()) == plain
    resumed = NodeState(NodeStatus.PENDING, 3, attempts_before=3)
    assert resumed.to_json() == {"status": "pending", "attempt": 3, "attempts_before": 3}
    assert NodeState.from_json(orjson.loads(orjson.dumps(resumed.to_json()))) == resumed
