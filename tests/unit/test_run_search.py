"""The pure parts of searching runs: tags, filters, cursors (core/run_search.py), the SQL a
filter becomes (io/postgres/run_search.py, built without a database) and the command line's
filters."""

from __future__ import annotations

import argparse

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.cli.common import CliError
from processor.cli.search import add_filter_arguments, filter_from_args
from processor.core.run_search import MAX_TAGS, Cursor, RunFilter, parse_tags, tags_problem
from processor.core.run_state import RunStatus
from processor.io.postgres.run_search import (
    ResultFacts,
    conditions,
    count_sql,
    merge_attempts,
    search_sql,
)


def test_tags_are_a_small_flat_object_of_strings() -> None:
    assert tags_problem({"customer": "c-42", "team/area": "pay", "a.b:c-d_e": ""}) is None
    assert tags_problem(["x"]) == "tags are an object of names to strings, not list"
    assert "at most 20 tags" in str(tags_problem({f"k{i}": "v" for i in range(MAX_TAGS + 1)}))
    for key in ("", "-starts-badly", "has space", "x" * 65, "é"):
        assert "tag name" in str(tags_problem({key: "v"})), key
    assert "string of at most 200" in str(tags_problem({"k": 1}))
    assert "string of at most 200" in str(tags_problem({"k": "v" * 201}))
    assert "string of at most 200" in str(tags_problem({"k": "a\x00b"}))


def test_tags_given_on_the_command_line() -> None:
    assert parse_tags(["customer=c-42", "note=a=b", "empty="]) == {
        "customer": "c-42",
        "note": "a=b",
        "empty": "",
    }
    assert parse_tags(None) == {}
    assert parse_tags(["k=v", "k=v"]) == {"k": "v"}
    with pytest.raises(ValueError, match="a tag is KEY=VALUE"):
        parse_tags(["customer"])
    with pytest.raises(ValueError, match="given twice"):
        parse_tags(["k=1", "k=2"])


def test_a_filter_refuses_what_cannot_match() -> None:
    with pytest.raises(ValueError, match="not before its end"):
        RunFilter(since_ms=10, until_ms=10)
    with pytest.raises(ValueError, match="at least one character"):
        RunFilter(id_prefix="")
    with pytest.raises(ValueError, match="tag name"):
        RunFilter(tags=(("no space", "v"),))
    assert RunFilter().empty and not RunFilter(workflow="w").empty


def test_a_bulk_action_keeps_to_the_statuses_it_acts_on() -> None:
    live = (RunStatus.PENDING, RunStatus.RUNNING)
    assert RunFilter(workflow="w").within(live).statuses == live
    asked = RunFilter(statuses=(RunStatus.RUNNING, RunStatus.FAILED))
    assert asked.within(live).statuses == (RunStatus.RUNNING,)
    assert RunFilter(statuses=(RunStatus.FAILED,)).matches_nothing(live)
    assert not asked.matches_nothing(live) and not RunFilter().matches_nothing(live)


@given(st.integers(min_value=-(2**62), max_value=2**62), st.text(max_size=200))
def test_a_cursor_reads_back_as_written(created_us: int, run_id: str) -> None:
    cursor = Cursor(created_us, run_id)
    text = cursor.encode()
    assert text.isascii() and "=" not in text
    assert Cursor.decode(text) == cursor


@pytest.mark.parametrize("text", ["", "nonsense", "W10", "WyJ4IiwgMV0", "e30"])
def test_anything_else_is_not_a_cursor(text: str) -> None:
    with pytest.raises(ValueError, match="not a cursor this listing gave"):
        Cursor.decode(text)


def test_each_filter_is_one_condition_and_statuses_pick_the_parts_read() -> None:
    assert conditions(RunFilter()) == ([], {})
    found, params = conditions(
        RunFilter(
            workflow="w",
            since_ms=0,
            until_ms=1,
            id_prefix="a_%",
            tags=(("k", "v"),),
            step_failed="s",
        )
    )
    assert len(found) == 6
    assert params["id_prefix"] == "a\\_\\%%"  # LIKE's wildcards are the prefix's characters
    assert params["step_items"] == "s[%" and params["tags"] == '{"k":"v"}'
    every, _ = search_sql(RunFilter(), 10, None)
    assert every.count("SELECT r.run_id") == 2  # ended, live (quarantined or not)
    failed, _ = search_sql(RunFilter(statuses=(RunStatus.FAILED,)), 10, None)
    assert failed.count("SELECT r.run_id") == 1 and "r.status IN ('failed')" in failed
    live, _ = count_sql(RunFilter(statuses=(RunStatus.RUNNING,)))
    assert live.count("count(*)") == 1 and "'failed'" not in live


def test_the_timeline_merges_claims_and_results_in_order() -> None:
    rows = merge_attempts(
        {("b", 1): ("w1", "t1", 1), ("a", 2): ("w2", "t2", 2)},  # type: ignore[dict-item]
        {
            ("a", 2): ResultFacts("failed", "t3", "boom"),  # type: ignore[arg-type]
            ("c", 1): ResultFacts("succeeded", "t4", None),  # type: ignore[arg-type]
        },
    )
    assert [(r.node, r.attempt, r.worker_id, r.outcome, r.starts) for r in rows] == [
        ("a", 2, "w2", "failed", 2),
        ("b", 1, "w1", None, 1),
        ("c", 1, None, "succeeded", 0),
    ]


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_filter_arguments(parser)
    return parser.parse_args(argv)


def test_the_command_lines_filters() -> None:
    wanted = filter_from_args(
        _args("--status", "failed", "--status", "failed", "--tag", "b=2", "--tag", "a=1")
    )
    assert wanted.statuses == (RunStatus.FAILED,) and wanted.tags == (("a", "1"), ("b", "2"))
    at = filter_from_args(_args("--since", "2026-12-24T18:00:00Z"))
    assert at.since_ms == 1798135200000
    ago = filter_from_args(_args("--since", "2h", "--until", "1h"))
    assert ago.since_ms is not None and ago.until_ms is not None
    assert ago.until_ms - ago.since_ms == 3_600_000
    for argv, message in (
        (["--since", "yesterday"], "expected an ISO 8601 time"),
        (["--until", "2026-12-24T18:00:00"], "say the time's offset"),
        (["--since", "1h", "--until", "2h"], "not before its end"),
        (["--tag", "=v"], "tag name"),
    ):
        with pytest.raises(CliError, match=message):
            filter_from_args(_args(*argv))
