"""What the run tables say about a test's runs, and a workflow registered from its JSON and
its runs started as a user starts them (`ductor start`)."""

from __future__ import annotations

from typing import Any

import psycopg

from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres import run_counts
from processor.io.postgres.workflows import register_workflow

from .children import run_ductor


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


def register_raw(pg: psycopg.Connection[Any], raw: dict[str, Any]) -> str:
    """Register the workflow ``raw`` (its JSON form); its name."""
    register_workflow(pg, parse_workflow(raw))
    return str(raw["name"])


def start_by_cli(settings: Settings, workflow: str, run_id: str, payload: str = "{}") -> None:
    """`ductor start WORKFLOW --run-id RUN_ID --input PAYLOAD`, which must succeed."""
    started = run_ductor(settings, "start", workflow, "--run-id", run_id, "--input", payload)
    assert started.returncode == 0, started.stderr
