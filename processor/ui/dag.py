"""A run's DAG laid out for its page (pure: no I/O, no web library).

Each step stands in the column of its level: a step without dependencies in the first, any
other one column right of its deepest dependency, so every edge points right. Within a
column the steps keep their order in the definition, and a column shorter than the tallest is
centred, so a fan-out and its join line up. The page draws the boxes and edges as inline SVG.

A step's state is read from the run's nodes as `inspect -o json` gives them: the node of
the step's own name, and for a map step also its items' nodes (``step[0]``, ``step[1]`` ...),
counted by status. What a box is drawn as (``shown``) says what happened, which the node's
status alone does not always: when an item fails for good the run fails and its map node, still
in flight, is cancelled with the rest, but the step failed (its item did); a node cancelled
before its first attempt never ran ("not_run"), which is not one stopped half-way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

BOX_W, BOX_H = 190, 66
GAP_X, GAP_Y = 64, 22
PAD = 12


@dataclass(frozen=True)
class StepState:
    """One step of the run: what it is, what it waits for and where it stands."""

    name: str
    kind: str  # task, wait, workflow, map
    step_type: str
    after: tuple[str, ...]
    status: str  # its node's status; "pending" before the run's state has a node for it
    attempt: int
    error: str | None = None
    child_run: str | None = None
    items: tuple[tuple[str, int], ...] = ()  # a map step's items: (status, how many)
    version: int | None = None  # the version of its function the run pinned (a worker's step)

    @property
    def shown(self) -> str:
        """The state its box is drawn in (a class of the stylesheet): the node's status but
        for a map step with a failed item (failed), and a step cancelled before it ever
        started (not_run)."""
        if any(status == "failed" for status, _ in self.items):
            return "failed"
        if self.status == "cancelled" and self.attempt == 0:
            return "not_run"
        return self.status

    @property
    def label(self) -> str:
        """The state in words, as the box says it."""
        if self.status == "dispatched":
            return _IN_FLIGHT.get(self.kind, "dispatched")
        return self.shown.replace("_", " ")


# What a step in flight is doing, by its kind (a task or a map is dispatched to the workers).
_IN_FLIGHT = {
    "wait": "waiting for its signal",
    "workflow": "child run going",
    "sleep": "asleep until its time",
}


@dataclass(frozen=True)
class Box:
    step: StepState
    x: int
    y: int


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    path: str  # SVG path data: a curve from the source's right side to the target's left


@dataclass(frozen=True)
class Layout:
    width: int
    height: int
    boxes: tuple[Box, ...]
    edges: tuple[Edge, ...]


def levels(steps: Sequence[tuple[str, Sequence[str]]]) -> list[list[str]]:
    """The steps (name, dependencies) by column, each column in definition order.
    ValueError when a dependency is not among the steps or the steps depend on each other in
    a circle (a registered workflow has neither: its definition was checked)."""
    level: dict[str, int] = {}
    waiting = list(steps)
    while waiting:
        ready = [(n, after) for n, after in waiting if all(a in level for a in after)]
        if not ready:
            names = ", ".join(sorted(n for n, _ in waiting))
            raise ValueError(f"steps {names} depend on steps that are missing or on each other")
        for name, after in ready:
            level[name] = 1 + max((level[a] for a in after), default=-1)
        waiting = [(n, after) for n, after in waiting if n not in level]
    columns: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for name, _ in steps:
        columns[level[name]].append(name)
    return columns


def layout(states: Sequence[StepState]) -> Layout:
    """Where each step's box and each dependency's edge go, in SVG user units."""
    by_name = {s.name: s for s in states}
    columns = levels([(s.name, s.after) for s in states])
    tallest = max((len(c) for c in columns), default=0)
    boxes: dict[str, Box] = {}
    for col, names in enumerate(columns):
        offset = (tallest - len(names)) * (BOX_H + GAP_Y) // 2
        for row, name in enumerate(names):
            x = PAD + col * (BOX_W + GAP_X)
            y = PAD + offset + row * (BOX_H + GAP_Y)
            boxes[name] = Box(by_name[name], x, y)
    edges = []
    for state in states:
        for dependency in state.after:
            edges.append(_edge(boxes[dependency], boxes[state.name]))
    width = 2 * PAD + len(columns) * BOX_W + max(len(columns) - 1, 0) * GAP_X
    height = 2 * PAD + tallest * BOX_H + max(tallest - 1, 0) * GAP_Y
    return Layout(width, height, tuple(boxes[s.name] for s in states), tuple(edges))


def _edge(source: Box, target: Box) -> Edge:
    x1, y1 = source.x + BOX_W, source.y + BOX_H // 2
    x2, y2 = target.x, target.y + BOX_H // 2
    middle = (x1 + x2) // 2
    path = f"M{x1},{y1} C{middle},{y1} {middle},{y2} {x2},{y2}"
    return Edge(source.step.name, target.step.name, path)


def step_states(document: Mapping[str, Any]) -> list[StepState]:
    """The run's steps with their state, from the document `inspect -o json` prints
    (io/postgres/run_document.py); none for a run whose row cannot be loaded (it has no steps)."""
    nodes = {n["node"]: n for n in document.get("nodes", [])}
    states = []
    for step in document.get("steps", []):
        name = step["name"]
        node = nodes.get(name, {})
        items: Counter[str] = Counter(
            n["status"] for key, n in nodes.items() if key.startswith(f"{name}[")
        )
        states.append(
            StepState(
                name=name,
                kind=step["kind"],
                step_type=step["type"],
                after=tuple(step["after"]),
                status=node.get("status", "pending"),
                attempt=node.get("attempt", 0),
                error=node.get("error"),
                child_run=node.get("child_run"),
                items=tuple(sorted(items.items())),
                version=step.get("version"),
            )
        )
    return states
