"""Hypothesis properties of the pure tick (processor/tick.py), on random DAG workflows and
random reachable runs of them."""

from __future__ import annotations

import heapq
import random
from dataclasses import dataclass, field

import orjson
from hypothesis import event, given
from hypothesis import strategies as st

from processor.core.model import SignalKind, Started, StepOutcome, StepResult
from processor.core.run_state import (
    NodeStatus,
    RunState,
    RunStatus,
    initial_state,
    state_checksum,
    state_from_row,
)
from processor.core.tick import tick
from processor.core.tick_decision import NOOP, Decision
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef

from .strategies import (
    FAST,
    STEP_NAMES,
    Run,
    any_results,
    check_decision,
    runs,
    terminal_states,
    tick_inputs,
    with_duplicates,
    workflows,
)


@FAST
@given(st.data())
def test_same_inputs_give_the_same_decision(data: st.DataObject) -> None:
    run = data.draw(runs())
    inputs = data.draw(tick_inputs(run))
    first = tick(
        run.state, run.wf, inputs.results, inputs.signals, inputs.now_ms, started=inputs.started
    )
    second = tick(
        run.state,
        run.wf,
        list(inputs.results),
        set(inputs.signals),
        inputs.now_ms,
        started=dict(inputs.started),
    )
    assert first == second
    check_decision(run.state, first, run.wf)


@FAST
@given(st.data())
def test_ticking_the_committed_state_again_is_a_noop(data: st.DataObject) -> None:
    run = data.draw(runs())
    inputs = data.draw(tick_inputs(run))
    first = tick(
        run.state, run.wf, inputs.results, inputs.signals, inputs.now_ms, started=inputs.started
    )
    event(f"first tick: {'noop' if first.new_state is None else first.new_state.status}")
    if first.new_state is None:
        return
    again = tick(
        first.new_state,
        run.wf,
        inputs.results,
        inputs.signals,
        inputs.now_ms,
        started=inputs.started,
    )
    assert again == NOOP
    assert again.new_state is None


@FAST
@given(st.data())
def test_duplicated_and_reordered_results_change_nothing(data: st.DataObject) -> None:
    # Inputs hold at most one result per (node, attempt), as the store's primary key does;
    # conflicting results for one attempt are covered (and crash today) in test_tick_examples.
    run = data.draw(runs())
    inputs = data.draw(tick_inputs(run))
    mask = data.draw(st.lists(st.booleans(), max_size=len(inputs.results)))
    noisy = data.draw(st.permutations(with_duplicates(inputs.results, mask)))
    expected = tick(
        run.state, run.wf, inputs.results, inputs.signals, inputs.now_ms, started=inputs.started
    )
    event(f"state {run.state.status}, {len(noisy)} results, progressed={expected.progressed}")
    assert (
        tick(run.state, run.wf, noisy, inputs.signals, inputs.now_ms, started=inputs.started)
        == expected
    )


@FAST
@given(st.data())
def test_only_a_result_for_the_attempt_in_flight_applies(data: st.DataObject) -> None:
    run = data.draw(runs())
    inputs = data.draw(tick_inputs(run))
    nodes = run.state.node_map()

    def live(r: StepResult) -> bool:
        node = nodes.get(r.node)
        return (
            node is not None and node.status is NodeStatus.DISPATCHED and node.attempt == r.attempt
        )

    applicable = tuple(r for r in inputs.results if live(r))
    ignored = tuple(r for r in inputs.results if not live(r))
    event(f"{len(applicable)} applicable, {len(ignored)} ignored")
    started = inputs.started
    expected = tick(run.state, run.wf, applicable, inputs.signals, inputs.now_ms, started=started)
    assert (
        tick(
            run.state, run.wf, inputs.results, inputs.signals, inputs.now_ms, started=inputs.started
        )
        == expected
    )
    assert tick(run.state, run.wf, ignored, inputs.signals, inputs.now_ms, started=started) == (
        tick(run.state, run.wf, (), inputs.signals, inputs.now_ms, started=started)
    )


@FAST
@given(st.data())
def test_every_transition_bumps_seq_by_exactly_one(data: st.DataObject) -> None:
    run = data.draw(runs())
    state = run.state
    for _ in range(data.draw(st.integers(1, 6))):
        inputs = data.draw(tick_inputs(Run(run.wf, state, run.now_ms, run.stored)))
        decision = tick(
            state, run.wf, inputs.results, inputs.signals, inputs.now_ms, started=inputs.started
        )
        check_decision(state, decision, run.wf)
        if decision.new_state is not None:
            assert decision.new_state.seq == state.seq + 1
            state = decision.new_state
        else:
            assert decision == NOOP


def _round_trip(state: RunState, wf: WorkflowDef) -> RunState:
    """The state as the store writes it (nodes as JSON) and reads it back."""
    nodes = orjson.loads(orjson.dumps(state.nodes_json()))
    return state_from_row(state.status.value, nodes, state.seq, state.reason, wf)


@FAST
@given(runs())
def test_checksum_is_stable_and_survives_the_row_round_trip(run: Run) -> None:
    state = run.state
    checksum = state_checksum(state)
    assert checksum == state_checksum(state)
    assert len(checksum) == 32
    back = _round_trip(state, run.wf)
    assert back == state
    assert state_checksum(back) == checksum
    # A rebuilt equal value (fresh tuples, fresh NodeStates) has the same checksum too.
    rebuilt = RunState(state.status, tuple(state.node_map().items()), state.seq, state.reason)
    assert state_checksum(rebuilt) == checksum
    # ...and the checksum covers seq, so a replayed write with a moved seq is detected.
    bumped = RunState(state.status, state.nodes, state.seq + 1, state.reason)
    assert state_checksum(bumped) != checksum


any_starts = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(STEP_NAMES),
        st.builds(
            Started,
            st.integers(1, 6),
            st.integers(-(10**12), 10**12),
            st.one_of(st.none(), st.integers(-(10**12), 10**12)),
            st.booleans(),
        ),
    ),
)


@FAST
@given(terminal_states(), any_results, st.booleans(), st.integers(0, 10**12), any_starts)
def test_terminal_states_absorb_every_input(
    terminal: tuple[WorkflowDef, RunState],
    results: list[StepResult],
    cancel: bool,
    now_ms: int,
    started: dict[str, Started] | None,
) -> None:
    wf, state = terminal
    assert state.status.terminal
    signals = [SignalKind.CANCEL] if cancel else []
    assert tick(state, wf, results, signals, now_ms, started=started) == NOOP


@FAST
@given(st.data())
def test_a_cancel_signal_ends_any_live_run_as_cancelled(data: st.DataObject) -> None:
    run = data.draw(runs(live_only=True))
    assert not run.state.status.terminal
    inputs = data.draw(tick_inputs(run))
    cancel = [SignalKind.CANCEL]
    decision = tick(
        run.state, run.wf, inputs.results, cancel, inputs.now_ms, started=inputs.started
    )
    new = decision.new_state
    assert new is not None
    assert new.status is RunStatus.CANCELLED
    assert new.seq == run.state.seq + 1
    assert decision.dispatches == ()
    for name, before in run.state.nodes:
        after = new.node(name)
        if before.status in {NodeStatus.PENDING, NodeStatus.DISPATCHED, NodeStatus.RETRY_WAIT}:
            assert after.status is NodeStatus.CANCELLED
        else:
            assert after == before  # results in the same tick are not applied after a cancel
        assert after.attempt == before.attempt


# ---------------------------------------------------------------------------------------------
# Liveness: a simulated world of workers, a store and timers drives every run to its end.


@dataclass(order=True)
class _Event:
    at: int
    order: int
    result: StepResult | None = field(compare=False, default=None)  # None: a wakeup


@dataclass
class _Execution:
    """An attempt a worker started at ``at`` and answers at ``until``, beating all along
    (``beats``) or silent (a worker that died, or a step that forgot to)."""

    attempt: int
    at: int
    until: int
    beats: bool
    reports: bool


@dataclass
class _World:
    """Workers that take every dispatched attempt from its queue, mostly at once, sometimes
    long after (a restart, a backlog), and answer it (late, duplicated, out of order), a store
    that keeps the first result per (node, attempt), and the shell: the run is woken by a
    delivered result, by a timer a decision asked for, or by the watchdog when the row's next
    wakeup (``next_due_ms()`` of the committed state) is overdue by its grace, and again,
    later, while it stays overdue. A tick sees what the workers recorded of the attempts they
    started by then."""

    wf: WorkflowDef
    rng: random.Random
    events: list[_Event] = field(default_factory=list)
    stored: dict[tuple[str, int], StepResult] = field(default_factory=dict)
    executions: dict[str, _Execution] = field(default_factory=dict)
    counter: int = 0

    def schedule(self, at: int, result: StepResult | None = None) -> None:
        self.counter += 1
        heapq.heappush(self.events, _Event(at, self.counter, result))

    def on_commit(self, now: int, state: RunState, decision: Decision) -> None:
        for at in decision.timers:
            assert at >= now
            self.schedule(at + self.rng.choice([0, 0, 0, self.rng.randint(1, 50)]))
        self.sweep(now, state)
        for d in decision.dispatches:
            step = self.wf.step_for(d.node)
            ok = self.rng.random() < 0.8
            result = StepResult(
                d.node,
                d.attempt,
                StepOutcome.SUCCEEDED if ok else StepOutcome.FAILED,
                None if ok else f"boom {d.attempt}",
            )
            # Mostly taken at once; sometimes after a long wait in its queue.
            queued = self.rng.randint(0, 20)
            if self.rng.random() < 0.2:
                queued += self.rng.randint(0, 3 * step.timeout_ms)
            # Mostly in time; sometimes after the deadline (the attempt has timed out by then).
            latency = self.rng.randint(0, step.timeout_ms)
            if self.rng.random() < 0.15:
                latency += self.rng.randint(1, 300)
            started = now + queued
            self.executions[d.node] = _Execution(
                d.attempt,
                started,
                started + latency,
                self.rng.random() < 0.9,
                self.rng.random() < 0.9,
            )
            self.schedule(started + latency, result)
            if self.rng.random() < 0.2:  # redelivered by the steps topic
                self.schedule(started + latency + self.rng.randint(0, 500), result)

    def sweep(self, now: int, state: RunState) -> None:
        """The watchdog's next look at the run, some grace after its next wakeup."""
        due = state.next_due_ms()
        if due is not None:
            self.schedule(max(now, due) + self.rng.randint(0, 300))

    def started(self, now: int) -> dict[str, Started]:
        """What the workers recorded by ``now``: the starts, and the last beat (one every
        50 ms, while the step runs)."""
        seen = {}
        for node, e in self.executions.items():
            if e.at <= now:
                beat = None
                if e.beats and now > e.at:
                    beat = min(now, e.until) - (min(now, e.until) - e.at) % 50
                seen[node] = Started(e.attempt, e.at, beat, e.reports)
        return seen

    def results_seen(self) -> list[StepResult]:
        seen = list(self.stored.values())
        seen += [r for r in seen if self.rng.random() < 0.3]  # duplicates in one load
        self.rng.shuffle(seen)
        return seen


def _simulate(wf: WorkflowDef, seed: int, max_ticks: int) -> tuple[RunState, int]:
    world = _World(wf, random.Random(seed))
    state = initial_state(wf)
    world.schedule(0)  # the start wakeup
    now = 0
    ticks = 0
    while not state.status.terminal:
        assert world.events, f"live run with nothing left to wake it: {state}"
        assert ticks < max_ticks, f"not terminal after {ticks} ticks: {state}"
        event = heapq.heappop(world.events)
        now = max(now, event.at)
        if event.result is not None:
            world.stored.setdefault((event.result.node, event.result.attempt), event.result)
        if world.rng.random() < 0.05:  # a spurious wakeup (a duplicate sweep) a little later
            world.schedule(now + world.rng.randint(0, 2_000))
        decision = tick(state, wf, world.results_seen(), (), now, started=world.started(now))
        ticks += 1
        check_decision(state, decision, wf)
        if decision.new_state is None:
            due = state.next_due_ms()
            if due is not None and due <= now:  # still overdue: swept again, further apart
                world.schedule(now + max(100, now - due) + world.rng.randint(0, 300))
            continue
        state = decision.new_state
        world.on_commit(now, state, decision)
    return state, ticks


@FAST
@given(workflows, st.integers(0, 2**32 - 1))
def test_every_run_reaches_a_terminal_state(wf: WorkflowDef, seed: int) -> None:
    # Each attempt creates at most a handful of events (result, redelivery, deadline timer,
    # retry timer, sweeps while it waits in its queue); 6 steps x 4 attempts bounds the ticks
    # well under this.
    final, ticks = _simulate(wf, seed, max_ticks=1_000)
    event(f"run {final.status}")
    assert final.status in {RunStatus.SUCCEEDED, RunStatus.FAILED}
    every_node_succeeded = all(s.status is NodeStatus.SUCCEEDED for _, s in final.nodes)
    assert (final.status is RunStatus.SUCCEEDED) == every_node_succeeded
    if final.status is RunStatus.FAILED:
        failed = [(n, s) for n, s in final.nodes if s.status is NodeStatus.FAILED]
        assert len(failed) >= 1
        name, node = failed[0]
        # Out of attempts, unless a schedule-to bound ended the step first (final).
        assert node.attempt == wf.step(name).retry.max_attempts or (
            node.error is not None and "(schedule_to_" in node.error
        ), node
        assert final.reason is not None and repr(name) in final.reason
        assert all(s.status is not NodeStatus.DISPATCHED for _, s in final.nodes)
    assert final.seq <= ticks
    # Terminal absorbs: nothing the world still delivers changes the ended run.
    assert tick(final, wf, [], [SignalKind.CANCEL], 10**12, started=world_never()) == NOOP


def world_never() -> dict[str, Started]:
    """Starts no node of the test's workflows has."""
    return {"no-such-step": Started(1, 0)}


@FAST
@given(st.data())
def test_a_run_started_for_later_waits_for_its_time_whatever_wakes_it(
    data: st.DataObject,
) -> None:
    """A pending run whose start time is ahead does nothing, whatever results or wakeups come
    (only a cancel ends it); once its time has come it is ticked as if it had none; a run
    already running is not held by it (a start time only holds a start)."""
    run = data.draw(runs())
    inputs = data.draw(tick_inputs(run))
    ahead = inputs.now_ms + data.draw(st.integers(1, 10**9))
    started = inputs.started
    waited = tick(
        run.state, run.wf, inputs.results, inputs.signals, inputs.now_ms, ahead, started=started
    )
    plain = tick(
        run.state, run.wf, inputs.results, inputs.signals, inputs.now_ms, started=inputs.started
    )
    if run.state.status is RunStatus.PENDING and SignalKind.CANCEL not in inputs.signals:
        assert waited == NOOP
    else:
        assert waited == plain
    passed = inputs.now_ms - data.draw(st.integers(0, 10**9))
    assert (
        tick(
            run.state,
            run.wf,
            inputs.results,
            inputs.signals,
            inputs.now_ms,
            passed,
            started=started,
        )
        == plain
    )


def test_a_new_run_started_for_later_starts_at_its_time() -> None:
    wf = parse_workflow({"name": "w", "version": 1, "steps": [{"name": "a", "type": "a"}]})
    state = initial_state(wf)
    assert tick(state, wf, (), (), 999, not_before_ms=1_000) == NOOP
    started = tick(state, wf, (), (), 1_000, not_before_ms=1_000)
    assert started.new_state is not None and started.new_state.status is RunStatus.RUNNING
    cancelled = tick(state, wf, (), [SignalKind.CANCEL], 0, not_before_ms=1_000)
    assert cancelled.new_state is not None
    assert cancelled.new_state.status is RunStatus.CANCELLED
