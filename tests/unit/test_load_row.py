"""The load's row read by name (core/load_row.py): the statement builds exactly the fields of
``LoadRow``, and the loaded run takes each field from the field of its name."""

from __future__ import annotations

from typing import Any

from processor.core.load_row import LoadRow, loaded_run
from processor.core.model import (
    LoadedRun,
    ParentLink,
    RunInput,
    SignalKind,
    Started,
    StepOutcome,
    StepResult,
    UnreadableRun,
)
from processor.core.run_state import NodeStatus, initial_state, node_state, state_checksum
from processor.core.workflow import parse_workflow
from processor.io.postgres.load_sql import LOAD_SQL as _LOAD_SQL

WF = parse_workflow(
    {
        "name": "row",
        "version": 2,
        "steps": [
            {"name": "a", "type": "a"},
            {"name": "w", "kind": "wait", "signal": "go", "depends_on": ["a"]},
        ],
    }
)


def _top_level_arguments(sql: str, call: str) -> int:
    """How many arguments the first ``call(`` of ``sql`` has (commas outside parentheses and
    quotes)."""
    start = sql.index(call + "(") + len(call) + 1
    depth, count, quoted = 0, 1, False
    for char in sql[start:]:
        if char == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif char == "(":
            depth += 1
        elif char == ")":
            if depth == 0:
                return count
            depth -= 1
        elif char == "," and depth == 0:
            count += 1
    raise AssertionError(f"{call}( is not closed")


def test_the_load_statement_builds_the_fields_of_the_row() -> None:
    assert _top_level_arguments(_LOAD_SQL, "json_build_array") == len(LoadRow._fields)


def _row(**fields: Any) -> LoadRow:
    state = initial_state(WF)
    nodes = state.with_nodes({"a": node_state(NodeStatus.DISPATCHED, 1), "w": node_state()})
    values: dict[str, Any] = {
        "run_id": "r-1",
        "workflow_name": "row",
        "workflow_version": 2,
        "status": "pending",
        "node_states": nodes.nodes_json(),
        "seq": 0,
        "checksum": state_checksum(nodes),
        "version": 7,
        "reason": None,
        "tier": "t0",
        "results": [["a", 1, "succeeded", None, True, 3]],
        "signals": [["go", "s-1"], ["cancel", "s-2"]],
        "input": [None],
        "not_before_ms": 1_000,
        "parent": ["p-1", "child", 2],
        "input_length": 3,
        "starts": [["a", 1, 500, 600, True]],
    }
    # Built as the load builds it: a list in the statement's order.
    return LoadRow(*(values | fields).values())


def test_each_field_of_the_loaded_run_comes_from_its_field_of_the_row() -> None:
    row = _row()
    assert row.workflow == ("row", 2)
    run = loaded_run(row, WF)
    assert isinstance(run, LoadedRun)
    assert (run.run_id, run.version, run.tier, run.stored_checksum) == (
        "r-1",
        7,
        "t0",
        row.checksum,
    )
    assert run.checksum_ok
    assert run.state.node("a") == node_state(NodeStatus.DISPATCHED, 1)
    assert run.results == (StepResult("a", 1, StepOutcome.SUCCEEDED, None, True, 3),)
    assert run.signals == frozenset({SignalKind.CANCEL})
    assert run.named == (("go", "s-1"),)
    assert run.input == RunInput(None)
    assert (run.not_before_ms, run.input_length) == (1_000, 3)
    assert run.parent == ParentLink("p-1", "child", 2)
    assert run.starts == (("a", Started(1, 500, 600, True)),)


def test_what_a_row_may_lack_is_none_in_the_loaded_run() -> None:
    run = loaded_run(
        _row(results=None, signals=None, input=None, parent=None, starts=None, checksum="x"),
        WF,
    )
    assert isinstance(run, LoadedRun)
    assert (run.results, run.signals, run.named) == ((), frozenset(), ())
    assert (run.input, run.parent, run.starts) == (None, None, None)
    assert not run.checksum_ok


def test_a_state_that_does_not_parse_is_an_unreadable_run_with_its_version() -> None:
    unreadable = loaded_run(_row(node_states={"a": {"status": "bogus"}}), WF)
    assert isinstance(unreadable, UnreadableRun)
    assert unreadable.version == 7
    assert "r-1" in str(unreadable)
