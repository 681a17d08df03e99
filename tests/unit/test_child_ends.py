"""A force-failed run and its children in the pure core (core/children.py, rule 4): the write
that force-fails a parent cancels its children in flight and wakes them, the one that
force-fails a child wakes its parent, and (Hypothesis) whatever happens to a parent, retried
or not, at most one child of a step is live and none once the parent ended."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from processor.core.children import child_run_id, children_started, children_to_cancel
from processor.core.decide import force_fail_refused, force_fail_write
from processor.core.envelope import Wakeup, decode_wakeup
from processor.core.model import LoadedRun, ParentLink, StepOutcome, StepResult
from processor.core.outcomes import ForceFailReason, Outcome
from processor.core.plans import ForceFailed, Plan, TryAgain
from processor.core.routing import TopicNames
from processor.core.run_ends import resume_failed
from processor.core.run_state import NodeStatus, RunState, RunStatus, initial_state, state_checksum
from processor.core.stuck import Fail, judge_stuck
from processor.core.tick import tick
from processor.core.workflow import parse_workflow

NAMES = TopicNames("ductor")
PARENT: dict[str, Any] = {
    "name": "order",
    "version": 1,
    "steps": [
        {"name": "price", "type": "price"},
        {
            "name": "ship",
            "kind": "workflow",
            "workflow": "shipping",
            "depends_on": ["price"],
            "retry": {"max_attempts": 2},
            "timeout_ms": 5000,
        },
    ],
}
WF = parse_workflow(PARENT)
CHILD = parse_workflow({"name": "shipping", "version": 1, "steps": [{"name": "book", "type": "b"}]})
PRICED = StepResult("price", 1, StepOutcome.SUCCEEDED)


def _shipping() -> RunState:
    """The parent with ``ship``'s first attempt in flight (its child o-1/ship#1 started)."""
    first = tick(initial_state(WF), WF, (), (), 0).new_state
    assert first is not None
    after = tick(first, WF, [PRICED], (), 1).new_state
    assert after is not None and after.node("ship").status is NodeStatus.DISPATCHED
    return after


def _loaded(run_id: str, wf: Any, state: RunState, parent: ParentLink | None = None) -> LoadedRun:
    return LoadedRun(
        run_id, wf, state, 3, "t1", stored_checksum=state_checksum(state), parent=parent
    )


def _wakeups(write: Any) -> list[tuple[str, str, str]]:
    """(topic, run id, reason) of each record a force-fail write keeps in the outbox."""
    found = []
    for send in write.effects:
        wakeup = decode_wakeup(send.value, 1_000_000)
        assert isinstance(wakeup, Wakeup) and send.by_run == wakeup.run_id
        found.append((send.topic, wakeup.run_id, wakeup.reason))
    return found


def test_a_force_failed_parent_cancels_its_child_in_flight_and_wakes_it() -> None:
    run = _loaded("o-1", WF, _shipping())
    write = force_fail_write(run, ForceFailReason.LIVELOCK, 10, NAMES)
    assert write is not None and write.state.status is RunStatus.FAILED
    assert write.loaded_checksum == run.stored_checksum
    assert write.cancel_children == ("o-1/ship#1",)
    assert _wakeups(write) == [("ductor.wakeup.t1", "o-1/ship#1", "signal")]


def test_a_force_failed_child_wakes_its_parent_at_once() -> None:
    state = tick(initial_state(CHILD), CHILD, (), (), 0).new_state
    assert state is not None
    run = _loaded("o-1/ship#1", CHILD, state, ParentLink("o-1", "ship", 1))
    write = force_fail_write(run, ForceFailReason.LIVELOCK, 10, NAMES)
    assert write is not None and write.cancel_children == ()
    assert _wakeups(write) == [("ductor.wakeup.t1", "o-1", "step_result")]


def test_a_stuck_parent_is_failed_with_its_children_cancelled() -> None:
    state = _shipping()
    nodes = state.node_map()
    nodes["ship"] = nodes["ship"]._replace(due_ms=None)  # nothing can move it
    run = _loaded("o-1", WF, state.with_nodes(nodes))
    verdict = judge_stuck(run, state.seq, 10, NAMES)
    assert isinstance(verdict, Fail)
    assert verdict.write.cancel_children == ("o-1/ship#1",)
    assert _wakeups(verdict.write) == [("ductor.wakeup.t1", "o-1/ship#1", "signal")]


def test_a_run_without_children_or_parent_writes_no_records_and_an_ended_one_nothing() -> None:
    plain = parse_workflow({"name": "p", "version": 1, "steps": [{"name": "a", "type": "a"}]})
    state = tick(initial_state(plain), plain, (), (), 0).new_state
    assert state is not None
    write = force_fail_write(_loaded("p-1", plain, state), ForceFailReason.STUCK, 10, NAMES)
    assert write is not None and (write.cancel_children, write.effects) == ((), ())
    ended = RunState(RunStatus.SUCCEEDED, state.nodes, state.seq + 1, None)
    assert force_fail_write(_loaded("p-1", plain, ended), ForceFailReason.STUCK, 10, NAMES) is None


def test_a_refused_force_fail_produces_nothing() -> None:
    write = force_fail_write(_loaded("o-1", WF, _shipping()), ForceFailReason.LIVELOCK, 10, NAMES)
    assert write is not None
    failed = ForceFailed(ForceFailReason.LIVELOCK, write)
    plan = Plan("o-1", Outcome.FORCE_FAILED, failed, Outcome.CONFLICT)
    refused = force_fail_refused(plan)
    assert (refused.sends, refused.payload) == ((), TryAgain(0, 0))


# One event of the property below: a result of ``ship``'s child (its attempt; the child
# ended), time passing, or a force-fail followed by ``ductor runs retry``.
_EVENTS = st.one_of(
    st.tuples(st.just("result"), st.integers(1, 6), st.sampled_from(list(StepOutcome))),
    st.tuples(st.just("time"), st.integers(0, 8000)),
    st.tuples(st.just("force_fail_and_retry")),
)


@given(st.lists(_EVENTS, max_size=12))
def test_at_most_one_child_of_a_step_is_live_whatever_happens_to_its_parent(
    events: list[tuple[Any, ...]],
) -> None:
    """A child is live from the transition that starts it until its result applies or a
    transition (a tick, or a force-fail) cancels it. Through results, timeouts, retries of
    the step, force-fails and retries of the run: never two live children of ``ship``, none
    once the parent ended, and no child id started twice."""
    state = _shipping()
    live = {child_run_id("o", "ship", 1)}
    started = set(live)
    results: list[StepResult] = [PRICED]
    now = 10
    for event in events:
        new: RunState | None
        if event[0] == "force_fail_and_retry":
            write = force_fail_write(_loaded("o", WF, state), ForceFailReason.STUCK, now, NAMES)
            if write is not None:
                live -= set(write.cancel_children)
                assert not live, "a force-failed parent left a child live"
                state = write.state
            if state.status is not RunStatus.FAILED:
                continue  # it succeeded: nothing to retry
            old = resume_failed(state)
            new = tick(old, WF, results, (), now).new_state
        else:
            if event[0] == "result":
                attempt, outcome = event[1], event[2]
                child = child_run_id("o", "ship", attempt)
                if child not in live:
                    continue  # only a live child ends
                results.append(StepResult("ship", attempt, outcome))
            else:
                now += event[1]
            old = state
            new = tick(state, WF, results, (), now).new_state
        if new is None:
            state = old
            continue
        node = old.node("ship")
        if node.status is NodeStatus.DISPATCHED and any(
            r.node == "ship" and r.attempt == node.attempt for r in results
        ):
            live.discard(child_run_id("o", "ship", node.attempt))  # its end applied
        live -= set(children_to_cancel("o", WF, old, new))
        for start in children_started("o", WF, old, new):
            assert start.run_id not in started, "a child id was started twice"
            started.add(start.run_id)
            live.add(start.run_id)
        state = new
        assert len(live) <= 1
        if state.status.terminal:
            assert not live
