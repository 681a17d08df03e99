"""What the run tables say about a test's runs."""

from __future__ import annotations

from typing import Any

import psycopg

from processor.io.postgres import run_counts


def run_statuses(pg: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, str]:
    return run_counts.statuses(pg, run_ids)


def count_terminal(pg: psycopg.Connection[Any], run_ids: list[str]) -> int:
    return run_counts.count_ended(pg, run_ids)


def step_attempts(pg: psycopg.Connection[Any], run_id: str) -> dict[str, list[tuple[int, str]]]:
    """The recorded attempts of each step of a run: node -> [(attempt, outcome), ...]."""
    rows = pg.execute(
        "SELECT node_id, attempt, outcome FROM eec_step_result WHERE run_id = %s"
        " ORDER BY node_id, attempt",
        (run_id,),
    ).fetchall()
    found: dict[str, list[tuple[int, str]]] = {}
    for node, attempt, outcome in rows:
        found.setdefault(node, []).append((attempt, outcome))
    return found
