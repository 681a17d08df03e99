"""A run's map steps as the tick (core/tick.py, rule 6) advances them: how many items a map
has, which to start (at most ``parallelism`` in flight), and which leave the state
succeeded. An item is a node of the state while it runs (``step[i]``). Pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from processor.core.attempts import dispatched
from processor.core.model import StepOutcome, StepResult
from processor.core.run_state import (
    MapProgress,
    NodeState,
    NodeStatus,
    RunState,
    items_in,
    node_state,
)
from processor.core.tick_decision import Dispatch
from processor.core.workflow_def import StepDef, WorkflowDef, item_node

_PENDING, _DISPATCHED = NodeStatus.PENDING, NodeStatus.DISPATCHED
_RETRY_WAIT, _LIMIT_WAIT = NodeStatus.RETRY_WAIT, NodeStatus.LIMIT_WAIT
_SUCCEEDED, _FAILED = NodeStatus.SUCCEEDED, NodeStatus.FAILED
# A map in flight always has its progress; a row edited by hand without it ends its map as one
# of no more items rather than raise.
_NO_ITEMS = MapProgress(0)
_NEVER = node_state()  # a node never dispatched (a map's item before it starts)


class Maps:
    """A tick's map steps: where their items come from (the lengths of the lists at hand),
    how far each got, and the items it took out of the state, succeeded."""

    def __init__(
        self, state: RunState, results: Iterable[StepResult], input_length: int | None
    ) -> None:
        self.input_length = input_length
        self._lengths = {
            (r.node, r.attempt): r.length for r in results if r.outcome is StepOutcome.SUCCEEDED
        }
        self.progress: dict[str, MapProgress] = dict(state.maps)
        self.done: list[tuple[str, int, int]] = []

    def items(self, step: StepDef, nodes: Mapping[str, NodeState]) -> int | str:
        """How many items ``step`` has, or why it has none it can run."""
        if step.items_from is None:
            length, source = self.input_length, "the run's input"
        else:
            dep = nodes[step.items_from]
            length = self._lengths.get((step.items_from, dep.attempt))
            source = f"the output of {step.items_from!r}"
        if length is None:
            return f"{source} is not a list"
        if length > step.max_items:
            return f"{source} has {length} items, more than max_items ({step.max_items})"
        return length

    def progress_of(self, wf: WorkflowDef) -> tuple[tuple[str, MapProgress], ...]:
        """Each started map step's progress, in definition order."""
        return tuple((s.name, self.progress[s.name]) for s in wf.steps if s.name in self.progress)


def _window(nodes: Mapping[str, NodeState], step: str) -> list[tuple[int, str]]:
    """The items of map step ``step`` in the state, (index, node), by index."""
    return items_in(n for n in nodes if n.startswith(step) and n.endswith("]")).get(step, [])


def end_maps(
    nodes: dict[str, NodeState], wf: WorkflowDef, maps: Maps
) -> list[tuple[str, int, int]]:
    """Take the items that succeeded out of each map step in flight (``maps.done``), and end
    each one whose items all did: (node, attempt, how many items)."""
    ended = []
    for step in wf.steps:
        node = nodes[step.name]
        if not step.maps or node.status is not _DISPATCHED:
            continue
        left = 0
        for index, item in _window(nodes, step.name):
            if nodes[item].status is _SUCCEEDED:
                maps.done.append((step.name, index, nodes[item].attempt))
                del nodes[item]
            else:
                left += 1
        progress = maps.progress.get(step.name, _NO_ITEMS)
        if not left and progress.started == progress.items:
            nodes[step.name] = node_state(
                _SUCCEEDED, node.attempt, None, None, node.attempts_before
            )
            ended.append((step.name, node.attempt, progress.items))
    return ended


def expand(nodes: dict[str, NodeState], step: StepDef, maps: Maps) -> int:
    """A map step becomes ready: in flight with its count of items (the items it started
    before a resume go on where they were), or failed (no list, too many items); 1 once it
    started."""
    node = nodes[step.name]
    if step.name not in maps.progress:
        count = maps.items(step, nodes)
        if isinstance(count, str):
            failed = node_state(_FAILED, node.attempt + 1, None, count, node.attempts_before)
            nodes[step.name] = failed
            return 0
        maps.progress[step.name] = MapProgress(count)
    nodes[step.name] = node_state(_DISPATCHED, node.attempt + 1, None, None, node.attempts_before)
    return 1


def dispatch_items(
    nodes: dict[str, NodeState], step: StepDef, now_ms: int, maps: Maps
) -> list[Dispatch]:
    """The items to start now: those in the state due again (a retry, a limit, pending again
    after a resume), then the next ones by index, with at most ``parallelism`` in flight
    (dispatched or waiting for a retry or a limit)."""
    window = _window(nodes, step.name)
    busy = (_DISPATCHED, _RETRY_WAIT, _LIMIT_WAIT)
    in_flight = sum(1 for _, item in window if nodes[item].status in busy)
    dispatches = []
    for _, item in window:
        node = nodes[item]
        due = node.status is _LIMIT_WAIT or (
            node.status is _RETRY_WAIT and node.due_ms is not None and now_ms >= node.due_ms
        )
        fresh = node.status is _PENDING and in_flight < step.parallelism
        if not (due or fresh):
            continue
        in_flight += fresh
        attempt = node.attempt + 1
        nodes[item] = dispatched(node, step, attempt, now_ms)
        dispatches.append(Dispatch(item, attempt, step.step_type, now_ms + step.timeout_ms))
    progress = maps.progress.get(step.name, _NO_ITEMS)
    started = progress.started
    while started < progress.items and in_flight < step.parallelism:
        item = item_node(step.name, started)
        nodes[item] = dispatched(_NEVER, step, 1, now_ms)
        dispatches.append(Dispatch(item, 1, step.step_type, now_ms + step.timeout_ms))
        started += 1
        in_flight += 1
    if started != progress.started:
        maps.progress[step.name] = MapProgress(progress.items, started)
    return dispatches
