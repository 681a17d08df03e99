"""A decision with the dispatches its limits refused undone (core/limits.py, rule 1): each
such node waits for its limit, at the attempt it had. Pure."""

from __future__ import annotations

from collections.abc import Mapping

from processor.core.model import LoadedRun
from processor.core.run_state import NodeStatus, RunState, node_state
from processor.core.tick_decision import Decision

__all__ = ["undo"]

_LIMIT_WAIT = NodeStatus.LIMIT_WAIT


def undo(
    run: LoadedRun,
    decision: Decision,
    refused: Mapping[str, int | None],
    now_ms: int,
    backstop_ms: int,
) -> Decision:
    """The decision without the dispatches ``refused`` (node -> a rate limit's due, or None):
    each such node waits for its limit, at the attempt it had, looking again by itself
    ``backstop_ms`` from now (a rate limit's waiter at its due); a no-op if nothing is left."""
    if not refused or decision.new_state is None:
        return decision
    old = run.state.node_map()
    nodes = decision.new_state.node_map()
    timers = list(decision.timers)
    for name, rate_due in refused.items():
        before = old.get(name, node_state())
        if before.status is _LIMIT_WAIT and before.due_ms is not None and before.due_ms > now_ms:
            nodes[name] = before  # still waiting, and it will look again by itself
            continue
        due = rate_due if rate_due is not None else now_ms + backstop_ms
        step = run.wf.step_for(name)
        if step.schedule_to_close_ms is not None and before.first_ms is not None:
            # (its wait counts towards its schedule-to-close bound: it fails by then)
            due = min(due, before.first_ms + step.schedule_to_close_ms)
        nodes[name] = node_state(
            _LIMIT_WAIT,
            before.attempt,
            due,
            before.error,
            before.attempts_before,
            None,
            before.first_ms,  # a retry's schedule-to-close bound counts its wait too
        )
        if rate_due is not None:
            timers.append(rate_due)
    dispatches = tuple(d for d in decision.dispatches if d.node not in refused)
    state = decision.new_state
    # The nodes in the state's order (a map's new items included).
    new_state = RunState(
        state.status,
        tuple((n, nodes[n]) for n, _ in state.nodes),
        state.seq,
        state.reason,
        state.maps,
        state.versions,
    )
    old_state = run.state
    unchanged = (
        new_state.status is old_state.status
        and new_state.nodes == old_state.nodes
        and new_state.maps == old_state.maps
    )
    ended = decision.signalled or decision.mapped or decision.items_done or decision.settled
    if unchanged and not ended:
        return Decision(None)
    return decision._replace(
        new_state=new_state, dispatches=dispatches, timers=tuple(sorted(set(timers)))
    )
