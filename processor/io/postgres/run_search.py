"""The statements behind `ductor runs list`, `runs count`, the bulk actions and `inspect
--output json`'s timeline. Each filter of a RunFilter (core/run_search.py) adds one condition,
and each condition is one an index of migration 0017 (or the primary key) serves:
tests/integration/test_run_search.py reads the plans. Not a hot path: no prepared statements."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

import psycopg

from processor.core.run_search import Cursor, RunFilter
from processor.core.run_state import RunStatus
from processor.core.shapes import AttemptRef, WorkflowKey
from processor.core.shown import SHOWN_CHARS, Shown, shown
from processor.io.postgres.run_counts import like_prefix
from processor.io.postgres.run_marks import flag_column
from processor.io.postgres.run_tags import merged_tags, tags_condition
from processor.io.postgres.runs_admin import RunSummary

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)

_COLUMNS = (
    "r.run_id, r.workflow_name, r.workflow_version, r.status, r.last_transition_at,"
    f" r.failure_reason, {flag_column('r', 'reason')} AS quarantine_reason, r.created_at,"
    f" {merged_tags('r')} AS tags"
)


@dataclass(frozen=True)
class RunPage:
    """One page of a listing, newest first; ``next_cursor`` continues it (None: the last)."""

    runs: list[RunSummary]
    next_cursor: Cursor | None


_ENDED = (RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED)
_LIVE = (RunStatus.PENDING, RunStatus.RUNNING)
# The two disjoint parts of the run table a search reads, each through indexes that hold it
# alone: the ended runs (migration 0017's partial indexes) and the live runs, quarantined or
# not (the watchdog's eec_workflow_run_stuck_idx; the condition on its column, true of every
# run, is there for the planner, which otherwise reads the whole table to find them). A run's
# quarantine flag is read beside it, for the rows returned (io/postgres/run_marks.py).
_PARTS: tuple[tuple[tuple[RunStatus, ...], tuple[str, ...]], ...] = (
    (_ENDED, ()),
    (_LIVE, ("r.last_transition_at < 'infinity'::timestamptz",)),
)


def conditions(wanted: RunFilter, after: Cursor | None = None) -> tuple[list[str], dict[str, Any]]:
    """The conditions on ``eec_workflow_run r`` of a search, but its statuses, and their
    parameters: one per filter given (pure)."""
    found: list[str] = []
    params: dict[str, Any] = {}
    if wanted.workflow is not None:
        found.append("r.workflow_name = %(workflow)s")
        params["workflow"] = wanted.workflow
    if wanted.since_ms is not None:
        found.append("r.created_at >= %(since)s")
        params["since"] = _EPOCH + wanted.since_ms * 1000 * _MICROSECOND
    if wanted.until_ms is not None:
        found.append("r.created_at < %(until)s")
        params["until"] = _EPOCH + wanted.until_ms * 1000 * _MICROSECOND
    if wanted.id_prefix is not None:
        found.append("r.run_id LIKE %(id_prefix)s")
        params["id_prefix"] = like_prefix(wanted.id_prefix)
    if wanted.tags:
        # Those given at start or set by steps (io/postgres/run_tags.py).
        condition, tag_params = tags_condition("r", wanted.tags)
        found.append(condition)
        params.update(tag_params)
    if wanted.step_failed is not None:
        # The step itself, or the items of a map step (named step[0], step[1], ...).
        found.append(
            "r.run_id IN (SELECT s.run_id FROM eec_step_result s WHERE s.outcome = 'failed'"
            " AND (s.node_id = %(step)s OR s.node_id LIKE %(step_items)s))"
        )
        params["step"] = wanted.step_failed
        params["step_items"] = like_prefix(wanted.step_failed + "[")
    if after is not None:
        found.append("(r.created_at, r.run_id) < (%(after_at)s, %(after_id)s)")
        params["after_at"] = _EPOCH + after.created_us * _MICROSECOND
        params["after_id"] = after.run_id
    return found, params


def _branches(wanted: RunFilter, after: Cursor | None) -> tuple[list[str], dict[str, Any]]:
    """The WHERE of each part of a search (_PARTS), with the statuses asked for that it holds
    written out (our own enum's values), so that the planner proves the partial indexes'
    predicates. A part no status asked for is left out."""
    found, params = conditions(wanted, after)
    wheres = []
    for statuses, reach in _PARTS:
        kept = [s for s in statuses if not wanted.statuses or s in wanted.statuses]
        if kept:
            listed = ", ".join(f"'{s.value}'" for s in kept)
            wheres.append(" WHERE " + " AND ".join([f"r.status IN ({listed})", *reach, *found]))
    return wheres, params


def search_sql(wanted: RunFilter, limit: int, after: Cursor | None) -> tuple[str, dict[str, Any]]:
    wheres, params = _branches(wanted, after)
    order = " ORDER BY r.created_at DESC, r.run_id DESC LIMIT %(limit)s"
    parts = [f"(SELECT {_COLUMNS} FROM eec_workflow_run r{where}{order})" for where in wheres]
    sql = (
        f"SELECT * FROM ({' UNION ALL '.join(parts)}) AS found"
        " ORDER BY created_at DESC, run_id DESC LIMIT %(limit)s"
    )
    return sql, {**params, "limit": limit}


def count_sql(wanted: RunFilter) -> tuple[str, dict[str, Any]]:
    wheres, params = _branches(wanted, None)
    counts = [f"(SELECT count(*) FROM eec_workflow_run r{where})" for where in wheres]
    return "SELECT " + " + ".join(counts), params


def search_runs(
    conn: psycopg.Connection[Any], wanted: RunFilter, limit: int, after: Cursor | None = None
) -> RunPage:
    """Up to ``limit`` runs matching ``wanted``, newest first, after ``after``."""
    sql, params = search_sql(wanted, limit + 1, after)  # one more: is there a next page?
    rows = conn.execute(sql, params).fetchall()
    runs = [_summary(row) for row in rows[:limit]]
    if len(rows) <= limit:
        return RunPage(runs, None)
    last = rows[limit - 1]
    return RunPage(runs, Cursor((last[7] - _EPOCH) // _MICROSECOND, last[0]))


def count_runs(conn: psycopg.Connection[Any], wanted: RunFilter) -> int:
    sql, params = count_sql(wanted)
    row = conn.execute(sql, params).fetchone()
    return 0 if row is None else int(row[0])


def _summary(row: Sequence[Any]) -> RunSummary:
    return RunSummary(
        row[0], (row[1], row[2]), RunStatus(row[3]), row[4], row[5], row[6], row[7], row[8]
    )


# -- a run's attempts, for inspect --output json ------------------------------------------------


@dataclass(frozen=True)
class AttemptRow:
    """What the tables know of one attempt of one node: its claim by a worker (None for steps
    no worker runs: waits, child workflows) and its result (None while it has none): how it
    ended, its output (a success's, cut: core/shown.py) or its error, with the type and the
    traceback of the exception its step raised."""

    node: str
    attempt: int
    worker_id: str | None = None
    started_at: datetime | None = None
    starts: int = 0
    outcome: str | None = None
    ended_at: datetime | None = None
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    output: Shown | None = None


class ResultFacts(NamedTuple):
    """An attempt's result as the timeline reads it."""

    outcome: str
    recorded_at: datetime
    error: str | None = None
    error_type: str | None = None
    traceback: str | None = None
    output: Shown | None = None


# Each output cut in the statement (core/shown.py): a look at a run reads a few kilobytes of
# each, whatever its steps returned.
_RESULTS_SQL = """
SELECT node_id, attempt, outcome, recorded_at, error, error_type, traceback,
       CASE WHEN outcome = 'succeeded' THEN left(output::text, %(chars)s + 1) END,
       CASE WHEN outcome = 'succeeded' THEN length(output::text) END
  FROM eec_step_result WHERE run_id = %(run_id)s
"""


def attempt_rows(conn: psycopg.Connection[Any], run_id: str) -> list[AttemptRow]:
    """Every attempt of the run that a worker claimed or that has a result, in node and
    attempt order: the two tables read by their primary keys and merged."""
    claims = conn.execute(
        "SELECT node_id, attempt, worker_id, started_at, starts FROM eec_step_attempt"
        " WHERE run_id = %s",
        (run_id,),
    ).fetchall()
    results = conn.execute(_RESULTS_SQL, {"run_id": run_id, "chars": SHOWN_CHARS}).fetchall()
    return merge_attempts(
        {(c[0], c[1]): (c[2], c[3], c[4]) for c in claims},
        {
            (node, attempt): ResultFacts(
                outcome,
                at,
                error,
                kind,
                trace,
                None if chars is None else shown(text, chars),
            )
            for node, attempt, outcome, at, error, kind, trace, text, chars in results
        },
    )


def merge_attempts(
    claims: Mapping[AttemptRef, tuple[str, datetime, int]],
    results: Mapping[AttemptRef, ResultFacts],
) -> list[AttemptRow]:
    rows = []
    for key in sorted({*claims, *results}):
        claim, result = claims.get(key), results.get(key)
        row = AttemptRow(
            key[0],
            key[1],
            worker_id=claim[0] if claim else None,
            started_at=claim[1] if claim else None,
            starts=claim[2] if claim else 0,
        )
        if result is not None:
            row = replace(
                row,
                outcome=result.outcome,
                ended_at=result.recorded_at,
                error=result.error,
                error_type=result.error_type,
                traceback=result.traceback,
                output=result.output,
            )
        rows.append(row)
    return rows


def counts_by_workflow(
    conn: psycopg.Connection[Any], wanted: RunFilter
) -> dict[WorkflowKey, dict[str, int]]:
    """How many runs ``wanted`` matches, by workflow version and status (the web page's
    workflows: its window of time), read through the same indexes as ``count_runs``."""
    wheres, params = _branches(wanted, None)
    parts = [
        "(SELECT r.workflow_name, r.workflow_version, r.status, count(*) FROM eec_workflow_run r"
        f"{where} GROUP BY 1, 2, 3)"
        for where in wheres
    ]
    counts: dict[WorkflowKey, dict[str, int]] = {}
    for name, version, status, count in conn.execute(" UNION ALL ".join(parts), params):
        counts.setdefault((name, version), {})[status] = int(count)
    return counts
