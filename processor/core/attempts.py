"""A step attempt's life in a run's state, as the tick (core/tick.py) moves it: dispatched
(due when its first bound could pass, rule 6), finished (succeeded, retried by its policy, or
failed, rule 5) and judged by its timeouts once its due time passed (rule 4). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from processor.core.model import Started
from processor.core.run_state import NodeState, NodeStatus, node_state
from processor.core.workflow_def import StepDef

# As module globals: reading `NodeStatus.DISPATCHED` goes through the enum's metaclass.
_DISPATCHED, _RETRY_WAIT = NodeStatus.DISPATCHED, NodeStatus.RETRY_WAIT
_SUCCEEDED, _FAILED = NodeStatus.SUCCEEDED, NodeStatus.FAILED


def dispatched(node: NodeState, step: StepDef, attempt: int, now_ms: int) -> NodeState:
    """``node`` dispatched now with ``attempt``: due when its first bound could pass (rule
    6): its heartbeat timeout (shorter than its timeout), else its timeout, from now; its
    schedule-to-start and schedule-to-close bounds when sooner, which it then remembers
    (``since_ms``, ``first_ms``: rule 4)."""
    beat = step.heartbeat_timeout_ms
    due = now_ms + (step.timeout_ms if beat is None else beat)
    to_start, to_close = step.schedule_to_start_ms, step.schedule_to_close_ms
    if to_start is None and to_close is None:  # the common case: nothing to remember
        return node_state(_DISPATCHED, attempt, due, None, node.attempts_before)
    since = None
    if to_start is not None:
        since = now_ms
        due = min(due, now_ms + to_start)
    first = None
    if to_close is not None:
        first = now_ms if node.first_ms is None else node.first_ms
        due = min(due, first + to_close)
    return node_state(_DISPATCHED, attempt, due, None, node.attempts_before, since, first)


def finish_attempt(
    node: NodeState,
    step: StepDef,
    ok: bool,
    error: str | None,
    now_ms: int,
    retryable: bool = True,
) -> NodeState:
    if ok:
        return node_state(_SUCCEEDED, node.attempt, None, None, node.attempts_before)
    # The policy counts the attempts since the run was last resumed (none before: attempt).
    tried = node.attempt - node.attempts_before
    if retryable and tried < step.retry.max_attempts:
        due = now_ms + step.retry.delay_after(tried)
        to_close = step.schedule_to_close_ms
        if to_close is None or node.first_ms is None or due < node.first_ms + to_close:
            return node_state(
                _RETRY_WAIT, node.attempt, due, error, node.attempts_before, None, node.first_ms
            )
        error = closed(to_close, error)
    return node_state(_FAILED, node.attempt, None, error, node.attempts_before)


def closed(to_close: int, error: str | None) -> str:
    """The error of a step whose schedule-to-close bound ends it between two attempts (the
    last attempt's error first)."""
    return (
        f"{error or 'failed'}; not retried: the step must end within {to_close} ms of its"
        " first dispatch (schedule_to_close_ms)"
    )


def judge_timeouts(
    node: NodeState,
    step: StepDef,
    started: Mapping[str, Started] | None,
    name: str,
    now_ms: int,
) -> NodeState | None:
    """Rule 4 for a dispatched attempt a worker runs, whose due time passed: failed by one
    of its timeouts, or due again when the next could pass; None: nothing to change (what
    the workers recorded was not loaded, or it waits in its queue with no bound ahead)."""
    if started is None:
        return None
    attempt = node.attempt
    close_by = None
    if step.schedule_to_close_ms is not None and node.first_ms is not None:
        close_by = node.first_ms + step.schedule_to_close_ms
        if now_ms >= close_by:
            error = (
                f"the step did not end within {step.schedule_to_close_ms} ms of its first"
                f" dispatch (schedule_to_close_ms); attempt {attempt} was in flight"
            )
            return finish_attempt(node, step, False, error, now_ms, retryable=False)
    fact = started.get(name)
    if fact is None or fact.attempt != attempt:  # still in its queue
        return _judge_queued(node, step, close_by, now_ms)
    return _judge_started(node, step, fact, close_by, now_ms)


def _judge_queued(
    node: NodeState, step: StepDef, close_by: int | None, now_ms: int
) -> NodeState | None:
    """An attempt no worker started yet: failed by its schedule-to-start bound, due again at
    its next bound, or as it is (no bound ahead: None)."""
    bounds = [] if close_by is None else [close_by]
    if step.schedule_to_start_ms is not None and node.since_ms is not None:
        start_by = node.since_ms + step.schedule_to_start_ms
        if now_ms >= start_by:
            error = (
                f"attempt {node.attempt} was not started within {step.schedule_to_start_ms} ms"
                " of its dispatch (schedule_to_start_ms)"
            )
            return finish_attempt(node, step, False, error, now_ms, retryable=False)
        bounds.append(start_by)
    return due_at(node, min(bounds)) if bounds else None


def _judge_started(
    node: NodeState, step: StepDef, fact: Started, close_by: int | None, now_ms: int
) -> NodeState:
    """An attempt a worker started: failed by its heartbeat or start-to-close timeout, or due
    again when the first of them could pass."""
    attempt = node.attempt
    close = fact.started_ms + step.timeout_ms
    if close_by is not None:
        close = min(close, close_by)  # (not passed: judged above)
    due = close
    if step.heartbeat_timeout_ms is not None and fact.beats_recorded:
        last = fact.started_ms if fact.beat_ms is None else max(fact.started_ms, fact.beat_ms)
        silent_by = last + step.heartbeat_timeout_ms
        if now_ms >= silent_by and silent_by < close:
            error = (
                f"attempt {attempt} recorded no heartbeat for {step.heartbeat_timeout_ms} ms"
                " (heartbeat_timeout_ms)"
            )
            return finish_attempt(node, step, False, error, now_ms)
        due = min(due, silent_by)
    if now_ms >= close:
        error = f"attempt {attempt} timed out after {step.timeout_ms} ms"
        return finish_attempt(node, step, False, error, now_ms)
    return due_at(node, due)


def unstarted_attempt(started: Mapping[str, Started] | None, name: str, attempt: int) -> bool:
    """Whether no worker had started ``attempt`` of node ``name`` (as far as was loaded)."""
    fact = None if started is None else started.get(name)
    return fact is None or fact.attempt != attempt


def due_at(node: NodeState, due_ms: int) -> NodeState:
    """``node``, due at ``due_ms``."""
    return node_state(
        node.status,
        node.attempt,
        due_ms,
        node.error,
        node.attempts_before,
        node.since_ms,
        node.first_ms,
    )
