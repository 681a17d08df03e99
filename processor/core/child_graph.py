"""Which runs a workflow's runs start, across the registered definitions: a registration that
would close a cycle of child workflows (A starts B, B starts A; or a longer one) is refused.
Every step of a run runs (a definition has no conditions), so the runs of a cycle would start
one another without end. Pure: the shell reads the definitions and writes the registration.

Rules:

1. The graph's nodes are registered versions, ``(name, version)``. A workflow step of
   ``(A, a)`` naming ``B`` at version ``b`` leads to ``(B, b)``; one naming ``B`` without a
   version leads to B's latest version, since its child starts at the version that is latest
   when it starts (io/postgres/store.py). Every registered version counts, an old one too: its runs
   may still be live and start children.
2. A new version ``(N, n)`` changes no other version's steps; it changes only where steps
   naming ``N`` without a version lead, once it is N's latest. So a cycle it closes passes
   through it, and it is enough to look from it: ``child_cycle`` looks for any cycle reachable
   from it (one that does not pass through it, left from before this rule, is refused too:
   the new workflow's runs would reach it).
3. A step naming a version that is not registered leads nowhere (registration refuses it
   beforehand: a child workflow is registered before its parent).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

from processor.core.shapes import WorkflowKey
from processor.core.workflow_def import WorkflowDef

# A workflow step's child: its workflow's name, and its version (None: the latest).
ChildRef = tuple[str, int | None]


class ChildCycle(ValueError):
    """A definition whose registration would close a cycle of child workflows."""

    def __init__(self, key: WorkflowKey, cycle: Sequence[WorkflowKey]) -> None:
        super().__init__(
            f"workflow {key[0]!r} version {key[1]} would close a cycle of child workflows:"
            f" {describe_cycle(cycle)} (each run would start the next without end);"
            " pin the child's version or remove the step"
        )
        self.cycle = tuple(cycle)


def child_refs(wf: WorkflowDef) -> tuple[ChildRef, ...]:
    """The children a definition's steps start, in step order."""
    return tuple(
        (step.child_workflow, step.child_version)
        for step in wf.steps
        if step.starts_child and step.child_workflow is not None
    )


def child_cycle(
    start: WorkflowKey, graph: Mapping[WorkflowKey, Sequence[ChildRef]]
) -> list[WorkflowKey] | None:
    """A cycle reachable from ``start`` in ``graph`` (every registered version with the
    children its steps start, ``start`` among them), as the versions along it, the first one
    repeated at the end; None when there is none (rules 1 to 3)."""
    latest: dict[str, int] = {}
    for name, version in graph:
        latest[name] = max(version, latest.get(name, version))

    def targets(key: WorkflowKey) -> Iterator[WorkflowKey]:
        for name, version in graph.get(key, ()):
            resolved = latest.get(name) if version is None else version
            if resolved is not None and (name, resolved) in graph:
                yield (name, resolved)

    # Depth first, without recursion (a chain of definitions may be long): ``path`` is the
    # current chain from ``start``, ``done`` the versions whose every successor was explored.
    path: list[WorkflowKey] = [start]
    on_path = {start}
    done: set[WorkflowKey] = set()
    pending: list[Iterator[WorkflowKey]] = [targets(start)]
    while pending:
        following = next(pending[-1], None)
        if following is None:
            done.add(path[-1])
            on_path.discard(path.pop())
            pending.pop()
            continue
        if following in on_path:
            return [*path[path.index(following) :], following]
        if following in done:
            continue
        path.append(following)
        on_path.add(following)
        pending.append(targets(following))
    return None


def describe_cycle(cycle: Sequence[WorkflowKey]) -> str:
    """``order v2 -> shipping v1 -> order v2``."""
    return " -> ".join(f"{name} v{version}" for name, version in cycle)


__all__ = [
    "ChildCycle",
    "ChildRef",
    "child_cycle",
    "child_refs",
    "describe_cycle",
]
