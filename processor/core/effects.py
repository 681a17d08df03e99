"""The records a decision produces, built from the loaded run and the tick's decision
(core/decide.py calls these): the step tasks a transition dispatches, its timers on the delay
ladder, the wakeups of the child runs it starts or cancels and of a child's parent, the
wakeups sent on along the ladder, and dead letters. Pure, like the rest of the core.
"""

from __future__ import annotations

from processor.core.children import ChildStart
from processor.core.dataflow import data_at_hand, dependency_attempts
from processor.core.dead_letters import dead_letter_headers, truncate_dead_letter
from processor.core.envelope import Wakeup
from processor.core.model import LoadedRun
from processor.core.outcomes import DeadLetterReason
from processor.core.plans import Attributes, Send
from processor.core.records import Inbound
from processor.core.routing import TopicNames, rung_for_delay
from processor.core.run_state import NodeState
from processor.core.step_task import MapItem, encode_task
from processor.core.tick_decision import Decision
from processor.core.versions import Pins, pin_of
from processor.core.workflow_def import StepDef, WorkflowDef


def transition_sends(
    run: LoadedRun, decision: Decision, now_ms: int, names: TopicNames
) -> tuple[Send, ...]:
    sends = []
    if decision.dispatches:
        assert decision.new_state is not None
        step_of = run.wf.step_for if run.wf.has_maps else run.wf.step_map.__getitem__
        nodes: dict[str, NodeState] | None = None  # built only for a step with dependencies
        key = run.run_id.encode()
        for d in decision.dispatches:
            step = step_of(d.node)
            if step.depends_on:
                nodes = nodes or decision.new_state.node_map()
                deps = dependency_attempts(step, nodes)
            else:
                deps = ()
            data = data_at_hand(run, step)
            start_by = close_by = None
            if step.schedule_to_start_ms is not None or step.schedule_to_close_ms is not None:
                nodes = nodes or decision.new_state.node_map()
                start_by, close_by = _bounds_of(step, nodes[d.node])
            # Encoded straight from the dispatch: no StepTask object per dispatch.
            task = encode_task(
                run.run_id,
                d.node,
                d.attempt,
                d.step_type,
                d.deadline_ms,
                run.tier,
                deps,
                data,
                step.heartbeat_timeout_ms,
                _item_of(step, d.node),
                step.timeout_ms,
                start_by,
                close_by,
                _version_of(step, decision.new_state.versions, run.wf),
            )
            attributes = (("ductor.node", d.node), ("ductor.attempt", d.attempt))
            topic = names.steps_for(step.queue, run.tier)
            sends.append(Send(topic, key=key, value=task, attributes=attributes))
    if decision.timers:
        sends += [timer(run.run_id, due, now_ms, "timer", names) for due in decision.timers]
    return tuple(sends)


def _version_of(step: StepDef, pins: Pins, wf: WorkflowDef) -> int:
    """The version of its function a dispatch runs: its step's pin (core/versions.py), or,
    for a compensation or a failure handler (core/sagas.py: never pinned), its own, else 1."""
    if wf.compensates and step in wf.saga_steps:
        return step.version or 1
    return pin_of(pins, step.name) if pins else 1


def _bounds_of(step: StepDef, node: NodeState) -> tuple[int | None, int | None]:
    """A dispatched attempt's schedule-to-start and schedule-to-close bounds as its task
    carries them (epoch ms): by when a worker may take it, and by when it must end."""
    close_by = None
    if step.schedule_to_close_ms is not None and node.first_ms is not None:
        close_by = node.first_ms + step.schedule_to_close_ms
    start_by = close_by
    if step.schedule_to_start_ms is not None and node.since_ms is not None:
        start_by = node.since_ms + step.schedule_to_start_ms
        if close_by is not None:
            start_by = min(start_by, close_by)
    return start_by, close_by


def _item_of(step: StepDef, node: str) -> MapItem | None:
    """Which item a dispatch of a map step is (None: not a map's)."""
    if not step.maps:
        return None
    return MapItem(step.items_from, int(node[node.rindex("[") + 1 : -1]))


def child_wakeups(
    run: LoadedRun,
    started: list[ChildStart],
    cancelled: list[str],
    now_ms: int,
    names: TopicNames,
) -> tuple[Send, ...]:
    """The start wakeups of the child runs a transition starts, and the wakeups of those it
    cancels, on the parent's tier (a child runs on its parent's)."""
    topic = names.wakeup(run.tier)
    wakeups = [Wakeup(c.run_id, reason="start", produced_at=now_ms) for c in started]
    wakeups += [Wakeup(c, reason="signal", produced_at=now_ms) for c in cancelled]
    return tuple(wakeup_send(topic, w) for w in wakeups)


def parent_wakeup(run: LoadedRun, now_ms: int, names: TopicNames) -> tuple[Send, ...]:
    """The wakeup of a child's parent once the child ended (its end is the parent's step
    result), on the child's tier (its parent's)."""
    assert run.parent is not None
    parent = Wakeup(run.parent.run_id, reason="step_result", produced_at=now_ms)
    return (wakeup_send(names.wakeup(run.tier), parent),)


def timer(run_id: str, due_ms: int, now_ms: int, reason: str, names: TopicNames) -> Send:
    """A wakeup at ``due_ms`` on the delay ladder: on the largest rung that fits the wait, and
    hopping on (``target_at``) when the wait is longer than the top rung."""
    wait = max(0, due_ms - now_ms)
    rung = rung_for_delay(wait)
    hop_due = now_ms + min(wait, rung)
    wakeup = Wakeup(
        run_id=run_id,
        reason=reason,
        due_at=hop_due,
        target_at=due_ms if due_ms > hop_due else None,
        produced_at=now_ms,
    )
    return wakeup_send(names.delay(rung), wakeup)


def wakeup_send(topic: str, wakeup: Wakeup) -> Send:
    key = wakeup.key()
    attributes: Attributes = (
        ("ductor.requeue_count", wakeup.requeue_count),
        ("ductor.requeue_seq", wakeup.requeue_seq),
        ("ductor.attempt", wakeup.requeue_seq),  # deprecated here: ductor.requeue_seq
        ("messaging.kafka.message.key", key.decode()),
    )
    return Send(topic, key, wakeup.encode(), by_run=wakeup.run_id, attributes=attributes)


def dead_letter_sends(
    records: tuple[Inbound, ...], reason: DeadLetterReason, detail: str, dlq: str, max_bytes: int
) -> tuple[Send, ...]:
    """Every record to the dead-letter topic ``dlq`` with its original key, value (a tombstone
    stays a tombstone) and headers, plus the reason and where it came from; one too large for
    the dead-letter topic goes truncated (``truncate_dead_letter``)."""
    sends = []
    for r in records:
        headers = dead_letter_headers(r.headers, reason, detail, r.tp[0], r.tp[1], r.offset)
        value, headers = truncate_dead_letter(r.key, r.value, headers, max_bytes)
        attributes: Attributes = (("ductor.reason", reason.value),)
        sends.append(Send(dlq, r.key, value, headers=tuple(headers), attributes=attributes))
    return tuple(sends)


__all__ = [
    "child_wakeups",
    "dead_letter_sends",
    "parent_wakeup",
    "timer",
    "transition_sends",
    "wakeup_send",
]
