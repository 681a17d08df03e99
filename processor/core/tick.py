"""The tick: a pure function from (loaded state, definition, step results, signals, now) to a
decision. Every state transition of a run is decided here and nowhere else.

Rules, in the order they are applied:

1. A terminal run (succeeded, failed, cancelled) absorbs everything: the tick is a no-op.
2. A ``cancel`` signal ends the run as cancelled; nodes still in flight become cancelled.
   A pending run whose start time is ahead (``not_before_ms``: a delayed start, a schedule's
   fire) does nothing else until then, whatever woke it.
3. Each step result is applied at most once: only a result whose attempt is the node's attempt
   in flight (status dispatched) applies. A duplicate, stale or unknown result changes nothing,
   and results are applied in a canonical order, so arrival order does not matter.
   A wait step in flight succeeds with the first signal of its name sent to the run (in the
   order they were received, before it started waiting or after): the decision names the
   signal, whose payload the commit records as the step's result. One that starts waiting
   when its signal is there already succeeds in the same tick, and so may what follows it.
   A workflow step in flight waits for its child run's end, which comes as its result like a
   worker's (core/children.py). A map step's items are nodes of their own (``step[i]``): each
   attempt of an item is a step attempt like any other.
4. A dispatched node is due (``due_ms``) when the coordinator must look at it again. A wait
   or workflow step whose due time passed has timed out. A step a worker runs has Temporal's
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
7. When every node succeeded the run succeeded.
8. A tick that changes nothing is a no-op and writes nothing; one that changes anything bumps
   ``seq`` by exactly one (so ``last_transition_seq`` is monotone).

Two transitions come from outside a tick, and live here too: ``force_fail`` (the livelock
guard and the stuck-run watchdog end a live run) and ``resume_failed`` (an operator's
``ductor runs retry`` takes a failed run back to running: its succeeded nodes are kept, every
other node is pending again, its attempt numbers going on and its retry budget whole again).

The tick never reads the clock, never draws randomness, never does I/O: ``now_ms`` is an
argument, and the shell carries out the returned decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from processor.core.model import (
    LoadedRun,
    MapProgress,
    NodeState,
    NodeStatus,
    RunState,
    RunStatus,
    SignalKind,
    Started,
    StepOutcome,
    StepResult,
    items_in,
    node_state,
)
from processor.core.workflow import StepDef, WorkflowDef, item_node

# The enum members the tick compares against, as module globals: on Python 3.11 reading
# `NodeStatus.DISPATCHED` goes through the enum's metaclass (~130 ns), dozens of times a tick.
_PENDING, _DISPATCHED = NodeStatus.PENDING, NodeStatus.DISPATCHED
_RETRY_WAIT, _LIMIT_WAIT = NodeStatus.RETRY_WAIT, NodeStatus.LIMIT_WAIT
_SUCCEEDED, _FAILED, _CANCELLED = NodeStatus.SUCCEEDED, NodeStatus.FAILED, NodeStatus.CANCELLED
_RUN_PENDING, _RUN_RUNNING = RunStatus.PENDING, RunStatus.RUNNING
_IN_FLIGHT = (_PENDING, _DISPATCHED, _RETRY_WAIT, _LIMIT_WAIT)
# A map in flight always has its progress; a row edited by hand without it ends its map as one
# of no more items rather than raise.
_NO_ITEMS = MapProgress(0)
_NEVER = node_state()  # a node never dispatched (a map's item before it starts)


# Dispatch and Decision are NamedTuples (immutable, compared and hashed in C): a tick makes
# several, and a frozen dataclass's __init__ sets each field through object.__setattr__.
class Dispatch(NamedTuple):
    """A step attempt to send to the workers. ``deadline_ms``: its dispatch plus its timeout
    (what a worker from before start-to-close takes for its deadline: core/step_task.py)."""

    node: str
    attempt: int
    step_type: str
    deadline_ms: int


class Decision(NamedTuple):
    """What the shell must do. ``new_state is None`` means no-op: write nothing, send nothing."""

    new_state: RunState | None
    dispatches: tuple[Dispatch, ...] = ()
    timers: tuple[int, ...] = ()  # epoch ms at which a retry wait ends and the run must be woken
    # Wait steps this tick ended, each with the signal that ended it: (node, attempt, signal id)
    signalled: tuple[tuple[str, int, str], ...] = ()
    # Map steps this tick ended succeeded: (node, attempt, how many items).
    mapped: tuple[tuple[str, int, int], ...] = ()
    # Map items this tick took out of the state, succeeded: (map step, index, attempt).
    items_done: tuple[tuple[str, int, int], ...] = ()
    # Attempts this tick failed that no worker had started (a schedule-to bound passed in the
    # queue): (node, attempt). The commit holds only if none was started meanwhile: it marks
    # each one never to be started (io/postgres/store.py), as a claim would mark it started.
    unstarted: tuple[tuple[str, int], ...] = ()

    @property
    def progressed(self) -> bool:
        return self.new_state is not None


NOOP = Decision(new_state=None)


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
) -> Decision:
    """``named``: the run's named signals, (name, signal id), in the order received;
    ``input_length``: the length of the run's input when it is a list (a map's items);
    ``started``: what the workers recorded of the attempts in flight whose due time passed,
    by node (rule 4; None: not loaded)."""
    if state.status.terminal:
        return NOOP
    if SignalKind.CANCEL in set(signals):
        return _end(state, state.node_map(), RunStatus.CANCELLED, "cancelled by signal")
    if not_before_ms is not None and now_ms < not_before_ms and state.status is _RUN_PENDING:
        return NOOP

    step_of = wf.step_for if wf.has_maps else wf.step_map.__getitem__
    nodes = state.node_map()
    for result in sorted(set(results), key=_result_order):
        node = nodes.get(result.node)
        if node is None or node.status is not _DISPATCHED:
            continue
        if node.attempt != result.attempt:
            continue
        ok = result.outcome is StepOutcome.SUCCEEDED
        nodes[result.node] = _finish_attempt(
            node, step_of(result.node), ok, result.error, now_ms, result.retryable
        )

    signalled = _signal_waits(nodes, wf, named) if named else []

    unstarted: list[tuple[str, int]] = []
    for name, node in list(nodes.items()):
        if node.status is _DISPATCHED and node.due_ms is not None and now_ms >= node.due_ms:
            step = step_of(name)
            if step.runs_on_a_worker or (step.maps and name != step.name):
                judged = _judge(node, step, started, name, now_ms)
                if judged is not None:
                    nodes[name] = judged
                    if judged.status is _FAILED and _unstarted(started, name, node.attempt):
                        unstarted.append((name, node.attempt))
            else:
                error = f"attempt {node.attempt} timed out after {step.timeout_ms} ms"
                nodes[name] = _finish_attempt(node, step, False, error, now_ms)
        elif node.first_ms is not None and (
            node.status is _RETRY_WAIT or node.status is _LIMIT_WAIT
        ):
            step = step_of(name)  # waiting for its next attempt past its schedule-to-close
            to_close = step.schedule_to_close_ms
            if to_close is not None and now_ms >= node.first_ms + to_close:
                nodes[name] = node_state(
                    _FAILED, node.attempt, None, _closed(to_close, node.error), node.attempts_before
                )

    failed = _failed(state, nodes)
    if failed is not None:
        run_failed = _end(state, nodes, RunStatus.FAILED, failed, wf)
        return run_failed._replace(signalled=tuple(signalled), unstarted=tuple(unstarted))

    if wf.only_tasks:  # the fast path: every step a task, started as it is ready
        return _tasks_only(state, wf, nodes, now_ms)
    maps = _Maps(state, results, input_length) if wf.has_maps else None
    mapped = _end_maps(nodes, wf, maps) if maps is not None else []
    dispatches, waiting = _dispatch_ready(nodes, wf, now_ms, maps)
    while waiting:
        # A step just started may end at once (a wait whose signal came first, a map of no
        # items), and what follows it starts now.
        ended = _signal_waits(nodes, wf, named)
        ended_maps = _end_maps(nodes, wf, maps) if maps is not None else []
        if not (ended or ended_maps):
            break
        signalled += ended
        mapped += ended_maps
        more, waiting = _dispatch_ready(nodes, wf, now_ms, maps)
        dispatches += more
    # What this tick ended (wait steps, maps, items) is recorded whatever becomes of the run.
    if maps is not None and (failed := _failed(state, nodes)) is not None:
        ended_run = _end(state, nodes, RunStatus.FAILED, failed, wf, maps)  # a map without its list
        return ended_run._replace(signalled=tuple(signalled), mapped=tuple(mapped))
    if all(s.status is _SUCCEEDED for s in nodes.values()):
        ended_run = _end(state, nodes, RunStatus.SUCCEEDED, None, wf, maps)
        return ended_run._replace(signalled=tuple(signalled), mapped=tuple(mapped))

    began = dispatches or waiting or signalled
    status = _RUN_RUNNING if state.status is _RUN_PENDING and began else state.status
    new_nodes = _ordered(state, nodes, wf)
    new_maps = state.maps if maps is None else maps.progress_of(wf)
    if status is state.status and new_nodes == state.nodes and new_maps == state.maps:
        return NOOP
    new_state = RunState(status, new_nodes, state.seq + 1, state.reason, new_maps)
    timers = _new_timers(state, new_state)
    done = () if maps is None else tuple(maps.done)
    return Decision(new_state, tuple(dispatches), timers, tuple(signalled), tuple(mapped), done)


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
    )


def _judge(
    node: NodeState,
    step: StepDef,
    started: Mapping[str, Started] | None,
    name: str,
    now_ms: int,
) -> NodeState | None:
    """Rule 4 for a dispatched attempt a worker runs, whose due time passed: failed by one
    of its timeouts, or due again when the next could pass; None: nothing to change (what
    the workers recorded was not loaded, or it waits in its queue with no bound ahead)."""
    if started is None:
        return None
    attempt = node.attempt
    close_by = None
    if step.schedule_to_close_ms is not None and node.first_ms is not None:
        close_by = node.first_ms + step.schedule_to_close_ms
        if now_ms >= close_by:
            error = (
                f"the step did not end within {step.schedule_to_close_ms} ms of its first"
                f" dispatch (schedule_to_close_ms); attempt {attempt} was in flight"
            )
            return _finish_attempt(node, step, False, error, now_ms, retryable=False)
    fact = started.get(name)
    if fact is None or fact.attempt != attempt:  # still in its queue
        bounds = [] if close_by is None else [close_by]
        if step.schedule_to_start_ms is not None and node.since_ms is not None:
            start_by = node.since_ms + step.schedule_to_start_ms
            if now_ms >= start_by:
                error = (
                    f"attempt {attempt} was not started within {step.schedule_to_start_ms} ms"
                    " of its dispatch (schedule_to_start_ms)"
                )
                return _finish_attempt(node, step, False, error, now_ms, retryable=False)
            bounds.append(start_by)
        return _due_at(node, min(bounds)) if bounds else None
    close = fact.started_ms + step.timeout_ms
    if close_by is not None:
        close = min(close, close_by)  # (not passed: judged above)
    due = close
    if step.heartbeat_timeout_ms is not None and fact.beats_recorded:
        last = fact.started_ms if fact.beat_ms is None else max(fact.started_ms, fact.beat_ms)
        silent_by = last + step.heartbeat_timeout_ms
        if now_ms >= silent_by and silent_by < close:
            error = (
                f"attempt {attempt} recorded no heartbeat for {step.heartbeat_timeout_ms} ms"
                " (heartbeat_timeout_ms)"
            )
            return _finish_attempt(node, step, False, error, now_ms)
        due = min(due, silent_by)
    if now_ms >= close:
        error = f"attempt {attempt} timed out after {step.timeout_ms} ms"
        return _finish_attempt(node, step, False, error, now_ms)
    return _due_at(node, due)


def _unstarted(started: Mapping[str, Started] | None, name: str, attempt: int) -> bool:
    """Whether no worker had started ``attempt`` of node ``name`` (as far as was loaded)."""
    fact = None if started is None else started.get(name)
    return fact is None or fact.attempt != attempt


def _due_at(node: NodeState, due_ms: int) -> NodeState:
    """``node``, due at ``due_ms``."""
    return node_state(
        node.status,
        node.attempt,
        due_ms,
        node.error,
        node.attempts_before,
        node.since_ms,
        node.first_ms,
    )


def _dispatched(node: NodeState, step: StepDef, attempt: int, now_ms: int) -> NodeState:
    """``node`` dispatched now with ``attempt``: due when its first bound could pass (rule
    6): its heartbeat timeout (shorter than its timeout), else its timeout, from now; its
    schedule-to-start and schedule-to-close bounds when sooner, which it then remembers
    (``since_ms``, ``first_ms``: rule 4)."""
    beat = step.heartbeat_timeout_ms
    due = now_ms + (step.timeout_ms if beat is None else beat)
    to_start, to_close = step.schedule_to_start_ms, step.schedule_to_close_ms
    if to_start is None and to_close is None:  # the common case: nothing to remember
        return node_state(_DISPATCHED, attempt, due, None, node.attempts_before)
    since = None
    if to_start is not None:
        since = now_ms
        due = min(due, now_ms + to_start)
    first = None
    if to_close is not None:
        first = now_ms if node.first_ms is None else node.first_ms
        due = min(due, first + to_close)
    return node_state(_DISPATCHED, attempt, due, None, node.attempts_before, since, first)


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
            nodes[step.name] = _dispatched(node, step, attempt, now_ms)
            deadline = now_ms + step.timeout_ms
            dispatches.append(Dispatch(step.name, attempt, step.step_type, deadline))
    if all(s.status is _SUCCEEDED for s in nodes.values()):
        return _end(state, nodes, RunStatus.SUCCEEDED, None)
    status = _RUN_RUNNING if state.status is _RUN_PENDING and dispatches else state.status
    new_nodes = tuple((name, nodes[name]) for name, _ in state.nodes)
    if status is state.status and new_nodes == state.nodes:
        return NOOP
    new_state = RunState(status, new_nodes, state.seq + 1, state.reason, state.maps)
    return Decision(new_state, tuple(dispatches), _new_timers(state, new_state))


def _failed(state: RunState, nodes: dict[str, NodeState]) -> str | None:
    """The reason the run fails, if a node failed for good."""
    for name, node in nodes.items():
        if node.status is _FAILED:
            return f"step {name!r} failed after {node.attempt} attempt(s): {node.error}"
    return None


def _ordered(
    state: RunState, nodes: dict[str, NodeState], wf: WorkflowDef
) -> tuple[tuple[str, NodeState], ...]:
    """The nodes in the state's order: the definition's, each map step's items in the state
    right after it by index (those this tick started too; those it took out gone)."""
    if not wf.has_maps:
        return tuple((name, nodes[name]) for name, _ in state.nodes)
    items = items_in(nodes)
    ordered: list[tuple[str, NodeState]] = []
    for step in wf.steps:
        ordered.append((step.name, nodes[step.name]))
        if step.maps:
            ordered += [(item, nodes[item]) for _, item in items.get(step.name, ())]
    return tuple(ordered)


class _Maps:
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


def _end_maps(
    nodes: dict[str, NodeState], wf: WorkflowDef, maps: _Maps
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


def _result_order(result: StepResult) -> tuple[str, int, str, str]:
    return (result.node, result.attempt, result.outcome, result.error or "")


def force_fail(state: RunState, reason: str) -> RunState | None:
    """The terminal path shared by the livelock guard and the stuck-run watchdog.

    Returns None when the run already ended (nothing to fail).
    """
    if state.status.terminal:
        return None
    return _end(state, state.node_map(), RunStatus.FAILED, reason).new_state


class NotResumable(ValueError):
    """``resume_failed`` was given a run that is not failed."""


def resume_failed(state: RunState) -> RunState:
    """A failed run resumed from its failed steps: running again, ``seq`` + 1, no failure
    reason; succeeded nodes untouched; every other node (the failed ones, and those cancelled
    when the run failed) pending, with no deadline and no error, at the attempt it reached.
    The next dispatch of a node is therefore a new attempt number (a step result of an
    earlier attempt can never be taken for one of the new ones), and ``attempts_before``
    gives each step its policy's whole budget of attempts again.

    Raises NotResumable for a run that is not failed."""
    if state.status is not RunStatus.FAILED:
        raise NotResumable(f"only a failed run can be resumed; this one is {state.status}")
    nodes = tuple(
        (
            name,
            node
            if node.status is _SUCCEEDED
            else node_state(_PENDING, node.attempt, None, None, node.attempt),
        )
        for name, node in state.nodes
    )
    return RunState(_RUN_RUNNING, nodes, state.seq + 1, None, state.maps)


def _finish_attempt(
    node: NodeState,
    step: StepDef,
    ok: bool,
    error: str | None,
    now_ms: int,
    retryable: bool = True,
) -> NodeState:
    if ok:
        return node_state(_SUCCEEDED, node.attempt, None, None, node.attempts_before)
    # The policy counts the attempts since the run was last resumed (none before: attempt).
    tried = node.attempt - node.attempts_before
    if retryable and tried < step.retry.max_attempts:
        due = now_ms + step.retry.delay_after(tried)
        to_close = step.schedule_to_close_ms
        if to_close is None or node.first_ms is None or due < node.first_ms + to_close:
            return node_state(
                _RETRY_WAIT, node.attempt, due, error, node.attempts_before, None, node.first_ms
            )
        error = _closed(to_close, error)
    return node_state(_FAILED, node.attempt, None, error, node.attempts_before)


def _closed(to_close: int, error: str | None) -> str:
    """The error of a step whose schedule-to-close bound ends it between two attempts (the
    last attempt's error first)."""
    return (
        f"{error or 'failed'}; not retried: the step must end within {to_close} ms of its"
        " first dispatch (schedule_to_close_ms)"
    )


def _dispatch_ready(
    nodes: dict[str, NodeState], wf: WorkflowDef, now_ms: int, maps: _Maps | None = None
) -> tuple[list[Dispatch], int]:
    """Start what is ready: the step attempts to send to the workers, and how many steps
    began that no worker runs (a wait step, which a signal ends; a workflow step, whose child
    run the commit starts; a map step, whose items are dispatched)."""
    dispatches = []
    waiting = 0
    for step in wf.steps:  # definition order keeps the decision deterministic
        node = nodes[step.name]
        retry_due = node.status is _RETRY_WAIT and node.due_ms is not None and now_ms >= node.due_ms
        first_run = node.status is _PENDING and all(
            nodes[d].status is _SUCCEEDED for d in step.depends_on
        )
        if step.maps:
            assert maps is not None
            if first_run:
                waiting += _expand(nodes, step, maps)
            if nodes[step.name].status is _DISPATCHED:
                dispatches += _dispatch_items(nodes, step, now_ms, maps)
            continue
        if retry_due or first_run or node.status is _LIMIT_WAIT:
            attempt = node.attempt + 1
            deadline = now_ms + step.timeout_ms
            nodes[step.name] = _dispatched(node, step, attempt, now_ms)
            if step.runs_on_a_worker:
                dispatches.append(Dispatch(step.name, attempt, step.step_type, deadline))
            else:
                waiting += 1
    return dispatches, waiting


def _expand(nodes: dict[str, NodeState], step: StepDef, maps: _Maps) -> int:
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


def _dispatch_items(
    nodes: dict[str, NodeState], step: StepDef, now_ms: int, maps: _Maps
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
        nodes[item] = _dispatched(node, step, attempt, now_ms)
        dispatches.append(Dispatch(item, attempt, step.step_type, now_ms + step.timeout_ms))
    progress = maps.progress.get(step.name, _NO_ITEMS)
    started = progress.started
    while started < progress.items and in_flight < step.parallelism:
        item = item_node(step.name, started)
        nodes[item] = _dispatched(_NEVER, step, 1, now_ms)
        dispatches.append(Dispatch(item, 1, step.step_type, now_ms + step.timeout_ms))
        started += 1
        in_flight += 1
    if started != progress.started:
        maps.progress[step.name] = MapProgress(progress.items, started)
    return dispatches


def _signal_waits(
    nodes: dict[str, NodeState], wf: WorkflowDef, named: Sequence[tuple[str, str]]
) -> list[tuple[str, int, str]]:
    """End each wait step in flight whose signal was received (the first of its name)."""
    ended: list[tuple[str, int, str]] = []
    if not named:
        return ended
    for step in wf.steps:
        if not step.waits:
            continue
        node = nodes[step.name]
        if node.status is not _DISPATCHED:
            continue
        first = next((sid for name, sid in named if name == step.signal), None)
        if first is not None:
            nodes[step.name] = node_state(
                _SUCCEEDED, node.attempt, None, None, node.attempts_before
            )
            ended.append((step.name, node.attempt, first))
    return ended


def _end(
    state: RunState,
    nodes: dict[str, NodeState],
    status: RunStatus,
    reason: str | None,
    wf: WorkflowDef | None = None,
    maps: _Maps | None = None,
) -> Decision:
    order = state.nodes if wf is None else _ordered(state, nodes, wf)
    ended = tuple(
        (
            n,
            node_state(_CANCELLED, s.attempt, None, s.error, s.attempts_before)
            if s.status in _IN_FLIGHT
            else s,
        )
        for n, s in ((name, nodes[name]) for name, _ in order)
    )
    if maps is None or wf is None:
        return Decision(RunState(status, ended, state.seq + 1, reason, state.maps))
    new_state = RunState(status, ended, state.seq + 1, reason, maps.progress_of(wf))
    return Decision(new_state, items_done=tuple(maps.done))


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
