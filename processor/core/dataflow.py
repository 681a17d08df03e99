"""Data between steps and a run's declared output: what a dispatch carries, and where a
succeeded run's output comes from. Pure: the tick's commit rows and step tasks are built from
these (decide.py), and the store writes them.

- A step reads the run's input and the outputs of its dependencies. Its task always names the
  dependencies' attempts that succeeded (the node states say which: a late result of an
  earlier, timed-out attempt may be stored too, but only the applied one counts). The data
  itself travels inline only when the coordinator has it at hand without any extra read: the
  run's input, loaded with a pending run (its first tick), for a step with no dependencies.
  Everything else is fetched by the worker (step_task.py has the format and the size bound).
- A succeeded run's output is what its workflow declares: one step's output, or a mapping of
  names to steps' outputs. A skipped step has no output (core/skips.py): absent from what a
  later step reads and from the mapping, never null. The commit that ends the run succeeded
  names the step results it comes from (step, applied attempt); the same statement reads
  them and writes the output, so a run is never succeeded without it. Other commits name
  nothing and cost nothing more.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from processor.core.model import LoadedRun
from processor.core.run_state import NodeState, NodeStatus, RunState, RunStatus
from processor.core.step_task import DepAttempts, StepData
from processor.core.workflow_def import StepDef, WorkflowDef

_RUN_SUCCEEDED = RunStatus.SUCCEEDED
_SKIPPED = NodeStatus.SKIPPED


def dependency_attempts(step: StepDef, nodes: Mapping[str, NodeState]) -> DepAttempts:
    """Each dependency of ``step`` with its attempt that succeeded (``nodes``: the state the
    step is dispatched from, where every dependency ended); one skipped has no output, so it
    is absent (not null) from what the step reads."""
    return tuple((dep, nodes[dep].attempt) for dep in step.depends_on if _has_output(nodes[dep]))


def _has_output(node: NodeState) -> bool:
    return node.status is not _SKIPPED


def data_at_hand(run: LoadedRun, step: StepDef) -> StepData | None:
    """The step's data, if the loaded run holds all of it: the input was loaded and the step
    reads no dependency's output (outputs are never loaded by the coordinator)."""
    if run.input is None or step.depends_on:
        return None
    return StepData(run.input.value)


class OutputRefs(NamedTuple):
    """Where a succeeded run's output comes from: ``(name, step, attempt)`` for each step
    output it holds; ``single``: the output is that one step's output itself."""

    single: bool
    refs: tuple[tuple[str, str, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "single": self.single,
            "refs": [{"key": k, "node": n, "attempt": a} for k, n, a in self.refs],
        }


def output_refs(wf: WorkflowDef, state: RunState) -> OutputRefs | None:
    """The step results a run's output is made of, when ``state`` ends it succeeded and its
    workflow declares an output; None otherwise (nothing to write). A step skipped has no
    output: absent from the mapping, and a run whose one output step was skipped has none."""
    declared = wf.output
    if declared is None or state.status is not _RUN_SUCCEEDED:
        return None
    nodes = state.node_map()
    if declared.step is not None:
        node = nodes[declared.step]
        return OutputRefs(True, (("", declared.step, node.attempt),) if _has_output(node) else ())
    return OutputRefs(
        False, tuple((k, s, nodes[s].attempt) for k, s in declared.fields if _has_output(nodes[s]))
    )
