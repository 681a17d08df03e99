"""Tags set by steps (``ctx.tag``): the bounds a step meets (any key and value within them is
kept and reaches the statement that records the result; beyond them ``ctx.tag`` raises), what
is recorded (a success's tags only), how they cross the pipe of process isolation, and the
database's bound, which must be the core's."""

from __future__ import annotations

import multiprocessing
import re
import threading
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.client import InvalidArgument, list_runs
from processor.core.bounds import MAX_STEP_TAGS, MAX_TAG_VALUE, TAG_KEY
from processor.core.model import StepOutcome
from processor.core.run_search import step_tag_problem
from processor.core.step_task import StepData, StepTask
from processor.io.config.settings import load_settings
from processor.io.postgres.run_tags import tags_condition
from processor.io.postgres.step_data import results_param
from processor.worker.handles import StepHandle
from processor.worker.isolation import _ChildHandle
from processor.worker.lane_batches import result_row
from processor.worker.messages import ToRecord
from processor.worker.results import kept_tags
from processor.worker.steps import (
    AttemptResult,
    StepContext,
    StepRegistry,
    execute_step,
)
from processor.worker.tasks import Task

MIGRATION = Path(__file__).parents[2] / "schemas" / "migrations" / "0045_run_tags.sql"

keys = st.from_regex(TAG_KEY, fullmatch=True)
values = st.text(
    st.characters(exclude_categories=["Cs"], exclude_characters="\x00"),
    max_size=MAX_TAG_VALUE,
)


def _context(handle: StepHandle) -> StepContext:
    return StepContext("run-1", "node", 1, 2**40, {}, _handle=handle)


def _task() -> Task:
    return Task(StepTask("run-1", "node", 1, "tagging", 10**13), ("steps", 0), 0, [], None)


@given(st.dictionaries(keys, values, max_size=MAX_STEP_TAGS))
def test_any_tags_within_the_bounds_are_kept_and_reach_the_result_s_statement(
    tags: dict[str, str],
) -> None:
    handle = StepHandle(2**40)
    ctx = _context(handle)
    for key, value in tags.items():
        ctx.tag(key, value)
    assert handle.tags == tags
    task = _task()
    task.handle.tags.update(handle.tags)
    success = AttemptResult(StepOutcome.SUCCEEDED, {})
    row = result_row(ToRecord(task, success, True, None, kept_tags(task, success)))
    (sent,) = orjson.loads(results_param([row]))
    assert sent.get("tags", {}) == tags


@given(keys, values, values)
def test_a_key_set_again_takes_its_latest_value_and_no_room(
    key: str, first: str, last: str
) -> None:
    handle = StepHandle(2**40)
    ctx = _context(handle)
    for i in range(MAX_STEP_TAGS - 1):
        ctx.tag(f"other{i}", "v")
    ctx.tag(key, first)
    ctx.tag(key, last)
    assert handle.tags[key] == last and len(handle.tags) <= MAX_STEP_TAGS


@given(st.text(max_size=80).filter(lambda k: not TAG_KEY.fullmatch(k)))
def test_a_key_beyond_the_bounds_is_refused(key: str) -> None:
    handle = StepHandle(2**40)
    with pytest.raises(ValueError, match="tag name"):
        _context(handle).tag(key, "v")
    assert handle.tags == {}


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("x" * (MAX_TAG_VALUE + 1), "at most 200 characters"),
        ("a\x00b", "at most 200 characters"),
        ("\ud800", "lone surrogate"),
        (42, "at most 200 characters"),
    ],
)
def test_a_value_beyond_the_bounds_is_refused(value: object, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        _context(StepHandle(2**40)).tag("k", value)  # type: ignore[arg-type]


def test_a_key_that_is_not_a_string_is_refused() -> None:
    assert step_tag_problem(["k"], "v", {}) == "a tag's name is a string, not list"


def test_the_17th_key_of_an_attempt_fails_it_saying_so_and_keeps_the_first_16() -> None:
    registry = StepRegistry()

    @registry.step("many")
    def many(ctx: StepContext) -> object:
        for i in range(MAX_STEP_TAGS + 1):
            ctx.tag(f"k{i}", "v")
        return None

    handle = StepHandle(2**40)
    result = execute_step(registry, StepTask("r", "n", 1, "many", 2**40), StepData({}), handle)
    assert result.outcome is StepOutcome.FAILED and result.error_type == "ValueError"
    assert result.error == (
        "ValueError: a run keeps at most 16 tags set by its steps: this attempt set 16 already"
        f" ({', '.join(sorted(f'k{i}' for i in range(16)))}), so not 'k16' too"
    )
    assert len(handle.tags) == MAX_STEP_TAGS


def test_only_a_success_records_its_tags() -> None:
    task = _task()
    task.handle.tag("customer", "c-42")
    assert kept_tags(task, AttemptResult(StepOutcome.SUCCEEDED, 1)) == (("customer", "c-42"),)
    failed = AttemptResult.failed("no")
    assert kept_tags(task, failed) == ()
    row = result_row(ToRecord(task, failed, True, None, (("customer", "c-42"),)))
    assert row.tags is None


def test_a_context_without_a_handle_checks_and_keeps_nothing() -> None:
    ctx = StepContext("run-1", "node", 1, 2**40)
    ctx.tag("customer", "c-42")
    with pytest.raises(ValueError, match="tag name"):
        ctx.tag("", "v")


def test_tags_set_in_a_child_process_are_sent_to_the_worker() -> None:
    ours, theirs = multiprocessing.Pipe(duplex=True)
    handle = _ChildHandle(2**40, None, theirs, threading.Lock())
    _context(handle).tag("customer", "c-42")
    assert ours.poll(5) and ours.recv() == ("tag", "customer", "c-42")
    assert handle.tags == {"customer": "c-42"}


def test_the_database_holds_the_core_s_bounds() -> None:
    sql = MIGRATION.read_text()
    assert f"IF kept > {MAX_STEP_TAGS} THEN" in sql
    assert f"char_length(value) <= {MAX_TAG_VALUE}" in sql
    assert f"CHECK (key ~ '^{TAG_KEY.pattern}$')" in sql
    assert re.search(rf"keeps at most {MAX_STEP_TAGS} tags set by its steps", sql)


def test_the_search_condition_uses_both_kinds_of_tags() -> None:
    condition, params = tags_condition("r", [("customer", "c-42"), ("region", "eu")])
    assert "r.tags @> %(tags)s::jsonb" in condition and "eec_run_tag" in condition
    assert orjson.loads(params.pop("tags")) == {"customer": "c-42", "region": "eu"}
    assert params == {
        "tag_key_0": "customer",
        "tag_value_0": "c-42",
        "tag_key_1": "region",
        "tag_value_1": "eu",
    }


def test_list_runs_refuses_tags_beyond_the_bounds_before_connecting() -> None:
    with pytest.raises(InvalidArgument, match="tag name"):
        list_runs(load_settings(), tags={"bad key": "v"})
