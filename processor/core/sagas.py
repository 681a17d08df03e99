"""Compensation (a saga) and failure handlers: a run that fails or is cancelled undoes what
it did before it ends, and a run that fails tells its handler. The rules are core/tick.py's
(rule 2c); they apply only to a workflow where a task step declares a ``compensate`` or that
declares an ``on_failure`` (``WorkflowDef.compensates``): the tick of any other is unchanged.

- A step with a compensation that succeeds records when (``done_seq``: the ``seq`` of the
  transition that applied its success).
- When the run would end failed (a step failed for good, its deadline passed) or cancelled
  (a cancel signal), and steps with a compensation succeeded, it does not end: what is in
  flight is cancelled as an end cancels it (core/run_ends.py ``end_run``), the run stays
  ``running`` with the reason it will end with, and a node is added to its state for each of
  those steps (``undo(step)``, pending), in the order they will run: the last done first
  (``undo_order``). That is the saga. No such step succeeded: the run ends as before, and
  nothing is undone.
- The saga runs its nodes one at a time, in that order: the first that has not succeeded is
  dispatched (a task like any other, of the compensation's type and queue, reading the run's
  input and the output of the step it undoes), retried by the compensation's own policy and
  judged by its own timeouts. When they all succeeded, the run ends as it was to end
  (``failed`` or ``cancelled``, with its reason): compensation completed. One that failed for
  good stops the saga: the run ends so too, the nodes after it cancelled (never run), and
  its compensation failed, at that step.
- A run that fails (not one cancelled) of a workflow with a failure handler runs its saga
  whatever succeeded: first in it, two nodes: ``failure``, succeeded at once, its output
  the failure (``failure_document``: the reason, the step that failed for good, its attempt
  and error; the commit records it as the tick's ``settled`` output), and ``on_failure``,
  the handler's task, which reads it as a dependency. The handler's own failure for good
  stops nothing: the compensations run after it.
- A live run in its saga is the only live run with a reason (``undoing``).
- While the saga runs, nothing else changes the run: a cancel signal (a second one, or the
  first during a saga its failure began) and the run's deadline change nothing; results of
  the steps cancelled apply to nothing (rule 3). Each compensation is so run once per
  attempt, as any task is, and the saga never starts again.
- What the outcome was is read from the ended state (``compensation_of``): ``none`` (nothing
  to undo), ``running``, ``completed``, ``failed`` at a step, or ``stopped`` (force-failed
  during the saga).

Two ends skip the saga: ``force_fail`` (the livelock guard and the stuck-run watchdog end a
run whose ticks cannot commit; running more steps is what cannot be done there) and an
operator's quarantine. A run whose saga ran is not resumed by ``ductor runs retry`` (what it
did was undone, its failure handled; start a new run). Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

import orjson

from processor.core.applied import apply_results, apply_timeouts
from processor.core.attempts import dispatched
from processor.core.map_steps import Maps
from processor.core.model import Started, StepResult
from processor.core.run_ends import end_run
from processor.core.run_state import (
    NodeState,
    NodeStatus,
    RunState,
    RunStatus,
    node_state,
    undo_order,
)
from processor.core.tick_decision import Decision, Dispatch
from processor.core.workflow_def import FAILURE_NODE, ON_FAILURE_NODE, WorkflowDef, undo_node

__all__ = [
    "CANCEL_REASON",
    "Compensation",
    "compensation_of",
    "failure_document",
    "saga_ran",
    "step_saga",
    "undo_or_end",
    "undo_tick",
    "undoing",
]

# Why a run cancelled by a signal ended (or will, once its saga ended).
CANCEL_REASON = "cancelled by signal"

_PENDING, _DISPATCHED = NodeStatus.PENDING, NodeStatus.DISPATCHED
_RETRY_WAIT, _SUCCEEDED, _FAILED = NodeStatus.RETRY_WAIT, NodeStatus.SUCCEEDED, NodeStatus.FAILED
_RUNNING = RunStatus.RUNNING
_UNDO = "undo("


def undoing(state: RunState) -> bool:
    """Whether a run of a workflow with a saga is in it: live with the reason it will end
    with (every other live state has none: a resumed run's is cleared)."""
    return state.status is _RUNNING and state.reason is not None


def saga_ran(state: RunState, wf: WorkflowDef) -> bool:
    """Whether the run's saga began (its handler or its compensations ran, or run)."""
    return wf.compensates and any(_in_saga(name, wf) for name, _ in state.nodes)


def _in_saga(name: str, wf: WorkflowDef) -> bool:
    """Whether node ``name`` is one of a saga's (no step of a workflow with one is so named)."""
    if name.startswith(_UNDO):
        return True
    return wf.on_failure is not None and name in (ON_FAILURE_NODE, FAILURE_NODE)


def failure_document(nodes: Mapping[str, NodeState], reason: str) -> str:
    """What the failure handler reads of the run's failure (``ctx.deps["failure"]``), as
    canonical JSON text: the reason, and the step that failed for good with its last attempt
    and error (null for a run past its deadline)."""
    failed = next(((n, s) for n, s in nodes.items() if s.status is _FAILED), None)
    document = {
        "reason": reason,
        "step": None if failed is None else failed[0],
        "attempt": None if failed is None else failed[1].attempt,
        "error": None if failed is None else failed[1].error,
    }
    return orjson.dumps(document, option=orjson.OPT_SORT_KEYS).decode()


def undo_or_end(
    state: RunState,
    nodes: dict[str, NodeState],
    status: RunStatus,
    reason: str,
    wf: WorkflowDef,
    now_ms: int,
    maps: Maps | None = None,
) -> Decision:
    """The decision that ends the run with ``status`` (failed or cancelled) and ``reason``,
    or, when it has a failure handler to run or steps with a compensation succeeded, begins
    its saga instead (the rules above)."""
    ended = end_run(state, nodes, status, reason, wf, maps)
    if not wf.compensates:
        return ended
    undo = undo_order(wf, nodes)
    handles = wf.on_failure is not None and status is RunStatus.FAILED
    if not undo and not handles:
        return ended
    assert ended.new_state is not None
    saga_nodes = [(undo_node(s), NodeState()) for s in undo]
    settled: tuple[tuple[str, int, str], ...] = ()
    if handles:  # the failure, recorded as its node's output, and the handler that reads it
        settled = ((FAILURE_NODE, 1, failure_document(nodes, reason)),)
        handler = [(FAILURE_NODE, node_state(_SUCCEEDED, 1)), (ON_FAILURE_NODE, NodeState())]
        saga_nodes = handler + saga_nodes
    begun = [*ended.new_state.nodes, *saga_nodes]
    # At the seq the tick started from: stepping it bumps it by one, as any transition does.
    new = ended.new_state
    saga = RunState(_RUNNING, tuple(begun), state.seq, reason, new.maps, new.versions)
    stepped = step_saga(saga, wf, dict(begun), now_ms)
    return stepped._replace(items_done=ended.items_done, settled=settled)


def undo_tick(
    state: RunState,
    wf: WorkflowDef,
    results: Iterable[StepResult],
    started: Mapping[str, Started] | None,
    now_ms: int,
) -> Decision:
    """The tick of a run in its saga (core/tick.py, rule 2c): its compensations' results and
    timeouts applied (rules 3 to 5; every other node ended), then its saga's next step."""
    step_of = wf.step_for if wf.has_maps else wf.step_map.__getitem__
    nodes = state.node_map()
    apply_results(nodes, results, step_of, now_ms, state.seq + 1)
    unstarted = apply_timeouts(nodes, step_of, started, now_ms, [])
    decision = step_saga(state, wf, nodes, now_ms)
    if unstarted and decision.new_state is not None:
        return decision._replace(unstarted=tuple(unstarted))
    return decision


def step_saga(
    state: RunState, wf: WorkflowDef, nodes: dict[str, NodeState], now_ms: int
) -> Decision:
    """The saga's next step, ``nodes`` its state once this tick's results and timeouts were
    applied: the first of its nodes not succeeded dispatched when it is pending or due for
    its retry, or the run ended when they all succeeded or one failed for good. ``state``'s
    ``seq`` is that of the state the tick started from (or the one it begins the saga in)."""
    step_of = wf.step_map.__getitem__
    dispatches: list[Dispatch] = []
    for name, _ in state.nodes:
        if not _in_saga(name, wf):
            continue
        node = nodes[name]
        if node.status is _SUCCEEDED or (node.status is _FAILED and name == ON_FAILURE_NODE):
            continue  # (the handler's failure stops nothing)
        if node.status is _FAILED:
            return end_run(state, nodes, _ends_as(state), state.reason)
        due = node.status is _RETRY_WAIT and node.due_ms is not None and now_ms >= node.due_ms
        if node.status is _PENDING or due:
            step = step_of(name)
            nodes[name] = dispatched(node, step, node.attempt + 1, now_ms)
            deadline = now_ms + step.timeout_ms
            dispatches.append(Dispatch(name, node.attempt + 1, step.step_type, deadline))
        break
    else:
        return end_run(state, nodes, _ends_as(state), state.reason)
    new_nodes = tuple((name, nodes[name]) for name, _ in state.nodes)
    if new_nodes == state.nodes:
        return Decision(None)
    new_state = RunState(
        _RUNNING, new_nodes, state.seq + 1, state.reason, state.maps, state.versions
    )
    before = dict(state.nodes)
    # A compensation's retry wait this tick began: the shell wakes the run when it is due.
    timers = tuple(
        s.due_ms
        for n, s in new_nodes
        if s.status is _RETRY_WAIT and s.due_ms is not None and before[n] != s
    )
    return Decision(new_state, tuple(dispatches), timers)


def _ends_as(state: RunState) -> RunStatus:
    """How a run in its saga ends: cancelled when a cancel began it, failed otherwise."""
    return RunStatus.CANCELLED if state.reason == CANCEL_REASON else RunStatus.FAILED


class Compensation(NamedTuple):
    """What became of a run's compensation: ``none`` (nothing was undone, or there was
    nothing to undo), ``running`` (its saga runs), ``completed``, ``failed`` (``step``: the
    step whose compensation failed for good; ``error``: its last error), or ``stopped`` (the
    run was force-failed during its saga: what had not run never will)."""

    outcome: str
    step: str | None = None
    error: str | None = None

    def __str__(self) -> str:
        if self.step is None:
            return self.outcome
        return f"{self.outcome} (undoing {self.step!r}: {self.error})"


_NONE = Compensation("none")


def compensation_of(state: RunState, wf: WorkflowDef) -> Compensation:
    """What became of the run's compensation, read from its state."""
    if not wf.compensates:
        return _NONE
    saga = [(n, s) for n, s in state.nodes if n.startswith(_UNDO)]
    if not saga:
        return _NONE
    for name, node in saga:
        if node.status is _FAILED:
            return Compensation("failed", name[len(_UNDO) : -1], node.error)
    if all(node.status is _SUCCEEDED for _, node in saga):
        return Compensation("completed")
    # Ended before its saga did: force-failed by the watchdog or the livelock guard.
    return Compensation("stopped" if state.status.terminal else "running")
