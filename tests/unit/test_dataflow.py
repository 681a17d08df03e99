"""Data between steps and a run's declared output, as the tick's commits carry them
(processor/core/dataflow.py, decide.py ``tick_batch``)."""

from __future__ import annotations

from dataclasses import replace

import orjson
from hypothesis import given

from processor.core.dataflow import OutputRefs, data_at_hand, dependency_attempts, output_refs
from processor.core.decide import tick_batch
from processor.core.model import LoadedRun, RunInput, StepOutcome, StepResult
from processor.core.run_state import (
    NodeState,
    NodeStatus,
    RunState,
    RunStatus,
    initial_state,
    state_checksum,
)
from processor.core.step_task import StepData, decode_step_task
from processor.core.tick import tick
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef, WorkflowOutput

from .fakes import NAMES, NOW_MS
from .strategies import FAST, Run, TickInputs, runs, tick_inputs

DIAMOND: WorkflowDef = parse_workflow(
    {
        "name": "diamond",
        "version": 1,
        "steps": [
            {"name": "a", "type": "t"},
            {"name": "b", "type": "t", "depends_on": ["a"]},
            {"name": "c", "type": "t", "depends_on": ["a"]},
            {"name": "d", "type": "t", "depends_on": ["c", "b"]},
        ],
        "output": {"total": "d", "first": "a"},
    }
)
S = NodeStatus


def _run(state: RunState, wf: WorkflowDef = DIAMOND, **fields: object) -> LoadedRun:
    return LoadedRun("r", wf, state, 1, "t1", stored_checksum=state_checksum(state), **fields)  # type: ignore[arg-type]


def _state(status: RunStatus, **nodes: NodeState) -> RunState:
    return RunState(status, tuple((s.name, nodes.get(s.name, NodeState())) for s in DIAMOND.steps))


def test_a_dispatch_names_the_attempts_of_its_dependencies_that_succeeded() -> None:
    nodes = {"b": NodeState(S.SUCCEEDED, 3), "c": NodeState(S.SUCCEEDED, 1)}
    assert dependency_attempts(DIAMOND.step_map["d"], nodes) == (("c", 1), ("b", 3))
    assert dependency_attempts(DIAMOND.step_map["a"], nodes) == ()


def test_only_a_loaded_input_for_a_step_without_dependencies_is_at_hand() -> None:
    state = initial_state(DIAMOND)
    with_input = _run(state, input=RunInput({"k": 1}))
    assert data_at_hand(with_input, DIAMOND.step_map["a"]) == StepData({"k": 1})
    assert data_at_hand(with_input, DIAMOND.step_map["b"]) is None  # outputs are never loaded
    assert data_at_hand(_run(state), DIAMOND.step_map["a"]) is None  # input not loaded
    assert data_at_hand(_run(state, input=RunInput(None)), DIAMOND.step_map["a"]) == StepData(None)


def test_the_output_of_a_succeeded_run_names_the_applied_attempts() -> None:
    done = _state(
        RunStatus.SUCCEEDED,
        a=NodeState(S.SUCCEEDED, 2),
        b=NodeState(S.SUCCEEDED, 1),
        c=NodeState(S.SUCCEEDED, 1),
        d=NodeState(S.SUCCEEDED, 4),
    )
    assert output_refs(DIAMOND, done) == OutputRefs(False, (("first", "a", 2), ("total", "d", 4)))
    single = replace(DIAMOND, output=WorkflowOutput(step="b"))
    assert output_refs(single, done) == OutputRefs(True, (("", "b", 1),))
    assert output_refs(replace(DIAMOND, output=None), done) is None
    for status in (RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.RUNNING):
        assert output_refs(DIAMOND, replace(done, status=status)) is None


def test_the_first_tick_carries_the_input_inline_to_the_first_steps() -> None:
    run = _run(initial_state(DIAMOND), input=RunInput({"order": 7}))
    commit = tick_batch({"r": run}, NOW_MS, NAMES)["r"]
    (send,) = commit.effects
    task = decode_step_task(send.value)
    assert (task.node, task.dep_attempts, task.data) == ("a", (), StepData({"order": 7}))
    assert commit.output is None


def test_a_dependent_step_names_what_to_fetch() -> None:
    state = _state(RunStatus.RUNNING, a=NodeState(S.DISPATCHED, 2, due_ms=NOW_MS + 5))
    result = StepResult("a", 2, StepOutcome.SUCCEEDED)
    run = replace(_run(state, input=RunInput({})), results=(result,))
    commit = tick_batch({"r": run}, NOW_MS, NAMES)["r"]
    tasks = [decode_step_task(s.value) for s in commit.effects]
    assert [(t.node, t.dep_attempts, t.data) for t in tasks] == [
        ("b", (("a", 2),), None),
        ("c", (("a", 2),), None),
    ]
    assert orjson.loads(commit.effects[0].value or b"")["data"] is None  # it says so


def test_the_commit_that_ends_a_run_succeeded_names_its_output() -> None:
    state = _state(
        RunStatus.RUNNING,
        a=NodeState(S.SUCCEEDED, 1),
        b=NodeState(S.SUCCEEDED, 1),
        c=NodeState(S.SUCCEEDED, 2),
        d=NodeState(S.DISPATCHED, 3, due_ms=NOW_MS + 5),
    )
    ok = replace(_run(state), results=(StepResult("d", 3, StepOutcome.SUCCEEDED),))
    commit = tick_batch({"r": ok}, NOW_MS, NAMES)["r"]
    assert commit.state.status is RunStatus.SUCCEEDED
    assert commit.output == OutputRefs(False, (("first", "a", 1), ("total", "d", 3)))
    failed = replace(_run(state), results=(StepResult("d", 3, StepOutcome.FAILED, "x"),))
    commit = tick_batch({"r": failed}, NOW_MS, NAMES)["r"]
    assert commit.state.status is not RunStatus.SUCCEEDED and commit.output is None


@FAST
@given(runs().flatmap(lambda run: tick_inputs(run).map(lambda inputs: (run, inputs))))
def test_every_commit_carries_what_its_steps_and_its_output_read(
    drawn: tuple[Run, TickInputs],
) -> None:
    run, inputs = drawn
    loaded = LoadedRun(
        "r",
        run.wf,
        run.state,
        1,
        "t1",
        inputs.results,
        frozenset(inputs.signals),
        state_checksum(run.state),
        input=RunInput({"in": 1}) if run.state.status is RunStatus.PENDING else None,
    )
    commit = tick_batch({"r": loaded}, inputs.now_ms, NAMES).get("r")
    decision = tick(run.state, run.wf, inputs.results, inputs.signals, inputs.now_ms)
    if commit is None:
        assert decision.new_state is None
        return
    new = commit.state.node_map()
    for send in commit.effects:
        if send.topic != NAMES.steps:
            continue
        task = decode_step_task(send.value)
        step = run.wf.step_map[task.node]
        # Each dependency with the attempt the state says succeeded.
        assert task.dep_attempts == tuple((d, new[d].attempt) for d in step.depends_on)
        assert all(new[d].status is S.SUCCEEDED for d in step.depends_on)
        if task.data is not None:  # inline only what was at hand: a first step's input
            assert not step.depends_on and task.data == StepData({"in": 1})
    if commit.state.status is RunStatus.SUCCEEDED and run.wf.output is not None:
        assert commit.output is not None
        declared = run.wf.output
        steps = [declared.step] if declared.step is not None else [s for _, s in declared.fields]
        assert [node for _, node, _ in commit.output.refs] == steps
        assert all(new[node].status is S.SUCCEEDED for _, node, _ in commit.output.refs)
        assert all(new[node].attempt == a for _, node, a in commit.output.refs)
    else:
        assert commit.output is None
