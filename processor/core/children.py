"""Child workflows: the runs a step of kind ``workflow`` starts, and how their ends come back.
Pure: what a transition starts and cancels, read from the states before and after it.

Rules:

1. A workflow step's attempt starts one child run, whose id derives from the parent, the
   step and the attempt (``order-1/ship#1``): the commit that dispatches the attempt writes
   the child's row and its start wakeup in the same statement, so a child exists exactly when
   its parent's attempt does, however often the tick is recomputed.
2. The child's end is the step's result: the commit that ends the child writes it for the
   parent's attempt (succeeded with the child's output, or failed with its status and reason)
   and wakes the parent; the parent's tick applies it like any step result (once).
3. An attempt that ends without its child's result (it timed out, the parent was cancelled or
   failed) cancels its child: the commit records a cancel signal for it and wakes it.
4. A run force-failed (the livelock guard, the stuck sweep: core/decide.py
   ``force_fail_write``) is a transition like any other for its children and its parent: the
   write that fails it cancels its children in flight (rule 3) and, for a child, records its
   end as the parent's step result (rule 2); the wakeups of both go to the outbox in that same
   statement, so the parent applies its child's end at once, and a parent retried later
   (``ductor runs retry``) never has two children of one step running.
"""

from __future__ import annotations

import hashlib
from typing import NamedTuple

from processor.core.envelope import MAX_RUN_ID_LENGTH
from processor.core.run_state import NodeState, NodeStatus, RunState
from processor.core.workflow_def import WorkflowDef

_DISPATCHED, _SUCCEEDED = NodeStatus.DISPATCHED, NodeStatus.SUCCEEDED


class ChildStart(NamedTuple):
    """A child run to create: its id, the parent's step and attempt, its workflow (and
    version, None: the latest), and where its input comes from (``input_from`` and that
    dependency's attempt; None: the parent's input)."""

    run_id: str
    node: str
    attempt: int
    workflow: str
    version: int | None
    input_from: str | None
    input_attempt: int | None


def child_run_id(parent: str, node: str, attempt: int) -> str:
    """The id of the child run of ``parent``'s step ``node``, attempt ``attempt`` (rule 1);
    shortened with a hash when it would exceed the bound of a run id."""
    run_id = f"{parent}/{node}#{attempt}"
    if len(run_id) <= MAX_RUN_ID_LENGTH:
        return run_id
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:16]
    return f"{run_id[: MAX_RUN_ID_LENGTH - 18]}~{digest}"


def children_started(
    run_id: str, wf: WorkflowDef, old: RunState, new: RunState
) -> list[ChildStart]:
    """The child runs the transition from ``old`` to ``new`` starts (rule 1)."""
    started: list[ChildStart] = []
    before = old.node_map()
    after = new.node_map()
    for step in wf.steps:
        if not step.starts_child:
            continue
        node = after[step.name]
        if node.status is not _DISPATCHED or _in_flight(before[step.name], node.attempt):
            continue
        assert step.child_workflow is not None
        input_attempt = None if step.input_from is None else after[step.input_from].attempt
        started.append(
            ChildStart(
                child_run_id(run_id, step.name, node.attempt),
                step.name,
                node.attempt,
                step.child_workflow,
                step.child_version,
                step.input_from,
                input_attempt,
            )
        )
    return started


def children_to_cancel(run_id: str, wf: WorkflowDef, old: RunState, new: RunState) -> list[str]:
    """The child runs whose parent attempt the transition ends without their result (rule 3):
    timed out and retried or failed, or the parent ended."""
    cancelled: list[str] = []
    after = new.node_map()
    for step in wf.steps:
        if not step.starts_child:
            continue
        node = old.node(step.name)
        if node.status is not _DISPATCHED:
            continue
        now = after[step.name]
        if now.status is _SUCCEEDED or _in_flight(now, node.attempt):
            continue
        cancelled.append(child_run_id(run_id, step.name, node.attempt))
    return cancelled


def _in_flight(node: NodeState, attempt: int) -> bool:
    return node.status is _DISPATCHED and node.attempt == attempt


__all__ = [
    "ChildStart",
    "child_run_id",
    "children_started",
    "children_to_cancel",
]
