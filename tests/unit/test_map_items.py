"""A map's items out of its run's state (core/tick.py, rule 6): a Hypothesis walk of a map run
through a world of workers that answers late, twice, in any order or not at all, with
timeouts, cancels, force-fails and `runs retry` resumes: the same inputs decide the same, a
committed state ticked again is a no-op, the state never holds more items than the map's
parallelism and reads back from its row as it was, each item leaves the state (recorded)
once, with the attempt that succeeded, ended runs absorb everything, and a run driven on
ends succeeded with every item recorded. Then examples: rows written while every item was a
node, a failure in the tick that took items out, and the items `ductor inspect` shows."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.model import SignalKind, StepOutcome, StepResult
from processor.core.run_ends import force_fail, resume_failed
from processor.core.run_state import (
    MapProgress,
    NodeStatus,
    RunState,
    RunStatus,
    initial_state,
    row_checksum,
    shown_nodes,
    state_checksum,
    state_from_row,
)
from processor.core.tick import tick
from processor.core.tick_decision import NOOP, Decision
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef


def _workflow(parallelism: int, attempts: int) -> WorkflowDef:
    return parse_workflow(
        {
            "name": "images",
            "version": 1,
            "steps": [
                {"name": "list", "type": "list"},
                {
                    "name": "m",
                    "kind": "map",
                    "type": "resize",
                    "items_from": "list",
                    "depends_on": ["list"],
                    "parallelism": parallelism,
                    "retry": {"max_attempts": attempts, "backoff_ms": 5},
                    "timeout_ms": 100,
                },
                {"name": "pub", "type": "publish", "depends_on": ["m"]},
            ],
        }
    )


class _World:
    """The run as the store keeps it, and the workers: every result ever recorded (one per
    (node, attempt)), the attempts sent and not answered yet, and what the commits recorded."""

    def __init__(self, wf: WorkflowDef, length: int) -> None:
        self.wf = wf
        self.length = length
        self.state = initial_state(wf)
        self.results: dict[tuple[str, int], StepResult] = {}
        self.sent: list[tuple[str, int]] = []
        self.recorded: dict[int, int] = {}  # item index -> attempt (eec_map_item)
        self.mapped: list[tuple[str, int, int]] = []
        self.cancelled = False
        self.now = 1_000

    def answer(self, node: str, attempt: int, ok: bool) -> None:
        length = self.length if node == "list" else None
        outcome = StepOutcome.SUCCEEDED if ok else StepOutcome.FAILED
        result = StepResult(node, attempt, outcome, None if ok else "no", True, length)
        self.results.setdefault((node, attempt), result)

    def tick(self) -> Decision:
        signals = [SignalKind.CANCEL] if self.cancelled else []
        results = list(self.results.values())
        decision = tick(self.state, self.wf, results, signals, self.now)
        assert decision == tick(self.state, self.wf, results[::-1], signals, self.now)
        if decision.new_state is not None:
            self.commit(decision)
            again = tick(self.state, self.wf, results, signals, self.now)
            assert again == NOOP or self.state.status is RunStatus.PENDING
        return decision

    def commit(self, decision: Decision) -> None:
        new = decision.new_state
        assert new is not None
        for step, index, attempt in decision.items_done:
            assert step == "m" and index not in self.recorded  # once
            assert self.results[(f"m[{index}]", attempt)].outcome is StepOutcome.SUCCEEDED
            self.recorded[index] = attempt
        self.mapped += decision.mapped
        self.sent += [(d.node, d.attempt) for d in decision.dispatches]
        items = [n for n, _ in new.nodes if n.startswith("m[")]
        assert len(items) <= self.wf.step("m").parallelism  # never the list
        assert not set(items) & {f"m[{i}]" for i in self.recorded}
        nodes = new.nodes_json()
        read = state_from_row(new.status, nodes, new.seq, new.reason, self.wf)
        assert read == new
        assert row_checksum(new.status, nodes, new.seq, new.reason) == state_checksum(new)
        self.state = new


@settings(max_examples=200, deadline=None)
@given(
    parallelism=st.integers(1, 3),
    attempts=st.integers(1, 3),
    length=st.integers(0, 7),
    seed=st.integers(0, 2**32 - 1),
    moves=st.lists(st.integers(0, 9), max_size=60),
)
def test_items_leave_the_state_once_across_failures_cancels_and_resumes(
    parallelism: int, attempts: int, length: int, seed: int, moves: list[int]
) -> None:
    rng = random.Random(seed)
    world = _World(_workflow(parallelism, attempts), length)
    world.tick()
    live_at_cancel = False  # the run had not ended when its cancel came
    for move in moves:
        if move <= 4 and world.sent:  # an answer, late or not, maybe a second time
            node, attempt = rng.choice(world.sent)
            world.answer(node, attempt, rng.random() < 0.8)
        elif move == 5:
            world.now += rng.choice([1, 50, 150])  # a retry due, a deadline passed
        elif move == 6 and rng.random() < 0.2 and not world.cancelled:
            world.cancelled = True
            live_at_cancel = not world.state.status.terminal
        elif move == 7 and rng.random() < 0.2 and (failed := force_fail(world.state, "stuck")):
            world.state = failed
        elif move == 8 and world.state.status is RunStatus.FAILED:
            world.state = resume_failed(world.state)
        ended = world.state.status.terminal
        decision = world.tick()
        if ended:
            assert decision == NOOP  # absorbing
    if world.cancelled:  # it ended cancelled, unless it had ended before
        assert world.state.status.terminal
        assert world.state.status is RunStatus.CANCELLED or not live_at_cancel
        return
    # Driven on: every attempt answered, retried runs resumed, until it ends succeeded.
    for _ in range(40):
        if world.state.status is RunStatus.FAILED:
            world.state = resume_failed(world.state)
        for node, attempt in world.sent:
            world.answer(node, attempt, True)
        world.now += 150
        world.tick()
        if world.state.status is RunStatus.SUCCEEDED:
            break
    assert world.state.status is RunStatus.SUCCEEDED
    assert sorted(world.recorded) == list(range(length))  # every item, once
    assert [(n, k) for n, _, k in world.mapped] == [("m", length)]


WF = _workflow(2, 2)


def test_a_row_from_when_every_item_was_a_node_reads_and_goes_on() -> None:
    old_row = {
        "list": {"status": "succeeded", "attempt": 1},
        "m": {"status": "dispatched", "attempt": 1},
        "m[0]": {"status": "succeeded", "attempt": 1},
        "m[1]": {"status": "dispatched", "attempt": 1, "due_ms": 500},
        "m[2]": {"status": "pending", "attempt": 0},
        "pub": {"status": "pending", "attempt": 0},
    }
    state = state_from_row("running", old_row, 3, None, WF)
    assert state.maps == (("m", MapProgress(3, 3)),)  # every item counted as started
    # The row's checksum is the one it was written with; the state's is the new form's.
    assert state_checksum(state) != row_checksum("running", old_row, 3, None)
    results = [StepResult("m[1]", 1, StepOutcome.SUCCEEDED)]
    decision = tick(state, WF, results, (), 100)
    assert decision.items_done == (("m", 0, 1), ("m", 1, 1))  # recorded now
    assert [(d.node, d.attempt) for d in decision.dispatches] == [("m[2]", 1)]
    assert decision.new_state is not None
    assert [n for n, _ in decision.new_state.nodes] == ["list", "m", "m[2]", "pub"]


def test_a_failure_in_the_tick_that_took_items_out_keeps_them_recorded() -> None:
    wf = parse_workflow(
        {
            "name": "two",
            "version": 1,
            "steps": [
                {"name": "a", "kind": "map", "type": "t"},
                {"name": "list", "type": "list"},
                {"name": "b", "kind": "map", "type": "t", "items_from": "list",
                 "depends_on": ["list"]},
            ],
        }
    )  # fmt: skip
    first = tick(initial_state(wf), wf, (), (), 0, input_length=1).new_state
    assert first is not None
    # Item a[0] succeeds in the tick whose list is not one: the run fails, a's item recorded.
    results = [
        StepResult("a[0]", 1, StepOutcome.SUCCEEDED),
        StepResult("list", 1, StepOutcome.SUCCEEDED, length=None),
    ]
    decision = tick(first, wf, results, (), 10, input_length=1)
    assert decision.new_state is not None and decision.new_state.status is RunStatus.FAILED
    assert decision.items_done == (("a", 0, 1),)
    assert decision.mapped == (("a", 1, 1),)  # map a ended: its output is recorded too
    assert decision.new_state.maps == (("a", MapProgress(1, 1)),)


def test_inspect_shows_every_item_recorded_in_the_state_or_not_started() -> None:
    state = RunState(
        RunStatus.RUNNING,
        (
            ("list", initial_state(WF).node("list")._replace(status=NodeStatus.SUCCEEDED)),
            ("m", initial_state(WF).node("m")._replace(status=NodeStatus.DISPATCHED)),
            ("m[2]", initial_state(WF).node("m")._replace(status=NodeStatus.RETRY_WAIT)),
            ("pub", initial_state(WF).node("pub")),
        ),
        4,
        None,
        (("m", MapProgress(5, 3)),),
    )
    shown = shown_nodes(state, {("m", 0): 1, ("m", 1): 2})
    assert [(n, s.status.value, s.attempt) for n, s in shown] == [
        ("list", "succeeded", 0),
        ("m", "dispatched", 0),
        ("m[0]", "succeeded", 1),
        ("m[1]", "succeeded", 2),
        ("m[2]", "retry_wait", 0),
        ("m[3]", "pending", 0),
        ("m[4]", "pending", 0),
        ("pub", "pending", 0),
    ]
