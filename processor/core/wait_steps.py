"""A wait step's two ends, as the tick (core/tick.py, rules 3 and 4) moves it: the first signal
of its name sent to the run ends it succeeded (the commit records the signal's payload as its
output); its timeout ends the attempt, and when that was its last, fails it, or, with
``on_timeout: continue``, succeeds it with its ``default`` output (null when it has none),
which the commit records (``settled``) before the run goes on. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence

from processor.core.attempts import finish_attempt
from processor.core.run_state import NodeState, NodeStatus, node_state
from processor.core.sleeps import Settled
from processor.core.workflow_def import StepDef, WorkflowDef

_DISPATCHED, _SUCCEEDED = NodeStatus.DISPATCHED, NodeStatus.SUCCEEDED
_FAILED = NodeStatus.FAILED


def signal_waits(
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
            nodes[step.name] = node_state(
                _SUCCEEDED, node.attempt, None, None, node.attempts_before
            )
            ended.append((step.name, node.attempt, first))
    return ended


def timed_out(
    name: str, node: NodeState, step: StepDef, now_ms: int, settled: list[Settled]
) -> NodeState:
    """``node`` of a wait or workflow step whose attempt's due time passed: retried by its
    policy, failed, or (a wait step that continues on its timeout, its last attempt)
    succeeded with its default output, added to ``settled``."""
    error = f"attempt {node.attempt} timed out after {step.timeout_ms} ms"
    ended = finish_attempt(node, step, False, error, now_ms)
    if ended.status is _FAILED and step.continues_on_timeout:
        settled.append((name, node.attempt, step.default_output or "null"))
        return node_state(_SUCCEEDED, node.attempt, None, None, node.attempts_before)
    return ended
