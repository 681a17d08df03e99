"""What starts in a tick (core/tick.py, rule 6): the steps that became ready, dispatched to
the workers or begun without one (a wait, a child run, a map's items, a sleep), and what follows
a step that ended as soon as it began (a wait whose signal came first, a map of no items, a
sleep whose time had passed), started in the same tick. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import NamedTuple

from processor.core.attempts import dispatched
from processor.core.map_steps import Maps, dispatch_items, end_maps, expand
from processor.core.run_state import NodeState, NodeStatus
from processor.core.selectors import Selected
from processor.core.skips import ended, judge
from processor.core.sleeps import Settled, start_sleep, wake_sleeps
from processor.core.tick_decision import Dispatch
from processor.core.wait_steps import signal_waits
from processor.core.workflow_def import StepDef, WorkflowDef

# As module globals: reading `NodeStatus.DISPATCHED` goes through the enum's metaclass.
_PENDING, _DISPATCHED = NodeStatus.PENDING, NodeStatus.DISPATCHED
_RETRY_WAIT, _LIMIT_WAIT = NodeStatus.RETRY_WAIT, NodeStatus.LIMIT_WAIT
_SUCCEEDED = NodeStatus.SUCCEEDED


class EndedByTick(NamedTuple):
    """What a tick ended that its commit records (lists it adds to)."""

    signalled: list[tuple[str, int, str]]
    mapped: list[tuple[str, int, int]]
    settled: list[Settled]


def cascade(
    nodes: dict[str, NodeState],
    wf: WorkflowDef,
    now_ms: int,
    maps: Maps | None,
    named: Sequence[tuple[str, str]],
    selected: Mapping[str, Selected] | None,
    ended: EndedByTick,
) -> tuple[list[Dispatch], int, bool]:
    """A step just started may end at once (a wait whose signal came first, a map of no
    items, a sleep whose time had passed), and what follows it starts now: until nothing
    more ends, what was dispatched, how many began that no worker runs, and whether a sleep
    could not start yet."""
    dispatches: list[Dispatch] = []
    waiting, deferred = 0, False
    while True:
        signalled = signal_waits(nodes, wf, named)
        mapped = end_maps(nodes, wf, maps) if maps is not None else []
        woke = wake_sleeps(nodes, wf, now_ms) if wf.sleeps else []
        if not (signalled or mapped or woke):
            return dispatches, waiting, deferred
        ended.signalled.extend(signalled)
        ended.mapped.extend(mapped)
        ended.settled.extend(woke)
        more, began, later = dispatch_ready(nodes, wf, now_ms, maps, selected)
        dispatches += more
        waiting += began
        deferred = deferred or later
        if not began:
            return dispatches, waiting, deferred


def dispatch_ready(
    nodes: dict[str, NodeState],
    wf: WorkflowDef,
    now_ms: int,
    maps: Maps | None = None,
    selected: Mapping[str, Selected] | None = None,
) -> tuple[list[Dispatch], int, bool]:
    """Start what is ready: the step attempts to send to the workers, how many steps began
    that no worker runs (a wait step, which a signal ends; a workflow step, whose child run
    the commit starts; a map step, whose items are dispatched; a sleep step) or were skipped
    (rule 6a, core/skips.py), and whether a step ready could not start yet (a sleep's
    ``until`` value not recorded, a condition's values not read: rule 6)."""
    dispatches = []
    waiting = 0
    deferred = False
    held: frozenset[str] = frozenset()
    decides = wf.decides
    if decides:
        waiting, held = judge(nodes, wf, selected)
        deferred = bool(held)
    for step in wf.steps:  # definition order keeps the decision deterministic
        node = nodes[step.name]
        retry_due = node.status is _RETRY_WAIT and node.due_ms is not None and now_ms >= node.due_ms
        first_run = node.status is _PENDING and (
            all(nodes[d].status is _SUCCEEDED for d in step.depends_on)
            if not decides
            else _ready(nodes, step, held)
        )
        if step.maps:
            assert maps is not None
            if first_run:
                waiting += expand(nodes, step, maps)
            if nodes[step.name].status is _DISPATCHED:
                dispatches += dispatch_items(nodes, step, now_ms, maps)
            continue
        if step.sleeps:
            if first_run:
                began = _start_sleep(nodes, step, now_ms, selected)
                waiting += max(began, 0)
                deferred = deferred or began < 0
            continue
        if retry_due or first_run or node.status is _LIMIT_WAIT:
            attempt = node.attempt + 1
            deadline = now_ms + step.timeout_ms
            nodes[step.name] = dispatched(node, step, attempt, now_ms)
            if step.runs_on_a_worker:
                dispatches.append(Dispatch(step.name, attempt, step.step_type, deadline))
            else:
                waiting += 1
    return dispatches, waiting, deferred


def _start_sleep(
    nodes: dict[str, NodeState],
    step: StepDef,
    now_ms: int,
    selected: Mapping[str, Selected] | None,
) -> int:
    """Start sleep step ``step`` (core/sleeps.py): 1 when it began, 0 when it failed (its
    ``until`` is no time), -1 when it cannot start yet (its ``until`` value not recorded)."""
    slept = start_sleep(nodes[step.name], step, now_ms, selected)
    if slept is None:
        return -1
    nodes[step.name] = slept
    return 1 if slept.status is _DISPATCHED else 0


def _ready(nodes: dict[str, NodeState], step: StepDef, held: frozenset[str]) -> bool:
    """Whether pending ``step`` of a workflow that may skip starts now: its dependencies all
    ended (a skipped one too), and it is not held (core/skips.py)."""
    return step.name not in held and all(ended(nodes[d]) for d in step.depends_on)
