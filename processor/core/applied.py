"""How a tick (core/tick.py) applies what came for a run's attempts in flight: their results
(rule 3, in a canonical order, each at most once) and their timeouts once their due time
passed (rule 4). Shared by the tick and a saga's (core/sagas.py). Pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from processor.core.attempts import closed, finish_attempt, judge_timeouts, unstarted_attempt
from processor.core.model import Started, StepOutcome, StepResult
from processor.core.run_state import NodeState, NodeStatus, node_state
from processor.core.shapes import AttemptRef
from processor.core.sleeps import Settled
from processor.core.wait_steps import timed_out
from processor.core.workflow_def import StepDef

__all__ = ["apply_results", "apply_timeouts", "result_order"]

# As module globals: reading `NodeStatus.DISPATCHED` goes through the enum's metaclass.
_DISPATCHED, _FAILED = NodeStatus.DISPATCHED, NodeStatus.FAILED
_RETRY_WAIT, _LIMIT_WAIT = NodeStatus.RETRY_WAIT, NodeStatus.LIMIT_WAIT


def apply_results(
    nodes: dict[str, NodeState],
    results: Iterable[StepResult],
    step_of: Callable[[str], StepDef],
    now_ms: int,
    seq: int,
) -> None:
    """Rule 3: each result of an attempt in flight ends it, in a canonical order (a step
    with a compensation that succeeded records ``seq``, the transition's: rule 2c)."""
    for result in sorted(set(results), key=result_order):
        node = nodes.get(result.node)
        if node is None or node.status is not _DISPATCHED:
            continue
        if node.attempt != result.attempt:
            continue
        ok = result.outcome is StepOutcome.SUCCEEDED
        step = step_of(result.node)
        node = finish_attempt(node, step, ok, result.error, now_ms, result.retryable)
        if ok and step.compensate is not None:
            node = node._replace(done_seq=seq)
        nodes[result.node] = node


def apply_timeouts(
    nodes: dict[str, NodeState],
    step_of: Callable[[str], StepDef],
    started: Mapping[str, Started] | None,
    now_ms: int,
    settled: list[Settled],
) -> list[AttemptRef]:
    """Rule 4 for every node whose due time passed, and the schedule-to-close bound of those
    waiting for their next attempt; the attempts failed that no worker had started (the wait
    steps that continued on their timeout go to ``settled``, with their default output)."""
    unstarted: list[AttemptRef] = []
    for name, node in list(nodes.items()):
        if node.status is _DISPATCHED and node.due_ms is not None and now_ms >= node.due_ms:
            step = step_of(name)
            if step.runs_on_a_worker or (step.maps and name != step.name):
                judged = judge_timeouts(node, step, started, name, now_ms)
                if judged is not None:
                    nodes[name] = judged
                    if judged.status is _FAILED and unstarted_attempt(started, name, node.attempt):
                        unstarted.append((name, node.attempt))
            elif not step.sleeps:  # (a sleep's due time ends it: rule 4b, in _advance)
                nodes[name] = timed_out(name, node, step, now_ms, settled)
        elif node.first_ms is not None and (
            node.status is _RETRY_WAIT or node.status is _LIMIT_WAIT
        ):
            step = step_of(name)  # waiting for its next attempt past its schedule-to-close
            to_close = step.schedule_to_close_ms
            if to_close is not None and now_ms >= node.first_ms + to_close:
                nodes[name] = node_state(
                    _FAILED, node.attempt, None, closed(to_close, node.error), node.attempts_before
                )
    return unstarted


def result_order(result: StepResult) -> tuple[str, int, str, str]:
    return (result.node, result.attempt, result.outcome, result.error or "")
