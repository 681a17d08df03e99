"""The tick: a pure function from (loaded state, definition, step results, signals, now) to a
decision. Every state transition of a run is decided here and nowhere else.

Rules, in the order they are applied:

1. A terminal run (succeeded, failed, cancelled) absorbs everything: the tick is a no-op.
2. A ``cancel`` signal ends the run as cancelled; nodes still in flight become cancelled.
   A pending run whose start time is ahead (``not_before_ms``: a delayed start, a schedule's
   fire) does nothing else until then, whatever woke it.
3. Each step result is applied at most once: only a result whose attempt is the node's attempt
   in flight (status dispatched) applies. A duplicate, stale or unknown result changes nothing,
   and results are applied in a canonical order, so arrival order does not matter.
   A wait step in flight succeeds with the first signal of its name sent to the run (in the
   order they were received, before it started waiting or after): the decision names the
   signal, whose payload the commit records as the step's result. One that starts waiting
   when its signal is there already succeeds in the same tick, and so may what follows it.
   A workflow step in flight waits for its child run's end, which comes as its result like a
   worker's (core/children.py).
4. A dispatched node whose deadline has passed has failed its attempt ("timed out").
5. A failed attempt is retried by the step's policy (retry_wait until its backoff is due),
   or fails the node when attempts are exhausted (counted since the run was last resumed, see
   below) or the step declared the failure final (a result that is not ``retryable``: the
   step raised NonRetryable); a failed node fails the run.
6. Due retries are dispatched with the next attempt; pending nodes whose dependencies all
   succeeded are dispatched with their next attempt (1, unless the run was resumed), each with
   its deadline.
7. When every node succeeded the run succeeded.
8. A tick that changes nothing is a no-op and writes nothing; one that changes anything bumps
   ``seq`` by exactly one (so ``last_transition_seq`` is monotone).

Two transitions come from outside a tick, and live here too: ``force_fail`` (the livelock
guard and the stuck-run watchdog end a live run) and ``resume_failed`` (an operator's
``ductor runs retry`` takes a failed run back to running: its succeeded nodes are kept, every
other node is pending again, its attempt numbers going on and its retry budget whole again).

The tick never reads the clock, never draws randomness, never does I/O: ``now_ms`` is an
argument, and the shell carries out the returned decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import NamedTuple

from processor.core.model import (
    NodeState,
    NodeStatus,
    RunState,
    RunStatus,
    SignalKind,
    StepOutcome,
    StepResult,
)
from processor.core.workflow import StepDef, WorkflowDef

# The enum members the tick compares against, as module globals: on Python 3.11 reading
# `NodeStatus.DISPATCHED` goes through the enum's metaclass (~130 ns), dozens of times a tick.
_PENDING, _DISPATCHED = NodeStatus.PENDING, NodeStatus.DISPATCHED
_RETRY_WAIT = NodeStatus.RETRY_WAIT
_SUCCEEDED, _FAILED, _CANCELLED = NodeStatus.SUCCEEDED, NodeStatus.FAILED, NodeStatus.CANCELLED
_RUN_PENDING, _RUN_RUNNING = RunStatus.PENDING, RunStatus.RUNNING
_IN_FLIGHT = (_PENDING, _DISPATCHED, _RETRY_WAIT)


# Dispatch and Decision are NamedTuples (immutable, compared and hashed in C): a tick makes
# several, and a frozen dataclass's __init__ sets each field through object.__setattr__.
class Dispatch(NamedTuple):
    """A step attempt to send to the workers."""

    node: str
    attempt: int
    step_type: str
    deadline_ms: int


class Decision(NamedTuple):
    """What the shell must do. ``new_state is None`` means no-op: write nothing, send nothing."""

    new_state: RunState | None
    dispatches: tuple[Dispatch, ...] = ()
    timers: tuple[int, ...] = ()  # epoch ms at which a retry wait ends and the run must be woken
    # Wait steps this tick ended, each with the signal that ended it: (node, attempt, signal id)
    signalled: tuple[tuple[str, int, str], ...] = ()

    @property
    def progressed(self) -> bool:
        return self.new_state is not None


NOOP = Decision(new_state=None)


def tick(
    state: RunState,
    wf: WorkflowDef,
    results: Iterable[StepResult],
    signals: Iterable[SignalKind],
    now_ms: int,
    not_before_ms: int | None = None,
    named: Sequence[tuple[str, str]] = (),
) -> Decision:
    """``named``: the run's named signals, (name, signal id), in the order received."""
    if state.status.terminal:
        return NOOP
    if SignalKind.CANCEL in set(signals):
        return _end(state, state.node_map(), RunStatus.CANCELLED, "cancelled by signal")
    if not_before_ms is not None and now_ms < not_before_ms and state.status is _RUN_PENDING:
        return NOOP

    steps = wf.step_map
    nodes = state.node_map()
    for result in sorted(set(results), key=_result_order):
        node = nodes.get(result.node)
        if node is None or node.status is not _DISPATCHED:
            continue
        if node.attempt != result.attempt:
            continue
        ok = result.outcome is StepOutcome.SUCCEEDED
        nodes[result.node] = _finish_attempt(
            node, steps[result.node], ok, result.error, now_ms, result.retryable
        )

    signalled = _signal_waits(nodes, wf, named)

    for name, node in list(nodes.items()):
        if node.status is _DISPATCHED and node.due_ms is not None and now_ms >= node.due_ms:
            error = f"attempt {node.attempt} timed out after {steps[name].timeout_ms} ms"
            nodes[name] = _finish_attempt(node, steps[name], False, error, now_ms)

    failed = [n for n, s in nodes.items() if s.status is _FAILED]
    if failed:
        first = failed[0]
        reason = (
            f"step {first!r} failed after {nodes[first].attempt} attempt(s): {nodes[first].error}"
        )
        return _end(state, nodes, RunStatus.FAILED, reason)

    dispatches, waiting = _dispatch_ready(nodes, wf, now_ms)
    while waiting and (ended := _signal_waits(nodes, wf, named)):
        # A wait whose signal came first ends at once, and what follows it starts now.
        signalled += ended
        more, waiting = _dispatch_ready(nodes, wf, now_ms)
        dispatches += more
    if all(s.status is _SUCCEEDED for s in nodes.values()):
        ended_run = _end(state, nodes, RunStatus.SUCCEEDED, None)
        return ended_run._replace(signalled=tuple(signalled))

    started = dispatches or waiting or signalled
    status = _RUN_RUNNING if state.status is _RUN_PENDING and started else state.status
    new_nodes = tuple((name, nodes[name]) for name, _ in state.nodes)
    if status is state.status and new_nodes == state.nodes:
        return NOOP
    new_state = RunState(status, new_nodes, state.seq + 1, state.reason)
    return Decision(new_state, tuple(dispatches), _new_timers(state, new_state), tuple(signalled))


def _result_order(result: StepResult) -> tuple[str, int, str, str]:
    return (result.node, result.attempt, result.outcome, result.error or "")


def force_fail(state: RunState, reason: str) -> RunState | None:
    """The terminal path shared by the livelock guard and the stuck-run watchdog.

    Returns None when the run already ended (nothing to fail).
    """
    if state.status.terminal:
        return None
    return _end(state, state.node_map(), RunStatus.FAILED, reason).new_state


class NotResumable(ValueError):
    """``resume_failed`` was given a run that is not failed."""


def resume_failed(state: RunState) -> RunState:
    """A failed run resumed from its failed steps: running again, ``seq`` + 1, no failure
    reason; succeeded nodes untouched; every other node (the failed ones, and those cancelled
    when the run failed) pending, with no deadline and no error, at the attempt it reached.
    The next dispatch of a node is therefore a new attempt number (a step result of an
    earlier attempt can never be taken for one of the new ones), and ``attempts_before``
    gives each step its policy's whole budget of attempts again.

    Raises NotResumable for a run that is not failed."""
    if state.status is not RunStatus.FAILED:
        raise NotResumable(f"only a failed run can be resumed; this one is {state.status}")
    nodes = tuple(
        (
            name,
            node
            if node.status is _SUCCEEDED
            else NodeState(_PENDING, node.attempt, None, None, node.attempt),
        )
        for name, node in state.nodes
    )
    return RunState(_RUN_RUNNING, nodes, state.seq + 1, None)


def _finish_attempt(
    node: NodeState,
    step: StepDef,
    ok: bool,
    error: str | None,
    now_ms: int,
    retryable: bool = True,
) -> NodeState:
    if ok:
        return NodeState(_SUCCEEDED, node.attempt, None, None, node.attempts_before)
    # The policy counts the attempts since the run was last resumed (none before: attempt).
    tried = node.attempt - node.attempts_before
    if retryable and tried < step.retry.max_attempts:
        due = now_ms + step.retry.delay_after(tried)
        return NodeState(_RETRY_WAIT, node.attempt, due, error, node.attempts_before)
    return NodeState(_FAILED, node.attempt, None, error, node.attempts_before)


def _dispatch_ready(
    nodes: dict[str, NodeState], wf: WorkflowDef, now_ms: int
) -> tuple[list[Dispatch], int]:
    """Start what is ready: the step attempts to send to the workers, and how many steps
    began that no worker runs (a wait step, which a signal ends; a workflow step, whose child
    run the commit starts)."""
    dispatches = []
    waiting = 0
    for step in wf.steps:  # definition order keeps the decision deterministic
        node = nodes[step.name]
        retry_due = node.status is _RETRY_WAIT and node.due_ms is not None and now_ms >= node.due_ms
        first_run = node.status is _PENDING and all(
            nodes[d].status is _SUCCEEDED for d in step.depends_on
        )
        if retry_due or first_run:
            attempt = node.attempt + 1
            deadline = now_ms + step.timeout_ms
            nodes[step.name] = NodeState(_DISPATCHED, attempt, deadline, None, node.attempts_before)
            if step.runs_on_a_worker:
                dispatches.append(Dispatch(step.name, attempt, step.step_type, deadline))
            else:
                waiting += 1
    return dispatches, waiting


def _signal_waits(
    nodes: dict[str, NodeState], wf: WorkflowDef, named: Sequence[tuple[str, str]]
) -> list[tuple[str, int, str]]:
    """End each wait step in flight whose signal was received (the first of its name)."""
    ended: list[tuple[str, int, str]] = []
    if not named:
        return ended
    for step in wf.steps:
        if not step.waits:
            continue
        node = nodes[step.name]
        if node.status is not _DISPATCHED:
            continue
        first = next((sid for name, sid in named if name == step.signal), None)
        if first is not None:
            nodes[step.name] = NodeState(_SUCCEEDED, node.attempt, None, None, node.attempts_before)
            ended.append((step.name, node.attempt, first))
    return ended


def _end(
    state: RunState, nodes: dict[str, NodeState], status: RunStatus, reason: str | None
) -> Decision:
    ended = tuple(
        (
            n,
            NodeState(_CANCELLED, s.attempt, None, s.error, s.attempts_before)
            if s.status in _IN_FLIGHT
            else s,
        )
        for n, s in ((name, nodes[name]) for name, _ in state.nodes)
    )
    return Decision(RunState(status, ended, state.seq + 1, reason))


def _new_timers(old: RunState, new: RunState) -> tuple[int, ...]:
    """Retry waits set by this tick: the shell wakes the run when each is due.

    Step deadlines get no timer: they are the failure path (most steps answer first), so the
    watchdog enforces them from ``next_wakeup_at`` and no record per dispatch is needed.
    """
    old_waits = {(n, s.attempt) for n, s in old.nodes if s.status is _RETRY_WAIT}
    dues = {
        s.due_ms
        for n, s in new.nodes
        if s.status is _RETRY_WAIT and s.due_ms is not None and (n, s.attempt) not in old_waits
    }
    return tuple(sorted(dues))
