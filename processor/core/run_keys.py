"""One run per key: a workflow's ``concurrency`` (core/limit_defs.py ``RunKeyLimit``) lets at
most ``limit`` of its runs be live (started, not ended) per value of a path in their input;
the others stay pending in line. The counting is core/limits.py's, with the steps' limits:

1. A run's slot is a concurrency slot of the counter ``k/…/VALUE`` held by the run itself (the
   node ``RUN_NODE``, attempt 0, in the holders and waiters' tables). It is taken by the tick
   that starts the run (a pending run whose decision has it running), decided across the
   batch before its steps' limits (``admit``), under the same versioned guard: two processors
   counting from the same version cannot both take the last slot.
2. A start that finds no room is undone as a whole: the run stays pending, its state as it
   was but for its first pending node, which carries the time it looks again by itself
   (``due_ms``, BACKSTOP_MS ahead: ``next_wakeup_at``, so the overdue sweep wakes a run whose
   wakeup was lost), and it joins its counter's line of waiters (``since``: this first
   refusal). Its tick before that time, whatever woke it, changes nothing (a no-op), as a
   step waiting for its limit.
3. Within a key the line is first come, first served (the waiters' ``since``, then run id):
   a waiter is let in when fewer waiters ahead of it are left than there are free slots, and
   a new start waits behind every waiter. Keys never share a line: a key with 500 runs
   waiting holds nobody of another key.
4. The slot is given back by the commit that ends the run, however it ends (succeeded,
   failed, cancelled, past its deadline: the commit's ``ends`` frees every slot of the run),
   which moves the counter's version and names the key among the slots ``released``: the
   shell wakes the oldest waiter. A run force-failed (the watchdog, the livelock guard)
   gives its slot back by that statement (io/postgres/limit_store.py), which counts the
   slots it freed, and the shell wakes their oldest waiters the same way (core/batch.py,
   rule 5; engine/watchdog.py). A quarantined run keeps its slot
   until it is released and ends (its row cannot be trusted to say it ended).
5. A run that starts and ends in one tick, and a pending run that ends (cancelled before it
   started, past its deadline), never hold a slot. A failed run an operator retries
   (``ductor runs retry``) goes back to pending (core/run_ends.py ``resume_failed``): it
   takes its key's slot again as a start does, in line behind the waiters.

Pure: no I/O, no clock; ``now_ms`` is given.
"""

from __future__ import annotations

from collections.abc import Mapping

from processor.core.limit_values import Need
from processor.core.model import LoadedRun
from processor.core.run_state import NodeStatus, RunState, RunStatus, node_state
from processor.core.tick_decision import NOOP, Decision, Dispatch
from processor.core.workflow_def import WorkflowDef

__all__ = [
    "RUN_NODE",
    "START",
    "run_key",
    "run_need",
    "run_paths",
    "starts",
    "still_waiting",
    "unmarked",
    "wait_for_key",
    "waiting_since",
]

# The node a run's own slot and wait carry (no step is named so: a step's name is not empty).
RUN_NODE = ""
# What a run's start is, as a candidate for a slot (core/limits.py lets it in or not).
START = Dispatch(RUN_NODE, 0, "", 0)

_PENDING = NodeStatus.PENDING
_RUN_PENDING = RunStatus.PENDING


def run_need(wf: WorkflowDef, values: Mapping[tuple[str, ...], str]) -> Need | None:
    """The counter a run of ``wf`` needs a slot of to start (its input holding ``values`` at
    the limit's path), None for a workflow without ``concurrency``."""
    limit = wf.concurrency
    if limit is None:
        return None
    value = values.get(limit.key, "") if limit.key else ""
    return Need(limit.key_of(value), limit.name, limit.limit, 0)


def run_key(wf: WorkflowDef, values: Mapping[tuple[str, ...], str]) -> str:
    """The key a run of ``wf`` carries in the lines of waiters it joins (core/limit_line.py):
    what its input holds at its workflow's key, '' without one."""
    limit = wf.concurrency
    return values.get(limit.key, "") if limit is not None and limit.key else ""


def run_paths(wf: WorkflowDef) -> set[tuple[str, ...]]:
    """The input path the shell must read for a run's key (none without one)."""
    limit = wf.concurrency
    return {limit.key} if limit is not None and limit.key else set()


def starts(run: LoadedRun, decision: Decision) -> bool:
    """Whether ``decision`` starts ``run``: pending as loaded, live and no longer pending."""
    new = decision.new_state
    return (
        run.state.status is _RUN_PENDING
        and new is not None
        and new.status is not _RUN_PENDING
        and not new.status.terminal
    )


def _marked(state: RunState) -> str | None:
    """The node whose ``due_ms`` says a pending run waits for its key: its first pending
    node (a pending run's nodes do not change while it waits)."""
    return next((n for n, s in state.nodes if s.status is _PENDING), None)


def still_waiting(run: LoadedRun, now_ms: int) -> bool:
    """Whether ``run`` is pending, waiting for its key, and its time to look again by itself
    has not come (rule 2)."""
    due = _mark(run.state)
    return due is not None and due > now_ms


def waiting_since(run: LoadedRun) -> bool:
    """Whether ``run`` waited for its key before this tick (its mark is set)."""
    return _mark(run.state) is not None


def _mark(state: RunState) -> int | None:
    """A pending run's mark: when it looks for its key's slot again by itself (None: it
    never waited)."""
    if state.status is not _RUN_PENDING or (mark := _marked(state)) is None:
        return None
    return state.node(mark).due_ms


def wait_for_key(run: LoadedRun, now_ms: int, backstop_ms: int) -> Decision:
    """The decision of a run refused its start (rule 2): pending as it was, looking again by
    itself ``backstop_ms`` from now; a no-op while its earlier look is still ahead."""
    if still_waiting(run, now_ms):
        return NOOP
    state = run.state
    mark = _marked(state)
    due = now_ms + backstop_ms
    nodes = tuple(
        (n, node_state(_PENDING, s.attempt, due, s.error, s.attempts_before) if n == mark else s)
        for n, s in state.nodes
    )
    return Decision(
        RunState(_RUN_PENDING, nodes, state.seq + 1, state.reason, state.maps, state.versions)
    )


def unmarked(decision: Decision) -> Decision:
    """``decision`` of a run let in after waiting: no pending node keeps the mark."""
    new = decision.new_state
    if new is None or not any(s.status is _PENDING and s.due_ms is not None for _, s in new.nodes):
        return decision
    nodes = tuple((n, s._replace(due_ms=None) if s.status is _PENDING else s) for n, s in new.nodes)
    return decision._replace(
        new_state=RunState(new.status, nodes, new.seq, new.reason, new.maps, new.versions)
    )
