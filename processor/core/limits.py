"""Concurrency and rate limits at dispatch, decided across a batch's runs (pure).

A step may bound its dispatches (core/limit_defs.py). Each bound is a counter in Postgres,
named by a key: ``c/NAME/VALUE`` for a concurrency limit (VALUE: what the run's input holds at
the limit's path), ``r/NAME`` for a rate limit. A counter row carries a version; a concurrency
counter's holders are rows of their own (the attempts in flight that hold it), a rate
counter's dispatches too (numbered, the last ``limit`` of them kept). Nothing holds a lock or a
lease across ticks:

1. The tick dispatches as if there were no limit (core/tick.py, rule 6). ``admit`` then
   decides, for each dispatch of a limited step in the batch, whether it holds: every one of
   its counters must have room for it. A dispatch that does not is undone: the node waits for
   its limit (``limit_wait``), and joins the counter's queue of waiters. A workflow's runs
   per key are counted alike, a run's start taking a slot before its steps' dispatches are
   decided (core/run_keys.py).
2. Room is given in the line's order: a waiter is let in only when fewer waiters ahead of it
   are still waiting than there are free slots, and a new dispatch waits behind every
   waiter, so no run starves while others keep arriving. The line is first come, first
   served within a run key, round-robin across them (core/limit_line.py). A run whose own
   attempt succeeds in this very tick may use its slot again at once (its next step under
   the same limit); a slot freed otherwise (a failure, a timeout, a cancel) goes through the
   counter, as its execution may go on (rule 4).
3. The commit that takes a slot (or adds a waiter) names each counter with the version it was
   loaded at (a ``Guard``); the statement moves that version, and writes the run only if
   every guard of the run held: two instances counting from the same version cannot both
   take the last slot, whatever the batch; the loser is a conflict, retried from fresh state.
4. A slot is held by an execution, not an attempt: it is freed by the commit that ends its
   attempt (a result, a timeout, a cancel, the run's end) only if the attempt's execution is
   over by then, as its worker reported it (io/postgres/step_attempts.py), or never began. One that
   still runs (a step in a thread cannot be stopped: a timeout, a heartbeat timeout or a
   cancel ends its attempt, not its code) keeps the slot, lingering, until its worker reports
   its end or is gone (io/postgres/instances.py), when the watchdog frees it
   (io/postgres/limit_store.py). A commit or a sweep that frees a slot moves the counter's version
   too (so a waiter added from a count read before the slot was freed is a conflict, not a wait
   nobody ends); the shell then wakes the oldest waiters, one per freed slot. Should that wakeup be
   lost (the process died between), the waiter's own ``due_ms`` (BACKSTOP_MS ahead) has the overdue
   sweep wake it: never a loop that polls. A rate-limited waiter is due when its window has
   room again, with a timer.
5. A rate limit of ``limit`` per window has room for its next dispatch when the dispatch
   ``limit`` before it is out of the window (or never was): the times of the dispatches before
   them, oldest first, bound the next admissions one by one. The shell loads only those
   bounds (RATE_LOOKAHEAD of them at most) and the commit writes one row per dispatch, so
   admitting costs the same at the largest limit and the longest window as at the smallest;
   a batch lets in at most RATE_LOOKAHEAD dispatches of one rate limit, the rest waiting.
   This holds only while a counter's times rise with its numbers. A batch loaded at one
   time may read the counters after another instance counted a later dispatch, so the
   batch is judged at the time the counters were read (``LimitInputs.now_ms``), which is no
   earlier than any dispatch they hold. Judged at its load's time, it could count a dispatch
   before one already counted, and three dispatches would fit in one window.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from processor.core.limit_undo import undo
from processor.core.limit_values import (
    Guard,
    LimitInputs,
    LimitView,
    Need,
    RunLimits,
)
from processor.core.model import LoadedRun
from processor.core.run_keys import (
    RUN_NODE,
    START,
    run_key,
    run_need,
    starts,
    unmarked,
    wait_for_key,
    waiting_since,
)
from processor.core.run_state import NodeStatus, RunStatus, node_state
from processor.core.shapes import AttemptRef
from processor.core.tick_decision import Decision, Dispatch
from processor.core.workflow_def import StepDef

# How long a node waiting for a concurrency slot waits before it looks again by itself, should
# the wakeup of the slot freed for it be lost (a process died between commit and produce).
# Each look that finds no room is a commit: long enough that ten thousand waiters cost under
# a hundred commits a second, short enough that a lost wakeup stalls its line minutes at most.
BACKSTOP_MS = 120_000

# The most dispatches of one rate limit a batch may let in (and so the most of its dispatches
# the shell loads for it): more than a batch's runs dispatch at once in all but a burst.
RATE_LOOKAHEAD = 256

__all__ = [
    "BACKSTOP_MS",
    "RATE_LOOKAHEAD",
    "admit",
    "needs_of",
    "paths_of",
]

_DISPATCHED, _LIMIT_WAIT = NodeStatus.DISPATCHED, NodeStatus.LIMIT_WAIT
_SUCCEEDED = NodeStatus.SUCCEEDED
_RUNNING = RunStatus.RUNNING


def needs_of(step: StepDef, values: Mapping[tuple[str, ...], str]) -> tuple[Need, ...]:
    """The counters a dispatch of ``step`` needs room in, for a run whose input holds
    ``values`` at the limits' paths."""
    needs = []
    if step.concurrency is not None:
        limit = step.concurrency
        key = limit.key_of(values.get(limit.key, "") if limit.key else "")
        needs.append(Need(key, limit.name, limit.limit, 0))
    if step.rate_limit is not None:
        rate = step.rate_limit
        needs.append(Need(rate.counter, rate.name, rate.limit, rate.per_ms))
    return tuple(needs)


def paths_of(steps: Sequence[StepDef]) -> set[tuple[str, ...]]:
    """The input paths the shell must read for a run of these steps."""
    return {s.concurrency.key for s in steps if s.concurrency is not None and s.concurrency.key}


class _Candidate(NamedTuple):
    order: tuple[int, int, str, str]
    run_id: str
    dispatch: Dispatch
    needs: tuple[Need, ...]
    waiter: bool  # the node waited for its limit before this tick


class _Counters:
    """The batch's use of each counter while ``admit`` decides."""

    def __init__(self, views: Mapping[str, LimitView], now_ms: int) -> None:
        self.views = views
        self.now_ms = now_ms
        self.used: Counter[str] = Counter()
        self.let_in: dict[str, set[tuple[str, str]]] = {}
        self.dispatched: dict[str, list[int]] = {}
        self.touched: set[str] = set()

    def view(self, key: str) -> LimitView:
        return self.views.get(key, LimitView())

    def position(self, need: Need, run_id: str, node: str) -> int:
        """Which of the counter's next admissions (run, node) would be, once the older
        waiters and this batch's admissions had theirs (0: the next one)."""
        let_in = self.let_in.get(need.key, set())
        ahead = 0
        for _since, waiting_run, waiting_node in self.view(need.key).queue:
            if (waiting_run, waiting_node) == (run_id, node):
                break
            ahead += (waiting_run, waiting_node) not in let_in
        return ahead + self.used[need.key]

    def bound(self, need: Need, position: int) -> int | None:
        """A rate counter's: the time of the dispatch that bounds its admission number
        ``position`` (0: none), None when that one was not loaded (no room known)."""
        view = self.view(need.key)
        index = view.span - need.limit + position
        return view.bounds[index] if 0 <= index < len(view.bounds) else None

    def room(self, need: Need, run_id: str, node: str) -> bool:
        """Whether a slot is free for (run, node) once the older waiters had theirs."""
        position = self.position(need, run_id, node)
        if need.per_ms:
            bound = self.bound(need, position)
            return bound is not None and bound <= self.now_ms - need.per_ms
        return position < need.limit - self.view(need.key).holders

    def take(self, need: Need, run_id: str, node: str) -> None:
        self.used[need.key] += 1
        self.let_in.setdefault(need.key, set()).add((run_id, node))
        if need.per_ms:
            self.dispatched.setdefault(need.key, []).append(self.now_ms)

    def due(self, need: Need, run_id: str, node: str) -> int:
        """When a waiter of a full rate limit looks again by itself: when the dispatch that
        bounds its admission leaves the window; one further in line than was loaded, no
        sooner than the last one loaded does, nor than a window (two minutes at most)."""
        bound = self.bound(need, self.position(need, run_id, node))
        if bound is not None:
            return bound + need.per_ms
        bounds = self.view(need.key).bounds
        later = self.now_ms + min(need.per_ms, BACKSTOP_MS)
        return max(bounds[-1] + need.per_ms, later) if bounds else later

    def since(self, need: Need, run_id: str, node: str) -> int | None:
        for since, waiting_run, waiting_node in self.view(need.key).queue:
            if (waiting_run, waiting_node) == (run_id, node):
                return since
        return None

    def guard(self, need: Need) -> Guard:
        view = self.view(need.key)
        if not need.per_ms:
            return Guard(need.key, view.version)
        taken = tuple(self.dispatched.get(need.key, ()))
        return Guard(need.key, view.version, taken, view.dispatched, max(view.span, need.limit))


def admit(
    batch: Sequence[tuple[LoadedRun, Decision]], inputs: LimitInputs, now_ms: int
) -> tuple[dict[str, Decision], dict[str, RunLimits]]:
    """Decide the dispatches of limited steps across ``batch`` (runs of workflows with limits,
    each with its tick's decision): the decisions as they hold (a dispatch without room
    undone, its node waiting) and what each run's commit writes of its limits. A decision
    with nothing left to write becomes a no-op (``new_state`` None)."""
    counters = _Counters(inputs.views, now_ms)
    ended = _Ended()
    candidates: list[_Candidate] = []
    run_starts: list[_Candidate] = []
    for index, (run, decision) in enumerate(batch):
        if decision.new_state is None:
            continue
        values = inputs.values.get(run.run_id, {})
        ended.add(run, decision, values)
        if run.wf.concurrency is not None:
            run_starts += _run_slot(index, run, decision, values, counters, ended)
        candidates += _candidates(index, run, decision, values, counters)
    # The runs' starts first (core/run_keys.py): a run refused its start dispatches nothing.
    kept_out, writes = _let_in(run_starts, counters, ended, now_ms, {})
    steps = [c for c in candidates if c.run_id not in kept_out]
    refused, writes = _let_in(steps, counters, ended, now_ms, writes)
    guards = {c.key: counters.guard(c) for cand in run_starts + steps for c in cand.needs}
    decisions: dict[str, Decision] = {}
    limits: dict[str, RunLimits] = {}
    for run, decision in batch:
        run_id = run.run_id
        if run_id in kept_out:
            held = wait_for_key(run, now_ms, BACKSTOP_MS)
        else:
            held = undo(run, decision, refused.get(run_id, {}), now_ms, BACKSTOP_MS)
            if run.wf.concurrency is not None and starts(run, decision):
                held = unmarked(held)
        decisions[run_id] = held
        if held.new_state is None:
            continue
        w = writes.get(run_id, _RunWrites())
        released = tuple(sorted((ended.freed.get(run_id) or Counter()).elements()))  # (positive)
        ends = held.new_state.status.terminal
        if not (w.keys or released or ended.releases.get(run_id) or ends):
            continue
        limits[run_id] = RunLimits(
            guards=tuple(guards[k] for k in sorted(w.keys)),
            holds=tuple(w.holds),
            releases=tuple(ended.releases.get(run_id, ())),
            waits=tuple(w.waits),
            unwaits=tuple(w.unwaits),
            released=released,
            ends=ends,
            waited=tuple(w.waited),
            refused=tuple(w.refused),
            run_key=run_key(run.wf, inputs.values.get(run_id, {})),
        )
    return decisions, limits


def _run_slot(
    index: int,
    run: LoadedRun,
    decision: Decision,
    values: Mapping[tuple[str, ...], str],
    counters: _Counters,
    ended: _Ended,
) -> list[_Candidate]:
    """A run of a workflow with ``concurrency`` (core/run_keys.py): its start as a candidate
    for its key's slot, in its place in line (rule 3 there); or, for a live run that ends,
    its slot freed for others (rule 4)."""
    need = run_need(run.wf, values)
    assert need is not None and decision.new_state is not None
    if starts(run, decision):
        since = counters.since(need, run.run_id, RUN_NODE)
        waited = waiting_since(run)
        order = (
            (0, since, run.run_id, RUN_NODE)
            if since is not None
            else (1 if waited else 2, index, "", RUN_NODE)
        )
        return [_Candidate(order, run.run_id, START, (need,), waited)]
    if run.state.status is _RUNNING and decision.new_state.status.terminal:
        ended.freed.setdefault(run.run_id, Counter())[need.key] += 1
    return []


class _Ended:
    """The slots the batch's runs held for attempts their decisions end."""

    def __init__(self) -> None:
        self.freed: dict[str, Counter[str]] = {}  # slots the run's attempts that ended held
        self.reusable: dict[str, Counter[str]] = {}  # of those, of attempts that succeeded
        self.releases: dict[str, list[AttemptRef]] = {}

    def add(
        self, run: LoadedRun, decision: Decision, values: Mapping[tuple[str, ...], str]
    ) -> None:
        assert decision.new_state is not None
        new = decision.new_state.node_map()
        step_of = run.wf.step_for
        for name, node in run.state.node_map().items():
            if node.status is not _DISPATCHED or not step_of(name).concurrency:
                continue
            after = new.get(name)
            if after is None or after.status is not _DISPATCHED or after.attempt != node.attempt:
                self.releases.setdefault(run.run_id, []).append((name, node.attempt))
                # (A map's item that leaves the state succeeded.)
                succeeded = after is None or after.status is _SUCCEEDED
                for need in needs_of(step_of(name), values):
                    if not need.per_ms:
                        self.freed.setdefault(run.run_id, Counter())[need.key] += 1
                        if succeeded:
                            self.reusable.setdefault(run.run_id, Counter())[need.key] += 1


def _candidates(
    index: int,
    run: LoadedRun,
    decision: Decision,
    values: Mapping[tuple[str, ...], str],
    counters: _Counters,
) -> list[_Candidate]:
    """The dispatches of limited steps in run number ``index``'s decision, each in its place
    in line: the waiters loaded first (oldest first), then the others that waited, then the
    new ones, in the batch's order."""
    old = run.state.node_map()
    step_of = run.wf.step_for
    candidates = []
    for position, dispatch in enumerate(decision.dispatches):
        step = step_of(dispatch.node)
        if not step.limited:
            continue
        needs = needs_of(step, values)
        waiter = old.get(dispatch.node, node_state()).status is _LIMIT_WAIT
        found = [
            s for n in needs if (s := counters.since(n, run.run_id, dispatch.node)) is not None
        ]
        order = (
            (0, min(found), run.run_id, dispatch.node)
            if found
            else (1 if waiter else 2, index, f"{position:09d}", dispatch.node)
        )
        candidates.append(_Candidate(order, run.run_id, dispatch, needs, waiter))
    return candidates


def _let_in(
    candidates: list[_Candidate],
    counters: _Counters,
    ended: _Ended,
    now_ms: int,
    writes: dict[str, _RunWrites],
) -> tuple[dict[str, dict[str, int | None]], dict[str, _RunWrites]]:
    """Each candidate in line let in or refused: the dispatches refused (run -> node -> a rate
    limit's due, or None) and what each run writes of its counters (added to ``writes``)."""
    refused: dict[str, dict[str, int | None]] = {}
    for candidate in sorted(candidates):
        run_id, name = candidate.run_id, candidate.dispatch.node
        own = ended.reusable.get(run_id, Counter())
        w = writes.setdefault(run_id, _RunWrites())
        w.keys.update(n.key for n in candidate.needs)
        full = [
            n
            for n in candidate.needs
            if not ((not n.per_ms and own[n.key] > 0) or counters.room(n, run_id, name))
        ]
        if full:
            dues = [counters.due(n, run_id, name) for n in full if n.per_ms]
            refused.setdefault(run_id, {})[name] = min(dues) if dues else None
            w.waits += [(n.key, name, now_ms) for n in candidate.needs]
            w.refused += [n.name for n in full]
            continue
        for need in candidate.needs:
            if not need.per_ms and own[need.key] > 0:
                own[need.key] -= 1  # its own slot, freed in this tick, taken again
                ended.freed[run_id][need.key] -= 1  # (not for a waiter)
            else:
                counters.take(need, run_id, name)
            if not need.per_ms:
                w.holds.append((need.key, name, candidate.dispatch.attempt))
            if candidate.waiter and (since := counters.since(need, run_id, name)) is not None:
                w.waited.append((need.name, now_ms - since))
        if candidate.waiter:
            w.unwaits.append(name)
    return refused, writes


class _RunWrites:
    def __init__(self) -> None:
        self.keys: set[str] = set()
        self.holds: list[tuple[str, str, int]] = []
        self.waits: list[tuple[str, str, int]] = []
        self.unwaits: list[str] = []
        self.waited: list[tuple[str, int]] = []
        self.refused: list[str] = []
