"""The tick: a pure function from (loaded state, definition, step results, signals, now) to a
decision. Every state transition of a run is decided here and nowhere else.

Rules, in the order they are applied:

1. A terminal run (succeeded, failed, cancelled) absorbs everything: the tick is a no-op.
1b. A pending run's steps are pinned to the versions of their functions it will run
   (core/versions.py: the step's own, else the newest its queue's live workers serve,
   ``served``, else 1); a running run's pins never change in a tick.
2. A ``cancel`` signal ends the run as cancelled; nodes still in flight become cancelled.
   A pending run whose start time is ahead (``not_before_ms``: a delayed start, a schedule's
   fire) does nothing else until then, whatever woke it.
2b. A run past its deadline (core/deadlines.py: its creation or delayed start plus its
   timeout, judged by ``now``) ends as failed, ``run deadline of N ms passed``; nodes still
   in flight become cancelled, as for a cancel. The tick that starts a run with a deadline
   sets a wakeup at it (within the delay ladder's horizon).
2c. In a workflow where a step has a compensation or that has a failure handler
   (core/sagas.py), a run to end failed or cancelled (rules 2, 2b, 5) whose steps with one
   succeeded, or to end failed with a handler, runs its saga first (the handler, then the
   compensations, one at a time), and then ends; while its saga runs, rules 2 and 2b and
   every node but its saga's are left alone.
3. Each step result is applied at most once: only a result whose attempt is the node's attempt
   in flight (status dispatched) applies. A duplicate, stale or unknown result changes nothing,
   and results are applied in a canonical order, so arrival order does not matter.
   A wait step in flight succeeds with the first signal of its name sent to the run (in the
   order they were received, before it started waiting or after): the decision names the
   signal, whose payload the commit records as the step's result. One that starts waiting
   when its signal is there already succeeds in the same tick, and so may what follows it.
   A sleep step in flight (core/sleeps.py) ends succeeded once its due time came (rule 4b).
   A workflow step in flight waits for its child run's end, which comes as its result like a
   worker's (core/children.py). A map step's items are nodes of their own (``step[i]``): each
   attempt of an item is a step attempt like any other.
4. A dispatched node is due (``due_ms``) when the coordinator must look at it again. A wait
   or workflow step whose due time passed has timed out; a wait step whose last attempt timed
   out with ``on_timeout: continue`` succeeds instead, its output its ``default`` (null when
   it has none), and the run goes on. A step a worker runs has Temporal's
   three timeouts, judged from what the workers recorded of its attempt (``started``: the
   load reads it for the nodes whose due time passed, and only then; None, not loaded, leaves
   the node as it is for the wakeup that loads it):
   - start-to-close (``timeout_ms``): counted from the attempt's start (its claim by a
     worker, or its start on a slot when that came later), never from its dispatch, so time
     in a queue spends none of it. The attempt "timed out" at start + timeout_ms; before
     that, its due time moves there.
   - heartbeat (``heartbeat_timeout_ms``): once started, an attempt whose worker records
     heartbeats fails when none was recorded for that long (from its start, or its last
     beat), before its deadline; its due time moves with the beats.
   - schedule-to-start (``schedule_to_start_ms``): an attempt no worker started that long
     after its dispatch (``since_ms``) fails the step, final (another attempt would wait in
     the same queue); schedule-to-close (``schedule_to_close_ms``): a step not done that long
     after its first dispatch (``first_ms``, kept through retries) fails, final, whatever its
     attempt is doing. An attempt in its queue with no such bound ahead stays as it is, its
     due time passed: the watchdog wakes it again, further apart each time (io/postgres/sweeps.py),
     and nothing is written until a worker starts it.
4b. A sleep step's due time is when it ends: past it (by ``now``), it succeeded, its output
   ``{"slept_until_ms": due}``; before it, whatever woke the run, it sleeps on. Like a wait
   step's or a map's, its output is made by the tick, and the commit records it
   (``settled``).
5. A failed attempt is retried by the step's policy (retry_wait until its backoff is due),
   or fails the node when attempts are exhausted (counted since the run was last resumed, see
   below), when the step declared the failure final (a result that is not ``retryable``: the
   step raised NonRetryable), or when the retry would come after its schedule-to-close
   bound; a failed node fails the run.
6. Due retries are dispatched with the next attempt; pending nodes whose dependencies all
   succeeded are dispatched with their next attempt (1, unless the run was resumed), due when
   its first bound could pass (its heartbeat timeout, else its timeout, from now; sooner
   when its schedule-to-start or schedule-to-close bound is); so are nodes waiting for a
   limit, at every tick. Whether a dispatch of a
   step with limits holds is decided across the batch's runs afterwards (core/limits.py):
   one that does not is a node waiting for its limit instead. A map step that becomes ready
   takes its items' count from its list (the run's input, or its ``items_from``
   dependency's output: ``length``): more than ``max_items``, or not a list, fails it; none
   succeeds it at once; otherwise its items are started by index, at most ``parallelism``
   of them in flight, each a node of the state while it is (``step[i]``). An item that
   succeeded leaves the state: the decision names it with its attempt, and the commit
   records it (``items_done``), so the state holds a map's counters (``MapProgress``) and
   its items in flight, never its whole list. When every item succeeded the map step
   succeeded; the decision names it with its count, and the commit records the items'
   outputs, in order, as its output.
   A sleep step that becomes ready starts (core/sleeps.py): due ``duration_ms`` from now, or
   at the time its ``until`` selector finds (read by the load: ``selected``); a value that
   is no time fails it; one whose source step ended in this very tick (its output not yet
   recorded) leaves it pending, with a timer for now, until the next tick reads it. A sleep
   whose time had passed ends in the tick that starts it (rule 4b), and what follows starts.
6a. In a workflow where a step has a condition (``when``), a skipped dependency has ended
   too, and before anything starts each pending step whose dependencies all ended is judged
   (core/skips.py): skipped when they were all skipped (unless ``run_if: all_done``), when a
   source of its data was, or when its condition is false on what the load read of its
   selectors (``selected``); held, with a timer for now, while those values were not read. A
   skipped node is terminal and has no output.
7. When every node succeeded or was skipped the run succeeded.
8. A tick that changes nothing is a no-op and writes nothing; one that changes anything bumps
   ``seq`` by exactly one (so ``last_transition_seq`` is monotone).

Two transitions come from outside a tick (core/run_ends.py):
``force_fail`` (the livelock guard and the stuck-run watchdog end a live run) and
``resume_failed`` (an operator's ``ductor runs retry`` takes a failed run back to running: its
succeeded nodes are kept, every other node is pending again, its attempt numbers going on and
its retry budget whole again).

The tick never reads the clock, never draws randomness, never does I/O: ``now_ms`` is an
argument, and the shell carries out the returned decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from processor.core.applied import apply_results, apply_timeouts
from processor.core.attempts import (
    dispatched,
)
from processor.core.deadlines import RunDeadline, deadline_reason, with_deadline_timer
from processor.core.map_steps import Maps, end_maps
from processor.core.model import LoadedRun, SignalKind, Started, StepResult
from processor.core.ready import EndedByTick, cascade, dispatch_ready
from processor.core.run_ends import (
    end_run,
    failure,
    ordered_nodes,
)
from processor.core.run_state import NodeState, NodeStatus, RunState, RunStatus
from processor.core.sagas import CANCEL_REASON, undo_or_end, undo_tick, undoing
from processor.core.selectors import Selected
from processor.core.sleeps import Settled, sleep_timers, wake_sleeps
from processor.core.tick_decision import NOOP, Decision, Dispatch
from processor.core.versions import ServedVersions, pinned
from processor.core.wait_steps import signal_waits
from processor.core.workflow_def import WorkflowDef

__all__ = [
    "tick",
    "tick_run",
]

# The enum members the tick compares against, as module globals: on Python 3.11 reading
# `NodeStatus.DISPATCHED` goes through the enum's metaclass (~130 ns), dozens of times a tick.
_PENDING, _DISPATCHED = NodeStatus.PENDING, NodeStatus.DISPATCHED
_RETRY_WAIT, _LIMIT_WAIT = NodeStatus.RETRY_WAIT, NodeStatus.LIMIT_WAIT
_SUCCEEDED, _FAILED = NodeStatus.SUCCEEDED, NodeStatus.FAILED
_SKIPPED = NodeStatus.SKIPPED
_RUN_PENDING, _RUN_RUNNING = RunStatus.PENDING, RunStatus.RUNNING
_RUN_FAILED, _CANCELLED = RunStatus.FAILED, RunStatus.CANCELLED


def tick(
    state: RunState,
    wf: WorkflowDef,
    results: Iterable[StepResult],
    signals: Iterable[SignalKind],
    now_ms: int,
    not_before_ms: int | None = None,
    named: Sequence[tuple[str, str]] = (),
    input_length: int | None = None,
    started: Mapping[str, Started] | None = None,
    selected: Mapping[str, Selected] | None = None,
    deadline: RunDeadline | None = None,
    served: ServedVersions | None = None,
) -> Decision:
    """``named``: the run's named signals, (name, signal id), in the order received;
    ``input_length``: the length of the run's input when it is a list (a map's items);
    ``started``: what the workers recorded of the attempts in flight whose due time passed,
    by node (rule 4; None: not loaded); ``selected``: what the selectors of its steps not
    yet started found, by the selector's text (rules 6 and 6a; one absent: not read);
    ``served``: the newest version of each step type live workers serve (rule 1b)."""
    if state.status.terminal:
        return NOOP
    state = pinned(state, wf, served) if state.status is _RUN_PENDING else state
    if wf.compensates and undoing(state):
        return undo_tick(state, wf, results, started, now_ms)
    if SignalKind.CANCEL in set(signals):
        return undo_or_end(state, state.node_map(), _CANCELLED, CANCEL_REASON, wf, now_ms)
    if not_before_ms is not None and now_ms < not_before_ms and state.status is _RUN_PENDING:
        return NOOP
    if deadline is not None:
        if now_ms >= deadline.at_ms:
            reason = deadline_reason(deadline.timeout_ms)
            return undo_or_end(state, state.node_map(), _RUN_FAILED, reason, wf, now_ms)
        if state.status is _RUN_PENDING:  # the tick that starts it: a wakeup at its deadline
            rest = (named, input_length, started, selected, None, served)
            decision = tick(state, wf, results, signals, now_ms, None, *rest)
            return with_deadline_timer(decision, deadline, now_ms)

    step_of = wf.step_for if wf.has_maps else wf.step_map.__getitem__
    nodes = state.node_map()
    apply_results(nodes, results, step_of, now_ms, state.seq + 1)
    signalled = signal_waits(nodes, wf, named) if named else []
    settled: list[Settled] = []
    unstarted = apply_timeouts(nodes, step_of, started, now_ms, settled)
    failed = failure(state, nodes)
    if failed is not None:
        run_failed = undo_or_end(state, nodes, _RUN_FAILED, failed, wf, now_ms)
        return run_failed._replace(
            signalled=tuple(signalled),
            unstarted=tuple(unstarted),
            settled=(*settled, *run_failed.settled),
        )
    if wf.only_tasks:  # the fast path: every step a task, started as it is ready
        return _tasks_only(state, wf, nodes, now_ms)
    maps = Maps(state, results, input_length) if wf.has_maps else None
    return _advance(state, wf, nodes, now_ms, maps, named, signalled, settled, selected)


def _advance(
    state: RunState,
    wf: WorkflowDef,
    nodes: dict[str, NodeState],
    now_ms: int,
    maps: Maps | None,
    named: Sequence[tuple[str, str]],
    signalled: list[tuple[str, int, str]],
    settled: list[Settled],
    selected: Mapping[str, Selected] | None,
) -> Decision:
    """Rules 6 to 8 for a workflow with wait, map, workflow or sleep steps."""
    mapped = end_maps(nodes, wf, maps) if maps is not None else []
    if wf.sleeps:
        settled += wake_sleeps(nodes, wf, now_ms)
    ended = EndedByTick(signalled, mapped, settled)
    dispatches, waiting, deferred = dispatch_ready(nodes, wf, now_ms, maps, selected)
    if waiting:
        more, waited, later = cascade(nodes, wf, now_ms, maps, named, selected, ended)
        dispatches += more
        waiting += waited
        deferred = deferred or later
    # What this tick ended (wait steps, maps, items, sleeps) is recorded whatever becomes of
    # the run.
    if (maps is not None or wf.sleeps) and (failed := failure(state, nodes)) is not None:
        # a map without its list, a sleep until no time
        ended_run = undo_or_end(state, nodes, _RUN_FAILED, failed, wf, now_ms, maps)
        settled += ended_run.settled  # (a failure handler's failure, when it has one)
        return ended_run._replace(
            signalled=tuple(signalled), mapped=tuple(mapped), settled=tuple(settled)
        )
    if all(s.status is _SUCCEEDED or s.status is _SKIPPED for s in nodes.values()):
        ended_run = end_run(state, nodes, RunStatus.SUCCEEDED, None, wf, maps)
        return ended_run._replace(
            signalled=tuple(signalled), mapped=tuple(mapped), settled=tuple(settled)
        )

    began = dispatches or waiting or signalled
    status = _RUN_RUNNING if state.status is _RUN_PENDING and began else state.status
    new_nodes = ordered_nodes(state, nodes, wf)
    new_maps = state.maps if maps is None else maps.progress_of(wf)
    if status is state.status and new_nodes == state.nodes and new_maps == state.maps:
        return NOOP
    new_state = RunState(status, new_nodes, state.seq + 1, state.reason, new_maps, state.versions)
    timers = _new_timers(state, new_state)
    if wf.sleeps or deferred:
        due = sleep_timers(state, nodes, wf, now_ms) if wf.sleeps else set()
        if deferred:
            due.add(now_ms)
        timers = tuple(sorted(due.union(timers)))
    done = () if maps is None else tuple(maps.done)
    return Decision(
        new_state,
        tuple(dispatches),
        timers,
        tuple(signalled),
        tuple(mapped),
        done,
        settled=tuple(settled),
    )


def tick_run(run: LoadedRun, now_ms: int) -> Decision:
    """``tick`` of a run as loaded, with everything the load carried for it."""
    return tick(
        run.state,
        run.wf,
        run.results,
        run.signals,
        now_ms,
        run.not_before_ms,
        run.named,
        run.input_length,
        None if run.starts is None else dict(run.starts),
        None if run.selected is None else dict(run.selected),
        run.deadline,
        run.served,
    )


def _tasks_only(
    state: RunState, wf: WorkflowDef, nodes: dict[str, NodeState], now_ms: int
) -> Decision:
    """Rules 6 to 8 for a workflow of task steps only (the common case, kept lean)."""
    dispatches = []
    for step in wf.steps:  # definition order keeps the decision deterministic
        node = nodes[step.name]
        retry_due = node.status is _RETRY_WAIT and node.due_ms is not None and now_ms >= node.due_ms
        first_run = node.status is _PENDING and all(
            nodes[d].status is _SUCCEEDED for d in step.depends_on
        )
        # A node waiting for its limit is tried again at every tick: what woke the run may
        # be the slot it waits for (core/limits.py decides).
        if retry_due or first_run or node.status is _LIMIT_WAIT:
            attempt = node.attempt + 1
            nodes[step.name] = dispatched(node, step, attempt, now_ms)
            deadline = now_ms + step.timeout_ms
            dispatches.append(Dispatch(step.name, attempt, step.step_type, deadline))
    if all(s.status is _SUCCEEDED for s in nodes.values()):
        return end_run(state, nodes, RunStatus.SUCCEEDED, None)
    status = _RUN_RUNNING if state.status is _RUN_PENDING and dispatches else state.status
    new_nodes = tuple((name, nodes[name]) for name, _ in state.nodes)
    if status is state.status and new_nodes == state.nodes:
        return NOOP
    new_state = RunState(status, new_nodes, state.seq + 1, state.reason, state.maps, state.versions)
    return Decision(new_state, tuple(dispatches), _new_timers(state, new_state))


def _new_timers(old: RunState, new: RunState) -> tuple[int, ...]:
    """Retry waits set by this tick: the shell wakes the run when each is due.

    Step deadlines get no timer: they are the failure path (most steps answer first), so the
    watchdog enforces them from ``next_wakeup_at`` and no record per dispatch is needed.
    """
    old_waits = {(n, s.attempt) for n, s in old.nodes if s.status is _RETRY_WAIT}
    dues = {
        s.due_ms
        for n, s in new.nodes
        if s.status is _RETRY_WAIT and s.due_ms is not None and (n, s.attempt) not in old_waits
    }
    return tuple(sorted(dues))
