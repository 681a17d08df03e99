"""Conditions and skips in the tick (core/skips.py, core/tick.py rule 6a), the parser's checks
of ``when`` and ``run_if``, what a skipped step leaves out of the data of the steps after it
and of the run's output, what the load asks for (io/postgres/selected.py's ``wanted``), and
the properties: a skipped node stays skipped, ticks are deterministic under duplicate inputs,
a condition never makes the tick raise whatever the JSON, skips propagate unless all_done."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.dataflow import dependency_attempts, output_refs
from processor.core.model import LoadedRun, StepOutcome, StepResult
from processor.core.run_state import NodeStatus, RunState, RunStatus, initial_state, state_checksum
from processor.core.selectors import Selected, resolve
from processor.core.tick import tick
from processor.core.tick_decision import NOOP, Decision
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import ValidationError, WorkflowDef
from processor.io.postgres.selected import wanted
from processor.io.shipped.workflow_schema import workflow_validator

OK = StepOutcome.SUCCEEDED
SKIPPED, PENDING = NodeStatus.SKIPPED, NodeStatus.PENDING

BRANCH = parse_workflow(
    {
        "name": "branch",
        "version": 1,
        "steps": [
            {"name": "check", "type": "check"},
            {"name": "big", "type": "big", "depends_on": ["check"], "when": "$.input.n > 100"},
            {"name": "small", "type": "small", "depends_on": ["check"], "when": "$.input.n <= 100"},
            {"name": "join", "type": "join", "depends_on": ["big", "small"], "run_if": "all_done"},
        ],
        "output": {"big": "big", "small": "small", "join": "join"},
    }
)


def _selected(wf: WorkflowDef, run_input: Any, outputs: dict[str, Any]) -> dict[str, Selected]:
    """What the load reads for ``wf``'s selectors in such a run (a step's output once it is
    recorded: in ``outputs``)."""
    found: dict[str, Selected] = {}
    for step in wf.selects:
        for selector in step.selectors:
            if selector.step is None or selector.step in outputs:
                found[selector.text] = resolve(selector, run_input, outputs)
    return found


def _after_check(wf: WorkflowDef, run_input: Any, output: Any = None) -> Decision:
    started = tick(initial_state(wf), wf, (), (), 0).new_state
    assert started is not None
    selected = _selected(wf, run_input, {"check": output})
    return tick(started, wf, [StepResult("check", 1, OK)], (), 10, selected=selected)


@pytest.mark.parametrize(("n", "runs", "skipped"), [(500, "big", "small"), (7, "small", "big")])
def test_a_branch_on_the_input_runs_one_side_and_skips_the_other(
    n: int, runs: str, skipped: str
) -> None:
    decision = _after_check(BRANCH, {"n": n})
    assert decision.new_state is not None
    assert [d.node for d in decision.dispatches] == [runs]
    assert decision.new_state.node(skipped).status is SKIPPED
    assert decision.new_state.node("join").status is PENDING
    # The side that ran ends: the join (all_done) runs, reading only the side that ran.
    after = tick(decision.new_state, BRANCH, [StepResult(runs, 1, OK)], (), 20)
    assert after.new_state is not None
    assert [d.node for d in after.dispatches] == ["join"]
    nodes = after.new_state.node_map()
    assert dependency_attempts(BRANCH.step_map["join"], nodes) == ((runs, 1),)
    done = tick(after.new_state, BRANCH, [StepResult("join", 1, OK)], (), 30)
    assert done.new_state is not None and done.new_state.status is RunStatus.SUCCEEDED
    assert done.new_state.node(skipped).status is SKIPPED  # kept as it was
    refs = output_refs(BRANCH, done.new_state)
    assert refs is not None and {k for k, _, _ in refs.refs} == {runs, "join"}  # absent


def test_a_step_whose_dependencies_were_all_skipped_is_skipped_unless_all_done() -> None:
    chain = parse_workflow(
        {
            "name": "chain",
            "version": 1,
            "steps": [
                {"name": "check", "type": "t"},
                {"name": "a", "type": "t", "depends_on": ["check"], "when": "$.input.go"},
                # listed before its dependency: the judging goes on until nothing more skips
                {"name": "c", "type": "t", "depends_on": ["b"]},
                {"name": "b", "type": "t", "depends_on": ["a"]},
                {"name": "d", "type": "t", "depends_on": ["c"], "run_if": "all_done"},
            ],
        }
    )
    decision = _after_check(chain, {"go": False})
    assert decision.new_state is not None
    status = {n: s.status for n, s in decision.new_state.nodes}
    assert (status["a"], status["b"], status["c"]) == (SKIPPED, SKIPPED, SKIPPED)
    assert [d.node for d in decision.dispatches] == ["d"]  # all_done: it runs
    ended = tick(decision.new_state, chain, [StepResult("d", 1, OK)], (), 20)
    assert ended.new_state is not None and ended.new_state.status is RunStatus.SUCCEEDED


def test_a_condition_reads_a_dependency_s_output_and_waits_for_it_to_be_read() -> None:
    wf = parse_workflow(
        {
            "name": "score",
            "version": 1,
            "steps": [
                {"name": "check", "type": "t"},
                {
                    "name": "review",
                    "type": "t",
                    "depends_on": ["check"],
                    "when": '$.steps.check.output.verdict == "unsure"',
                },
            ],
        }
    )
    started = tick(initial_state(wf), wf, (), (), 0).new_state
    assert started is not None
    # The load did not read the output (not asked, or not recorded yet): held, timer for now.
    held = tick(started, wf, [StepResult("check", 1, OK)], (), 10, selected={})
    assert held.new_state is not None and held.new_state.node("review").status is PENDING
    assert held.dispatches == () and held.timers == (10,)
    for verdict, status in (("unsure", NodeStatus.DISPATCHED), ("fine", SKIPPED)):
        found = _selected(wf, None, {"check": {"verdict": verdict}})
        judged = tick(held.new_state, wf, (), (), 20, selected=found)
        assert judged.new_state is not None
        assert judged.new_state.node("review").status is status
    # Skipped, the run has nothing left: it succeeded.
    found = _selected(wf, None, {"check": {"verdict": "fine"}})
    judged = tick(held.new_state, wf, (), (), 20, selected=found)
    assert judged.new_state is not None and judged.new_state.status is RunStatus.SUCCEEDED


def test_a_skipped_step_s_output_is_missing_for_conditions_and_absent_as_a_source() -> None:
    wf = parse_workflow(
        {
            "name": "sources",
            "version": 1,
            "steps": [
                {"name": "check", "type": "t"},
                {"name": "maybe", "type": "t", "depends_on": ["check"], "when": "false"},
                {
                    "name": "after",
                    "type": "t",
                    "depends_on": ["maybe", "check"],
                    "when": "not $.steps.maybe.output",
                },
                {"name": "items", "kind": "map", "type": "t", "depends_on": ["maybe", "check"]}
                | {"items_from": "maybe"},
            ],
        }
    )
    decision = _after_check(wf, {})
    assert decision.new_state is not None
    assert decision.new_state.node("maybe").status is SKIPPED
    assert [d.node for d in decision.dispatches] == ["after"]  # missing: "not" holds
    assert decision.new_state.node("items").status is SKIPPED  # its list is absent


def test_a_workflow_without_conditions_takes_the_fast_path_and_asks_nothing_more() -> None:
    plain = parse_workflow({"name": "p", "version": 1, "steps": [{"name": "a", "type": "t"}]})
    assert plain.only_tasks and not plain.decides and plain.selects == ()
    assert not BRANCH.only_tasks and BRANCH.decides
    state = initial_state(plain)
    run = LoadedRun("r", plain, state, 1, "t1", stored_checksum=state_checksum(state))
    assert wanted(run) == []


def test_the_load_asks_each_selector_once_and_only_when_a_step_is_about_to_be_judged() -> None:
    state = initial_state(BRANCH)

    def asked(state: RunState) -> list[str]:
        run = LoadedRun("r", BRANCH, state, 1, "t1", stored_checksum=state_checksum(state))
        return [q["key"] for q in wanted(run)]

    assert asked(state) == []  # check has not started: big and small cannot start now
    started = tick(state, BRANCH, (), (), 0).new_state
    assert started is not None
    assert asked(started) == ["$.input.n"]  # check in flight: it may end in this tick
    judged = _after_check(BRANCH, {"n": 1}).new_state
    assert judged is not None and asked(judged) == []  # nothing left to judge


@pytest.mark.parametrize(
    ("step", "said"),
    [
        ({"when": "$.input.x >"}, "workflow.steps[1].when (step 'b'): expected a value"),
        ({"when": "$.steps.c.output.x"}, "reads the output of 'c', which is not one of"),
        ({"when": 5}, "expected a condition (str)"),
        ({"run_if": "always"}, "must be 'all_done'"),
        ({"when": "__import__('os')"}, "unknown word '__import__'"),
    ],
)
def test_a_bad_condition_is_refused_at_registration_naming_the_step(
    step: dict[str, Any], said: str
) -> None:
    raw = {
        "name": "w",
        "version": 1,
        "steps": [
            {"name": "a", "type": "t"},
            {"name": "b", "type": "t", "depends_on": ["a"]} | step,
            {"name": "c", "type": "t"},
        ],
    }
    with pytest.raises(ValidationError) as refused:
        parse_workflow(raw)
    assert said in str(refused.value)


def test_conditions_are_written_back_and_the_schema_takes_them() -> None:
    written = workflow_to_json(BRANCH)
    assert written["steps"][1]["when"] == "$.input.n > 100"
    assert written["steps"][3]["run_if"] == "all_done"
    assert "when" not in written["steps"][0] and "run_if" not in written["steps"][1]
    assert list(workflow_validator().iter_errors(written)) == []
    assert parse_workflow(written) == BRANCH


# -- properties -------------------------------------------------------------------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False)
    | st.text(max_size=3),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from("xyv"), inner),
    max_leaves=6,
)
_INPUT_CONDITIONS = [
    "$.input.x > 0",
    "$.input.y",
    '$.input.x in [1, 2, "a"]',
    "not $.input.v == null",
    "$.input.x[0] <= $.input.y",
]


@st.composite
def _workflows(draw: st.DrawFn) -> WorkflowDef:
    """A small DAG of task steps, some with conditions on the input or a dependency's
    output, some ``run_if: all_done``, listed in a shuffled order."""
    count = draw(st.integers(1, 6))
    steps: list[dict[str, Any]] = []
    for i in range(count):
        deps = draw(st.lists(st.sampled_from(range(i)), unique=True, max_size=3)) if i else []
        step: dict[str, Any] = {"name": f"s{i}", "type": "t", "depends_on": [f"s{d}" for d in deps]}
        choices = _INPUT_CONDITIONS + [f"$.steps.s{d}.output.v == 1" for d in deps]
        if draw(st.booleans()):
            step["when"] = draw(st.sampled_from(choices))
        if draw(st.booleans()):
            step["run_if"] = "all_done"
        steps.append(step)
    order = draw(st.permutations(steps))
    return parse_workflow({"name": "p", "version": 1, "steps": list(order)})


@settings(max_examples=300, deadline=None)
@given(_workflows(), _JSON, st.lists(_JSON, min_size=6, max_size=6), st.lists(st.booleans()))
def test_runs_with_conditions_end_skips_hold_and_ticks_are_deterministic(
    wf: WorkflowDef, run_input: Any, outputs: list[Any], loads: list[bool]
) -> None:
    state = initial_state(wf)
    results: list[StepResult] = []
    recorded: dict[str, Any] = {}
    skipped: set[str] = set()
    dispatched: set[str] = set()
    for i in range(40):
        # Some loads read nothing (the load did not ask): the tick must hold, never guess.
        read = loads[i % len(loads)] if loads else True
        selected = _selected(wf, run_input, recorded) if read or i > 20 else {}
        duplicates = results + results[:1]  # a result delivered twice changes nothing
        decision = tick(state, wf, results, (), 10 * i, selected=selected)
        assert tick(state, wf, duplicates, (), 10 * i, selected=dict(selected)) == decision
        if decision == NOOP:
            continue
        assert decision.new_state is not None
        state = decision.new_state
        nodes = state.node_map()
        assert skipped <= {n for n, s in nodes.items() if s.status is SKIPPED}  # stays skipped
        skipped = {n for n, s in nodes.items() if s.status is SKIPPED}
        for d in decision.dispatches:
            assert d.node not in skipped
            dispatched.add(d.node)
            results.append(StepResult(d.node, d.attempt, OK))
            recorded[d.node] = outputs[int(d.node[1:])]
        for step in wf.steps:
            deps = [nodes[d].status for d in step.depends_on]
            if nodes[step.name].status is not PENDING and deps:
                all_skipped = all(s is SKIPPED for s in deps)
                if all_skipped and step.run_if is None:
                    assert nodes[step.name].status is SKIPPED  # skips propagate
                if step.name in dispatched:
                    assert not all_skipped or step.run_if == "all_done"
        if state.status.terminal:
            break
    assert state.status is RunStatus.SUCCEEDED  # every task answered: the run ends
    assert skipped.isdisjoint(dispatched)  # a skipped step never ran


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([*_INPUT_CONDITIONS, "$.steps.a.output.v > 1"]), _JSON, _JSON)
def test_a_condition_never_makes_the_tick_raise_whatever_the_json(
    condition: str, run_input: Any, output: Any
) -> None:
    wf = parse_workflow(
        {
            "name": "c",
            "version": 1,
            "steps": [
                {"name": "a", "type": "t"},
                {"name": "b", "type": "t", "depends_on": ["a"], "when": condition},
            ],
        }
    )
    decision = _after_check_named(wf, run_input, output)
    assert decision.new_state is not None
    assert decision.new_state.node("b").status in (SKIPPED, NodeStatus.DISPATCHED)


def _after_check_named(wf: WorkflowDef, run_input: Any, output: Any) -> Decision:
    started = tick(initial_state(wf), wf, (), (), 0).new_state
    assert started is not None
    selected = _selected(wf, run_input, {"a": output})
    return tick(started, wf, [StepResult("a", 1, OK)], (), 10, selected=selected)
