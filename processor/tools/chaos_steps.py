"""The steps the chaos run's workers run (`ductor worker --app
processor.tools.chaos_steps:registry`): the sample step functions, each execution written to a
table of its own before the function runs, so the report counts how many times users' code
ran for each attempt, and not only the transitions in the run table."""

from __future__ import annotations

import os
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg

from processor.io.config import load_settings
from processor.worker import StepContext, StepRegistry, sample_registry

TABLE = "chaos_step_execution"
_local = threading.local()


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(load_settings().pg_dsn, autocommit=True)
    return conn


def _counted(fn: Callable[[StepContext], Any]) -> Callable[[StepContext], Any]:
    def run(ctx: StepContext) -> Any:
        _conn().execute(
            f"INSERT INTO {TABLE} (run_id, node, attempt, pid) VALUES (%s, %s, %s, %s)",
            (ctx.run_id, ctx.node, ctx.attempt, os.getpid()),
        )
        return fn(ctx)

    return run


def counting(steps: StepRegistry) -> StepRegistry:
    """``steps`` with every (plain) step function recording its executions first."""
    counted = StepRegistry()
    for step_type in steps.types():
        fn = steps.get(step_type)
        assert fn is not None and not steps.is_async(step_type)
        counted.step(step_type)(_counted(fn))
    return counted


registry = counting(sample_registry())


def install(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        f"CREATE TABLE IF NOT EXISTS {TABLE} (id bigserial PRIMARY KEY, run_id text NOT NULL,"
        " node text NOT NULL, attempt integer NOT NULL, pid integer NOT NULL,"
        " at timestamptz NOT NULL DEFAULT now())"
    )


def executions(conn: psycopg.Connection[Any], prefix: str) -> Counter[tuple[str, str, int]]:
    """Executions of each (run, step, attempt) of the runs whose id starts with ``prefix``."""
    rows = conn.execute(
        f"SELECT run_id, node, attempt, count(*) FROM {TABLE}"
        " WHERE starts_with(run_id, %s) GROUP BY 1, 2, 3",
        (prefix,),
    ).fetchall()
    return Counter({(r, n, a): c for r, n, a, c in rows})
