"""Conditions and skips (core/tick.py, rule 6a): which pending steps of a run that may skip
(a step has a condition: ``WorkflowDef.decides``) never start; and a step's ``when`` and
``run_if`` read at registration (``decides``, for the parser and the authoring API). Pure.

A step is *ready to be judged* once each of its dependencies ended, succeeded or skipped.
Then, in this order:

- its dependencies were all skipped (it has at least one): it is skipped too, unless it says
  ``run_if: all_done``;
- a source it needs was skipped (a map's ``items_from``, a child's ``input_from``, a sleep's
  ``until`` step): its data is absent, so it is skipped;
- it has a condition (``when``): false, it is skipped; true, it starts as any ready step
  does. A condition is decided from what the load found of its selectors (``selected``, by
  their text; a skipped step's output is missing whatever was read). One whose values were
  not read yet (a dependency that ended in this very tick with an output the tick made, or a
  load that did not ask) is *held*: the step stays pending and the tick sets a timer for now,
  so the next load reads them.

A skipped step is terminal: nothing changes it again (a resumed run keeps it skipped, as it
keeps what succeeded). A skip may make more steps ready to be judged, in any order of the
definition, so the judging goes on until nothing more is skipped.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from enum import Enum
from typing import Any

from processor.core.conditions import BadCondition, parse_condition
from processor.core.run_state import NodeState, NodeStatus, node_state
from processor.core.selectors import NOTHING, Selected
from processor.core.workflow_def import RUN_IF_ALL_DONE, StepDef, ValidationError, WorkflowDef

_PENDING, _SUCCEEDED, _SKIPPED = NodeStatus.PENDING, NodeStatus.SUCCEEDED, NodeStatus.SKIPPED


class SkipVerdict(Enum):
    RUN = "run"
    SKIP = "skip"
    HOLD = "hold"


_RUN, _SKIP, _HOLD = SkipVerdict.RUN, SkipVerdict.SKIP, SkipVerdict.HOLD


def ended(node: NodeState) -> bool:
    """Whether a dependency in this state lets the steps after it be judged."""
    return node.status is _SUCCEEDED or node.status is _SKIPPED


def judge(
    nodes: dict[str, NodeState], wf: WorkflowDef, selected: Mapping[str, Selected] | None
) -> tuple[int, frozenset[str]]:
    """Skip every pending step ready to be judged that must not run (in ``nodes``): how many
    were skipped, and the steps held (their condition's values not read yet)."""
    skipped = 0
    while True:
        held: set[str] = set()
        more = 0
        for step in wf.steps:
            node = nodes[step.name]
            if node.status is not _PENDING or not all(ended(nodes[d]) for d in step.depends_on):
                continue
            verdict = verdict_of(step, nodes, selected)
            if verdict is _SKIP:
                nodes[step.name] = node_state(
                    _SKIPPED, node.attempt, None, None, node.attempts_before
                )
                more += 1
            elif verdict is _HOLD:
                held.add(step.name)
        skipped += more
        if not more:
            return skipped, frozenset(held)


def verdict_of(
    step: StepDef, nodes: Mapping[str, NodeState], selected: Mapping[str, Selected] | None
) -> SkipVerdict:
    """What becomes of ``step``, each of its dependencies ended (the rules above)."""
    deps = step.depends_on
    if deps and step.run_if != RUN_IF_ALL_DONE and all(nodes[d].status is _SKIPPED for d in deps):
        return _SKIP
    until = None if step.until is None else step.until.step
    for source in (step.items_from, step.input_from, until):
        if source is not None and nodes[source].status is _SKIPPED:
            return _SKIP
    if step.when is None:
        return _RUN
    found: dict[str, Selected] = {}
    for selector in step.when.selectors:
        if selector.step is not None and nodes[selector.step].status is _SKIPPED:
            found[selector.text] = NOTHING  # a skipped step's output is absent
        elif selected is not None and selector.text in selected:
            found[selector.text] = selected[selector.text]
    holds = step.when.holds(found)
    if holds is None:
        return _HOLD
    return _RUN if holds else _SKIP


def why_skipped(step: StepDef, nodes: Mapping[str, NodeState]) -> str:
    """Why ``step``, skipped, was (what `ductor inspect` and the run's page say): its state
    keeps no reason, but the rules above give it back from its dependencies' states."""
    deps = step.depends_on
    if deps and step.run_if != RUN_IF_ALL_DONE and all(nodes[d].status is _SKIPPED for d in deps):
        return "its dependencies were all skipped"
    until = None if step.until is None else step.until.step
    for source in (step.items_from, step.input_from, until):
        if source is not None and nodes[source].status is _SKIPPED:
            return f"{source!r}, whose output it reads, was skipped"
    return "its condition was false" if step.when is None else f"not ({step.when.text})"


def decides(step: StepDef, when: Any, run_if: Any, where: str) -> StepDef:
    """``step`` with its condition (``when``: text parsed once, here, or None) and its
    ``run_if`` (None, or "all_done"); ValidationError naming the step and the position."""
    condition = None
    if when is not None:
        if not isinstance(when, str):
            raise ValidationError(f"{where}.when: expected a condition (str), got {when!r}")
        try:
            condition = parse_condition(when, f"{where}.when (step {step.name!r})")
        except BadCondition as bad:
            raise ValidationError(str(bad)) from None
        outside = sorted(condition.steps_read - set(step.depends_on))
        if outside:
            raise ValidationError(
                f"{where}.when (step {step.name!r}): reads the output of {outside[0]!r}, which"
                " is not one of the steps it depends on"
            )
    if run_if is not None and run_if != RUN_IF_ALL_DONE:
        raise ValidationError(
            f"{where}.run_if (step {step.name!r}): must be {RUN_IF_ALL_DONE!r} (or absent:"
            f" skipped when its dependencies all were), not {run_if!r}"
        )
    return replace(step, when=condition, run_if=run_if)
