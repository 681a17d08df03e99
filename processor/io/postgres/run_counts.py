"""The queries the demo, the benchmark, the chaos run and the tests make about their own runs,
found by the run ids they chose or a prefix of them: statuses, counts, outcomes, and their
deletion afterwards."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching the strings that start with ``prefix`` (its % and _ literal)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def statuses(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> dict[str, str]:
    """The status of each of ``run_ids`` that exists."""
    rows = conn.execute(
        "SELECT run_id, status FROM eec_workflow_run WHERE run_id = ANY(%s)", (list(run_ids),)
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def statuses_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> dict[str, str]:
    """The status of every run whose id starts with ``prefix``, by run id."""
    rows = conn.execute(
        "SELECT run_id, status FROM eec_workflow_run WHERE run_id LIKE %s", (like_prefix(prefix),)
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def count_ticked_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> int:
    """How many runs whose id starts with ``prefix`` were ticked at least once."""
    row = conn.execute(
        "SELECT count(*) FROM eec_workflow_run WHERE run_id LIKE %s AND last_transition_seq >= 1",
        (like_prefix(prefix),),
    ).fetchone()
    return int(row[0]) if row else 0


def count_ticked(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> int:
    """How many of ``run_ids`` were ticked at least once."""
    row = conn.execute(
        "SELECT count(*) FROM eec_workflow_run WHERE run_id = ANY(%s) AND last_transition_seq >= 1",
        (list(run_ids),),
    ).fetchone()
    return int(row[0]) if row else 0


def count_ended(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> int:
    """How many of ``run_ids`` reached a terminal status."""
    row = conn.execute(
        "SELECT count(*) FROM eec_workflow_run"
        " WHERE run_id = ANY(%s) AND status IN ('succeeded', 'failed', 'cancelled')",
        (list(run_ids),),
    ).fetchone()
    return int(row[0]) if row else 0


def outcomes_with_prefix(
    conn: psycopg.Connection[Any], prefix: str
) -> dict[tuple[str, str | None], int]:
    """How many runs whose id starts with ``prefix`` are in each (status, failure reason)."""
    rows = conn.execute(
        "SELECT status, failure_reason, count(*) FROM eec_workflow_run WHERE run_id LIKE %s"
        " GROUP BY 1, 2",
        (like_prefix(prefix),),
    ).fetchall()
    return {(r[0], r[1]): int(r[2]) for r in rows}


def live_runs_with_prefix(
    conn: psycopg.Connection[Any], prefix: str, limit: int
) -> list[tuple[str, str, Any, datetime | None]]:
    """Up to ``limit`` runs whose id starts with ``prefix`` that have not ended: run id,
    status, node states and next wakeup time (to show why they did not end)."""
    rows = conn.execute(
        "SELECT run_id, status, node_states, next_wakeup_at FROM eec_workflow_run"
        " WHERE run_id LIKE %s AND status IN ('pending', 'running') ORDER BY run_id LIMIT %s",
        (like_prefix(prefix), limit),
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def count_outbox_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> int:
    """Outbox rows (effects not yet acknowledged) of the runs whose id starts with ``prefix``."""
    row = conn.execute(
        "SELECT count(*) FROM eec_outbox WHERE run_id LIKE %s", (like_prefix(prefix),)
    ).fetchone()
    return int(row[0]) if row else 0


def delete_runs_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> int:
    """Delete the runs whose id starts with ``prefix`` (their signals go with them by
    cascade, their results, outbox rows, step attempts, map items, tags set by steps, kept
    signals and marks
    explicitly); returns how many were deleted."""
    pattern = like_prefix(prefix)
    conn.execute("DELETE FROM eec_kept_signal WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_run_rewake WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_run_quarantine WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_step_result WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_outbox WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_step_attempt WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_map_item WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_run_tag WHERE run_id LIKE %s", (pattern,))
    cur = conn.execute("DELETE FROM eec_workflow_run WHERE run_id LIKE %s", (pattern,))
    return cur.rowcount


def vacuum_runs(conn: psycopg.Connection[Any]) -> None:
    """VACUUM (ANALYZE) the run table and the tables the workers read with it: dead rows gone
    and statistics fresh (the benchmark starts from there: a statement planned on the
    statistics of a table just emptied reads it the wrong way once it has grown). Needs an
    autocommit connection."""
    conn.execute("VACUUM (ANALYZE) eec_workflow_run, eec_step_result, eec_step_attempt")
