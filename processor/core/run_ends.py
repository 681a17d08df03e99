"""How a run ends, and how a failed one is taken back: the terminal state a tick writes when
a run succeeds, fails or is cancelled (``end_run``: what was in flight cancelled), the two
transitions that come from outside a tick (``force_fail``: the livelock guard and the stuck-run
watchdog end a live run; ``resume_failed``: an operator's ``ductor runs retry``), and the order
of a state's nodes. The rules are core/tick.py's. Pure.
"""

from __future__ import annotations

from processor.core.map_steps import Maps
from processor.core.run_state import (
    NodeState,
    NodeStatus,
    RunState,
    RunStatus,
    items_in,
    node_state,
)
from processor.core.tick_decision import Decision
from processor.core.workflow_def import WorkflowDef

_PENDING, _DISPATCHED = NodeStatus.PENDING, NodeStatus.DISPATCHED
_RETRY_WAIT, _LIMIT_WAIT = NodeStatus.RETRY_WAIT, NodeStatus.LIMIT_WAIT
_SUCCEEDED, _FAILED, _CANCELLED = NodeStatus.SUCCEEDED, NodeStatus.FAILED, NodeStatus.CANCELLED
_SKIPPED = NodeStatus.SKIPPED
_RUN_RUNNING = RunStatus.RUNNING
_IN_FLIGHT = (_PENDING, _DISPATCHED, _RETRY_WAIT, _LIMIT_WAIT)


def end_run(
    state: RunState,
    nodes: dict[str, NodeState],
    status: RunStatus,
    reason: str | None,
    wf: WorkflowDef | None = None,
    maps: Maps | None = None,
) -> Decision:
    """The decision that ends the run with ``status``: every node still in flight cancelled,
    in the state's order (``wf`` given: a map's items placed, its progress and the items this
    tick took out kept from ``maps``)."""
    order = state.nodes if wf is None else ordered_nodes(state, nodes, wf)
    ended = tuple(
        (
            n,
            node_state(_CANCELLED, s.attempt, None, s.error, s.attempts_before)
            if s.status in _IN_FLIGHT
            else s,
        )
        for n, s in ((name, nodes[name]) for name, _ in order)
    )
    if maps is None or wf is None:
        return Decision(RunState(status, ended, state.seq + 1, reason, state.maps, state.versions))
    new_state = RunState(status, ended, state.seq + 1, reason, maps.progress_of(wf), state.versions)
    return Decision(new_state, items_done=tuple(maps.done))


def failure(state: RunState, nodes: dict[str, NodeState]) -> str | None:
    """The reason the run fails, if a node failed for good."""
    for name, node in nodes.items():
        if node.status is _FAILED:
            return f"step {name!r} failed after {node.attempt} attempt(s): {node.error}"
    return None


def ordered_nodes(
    state: RunState, nodes: dict[str, NodeState], wf: WorkflowDef
) -> tuple[tuple[str, NodeState], ...]:
    """The nodes in the state's order: the definition's, each map step's items in the state
    right after it by index (those this tick started too; those it took out gone)."""
    if not wf.has_maps:
        return tuple((name, nodes[name]) for name, _ in state.nodes)
    items = items_in(nodes)
    ordered: list[tuple[str, NodeState]] = []
    for step in wf.steps:
        ordered.append((step.name, nodes[step.name]))
        if step.maps:
            ordered += [(item, nodes[item]) for _, item in items.get(step.name, ())]
    return tuple(ordered)


def force_fail(state: RunState, reason: str) -> RunState | None:
    """The terminal path shared by the livelock guard and the stuck-run watchdog.

    Returns None when the run already ended (nothing to fail).
    """
    if state.status.terminal:
        return None
    return end_run(state, state.node_map(), RunStatus.FAILED, reason).new_state


class NotResumable(ValueError):
    """``resume_failed`` was given a run that is not failed."""


def resume_failed(state: RunState, pending: bool = False) -> RunState:
    """A failed run resumed from its failed steps: running again, ``seq`` + 1, no failure
    reason; succeeded and skipped nodes untouched; every other node (the failed ones, and those
    cancelled when the run failed) pending, with no deadline and no error, at the attempt it
    reached. The next dispatch of a node is therefore a new attempt number (a step result of an
    earlier attempt can never be taken for one of the new ones), and ``attempts_before``
    gives each step its policy's whole budget of attempts again.

    ``pending``: a run of a workflow with ``concurrency`` goes back to pending instead, so that
    its next tick starts it again once its key has room (core/run_keys.py).

    Raises NotResumable for a run that is not failed."""
    if state.status is not RunStatus.FAILED:
        raise NotResumable(f"only a failed run can be resumed; this one is {state.status}")
    nodes = tuple(
        (
            name,
            node
            if node.status is _SUCCEEDED or node.status is _SKIPPED
            else node_state(_PENDING, node.attempt, None, None, node.attempt),
        )
        for name, node in state.nodes
    )
    status = RunStatus.PENDING if pending else _RUN_RUNNING
    return RunState(status, nodes, state.seq + 1, None, state.maps, state.versions)
