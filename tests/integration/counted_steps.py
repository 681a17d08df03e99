"""A steps module of the tests' own, as a user's would be (`ductor worker --app
tests.integration.counted_steps:registry`): every execution of its step function is written
to a table of its own before the function does anything else, so a test counts what users
feel (how many times their code ran for one attempt) and not only the transitions in the run
table.

One step type, ``counted``, whose behaviour the run's input sets, per attempt:

- ``sleep_ms``: how long it takes (default 0);
- ``hang_on``: attempts that never return (a call that hangs);
- ``crash_on``: attempts that kill their process with SIGKILL (a native crash, the OOM killer);
- ``fail_on``: attempts that raise;
- ``by_node``: the same keys for one step of the run (``{"by_node": {"slow": {...}}}``).
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter
from typing import Any

import psycopg

from processor.io.config import load_settings
from processor.worker import StepContext, StepFailed, StepRegistry

TABLE = "test_step_execution"
_DDL = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id          bigserial   PRIMARY KEY,
    run_id      text        NOT NULL,
    node        text        NOT NULL,
    attempt     integer     NOT NULL,
    pid         integer     NOT NULL,
    started_at  timestamptz NOT NULL DEFAULT now()
)
"""

registry = StepRegistry()
_local = threading.local()


def work_for(seconds: float) -> None:
    """A step's own work, as long as it takes (what a test's step simulates, not a test
    waiting for something: tests wait on conditions)."""
    threading.Event().wait(seconds)


def _conn() -> psycopg.Connection[Any]:
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        conn = _local.conn = psycopg.connect(load_settings().pg_dsn, autocommit=True)
    return conn


@registry.step("counted")
def counted(ctx: StepContext) -> Any:
    # Written first, committed before anything else happens: a crash below still counts.
    _conn().execute(
        f"INSERT INTO {TABLE} (run_id, node, attempt, pid) VALUES (%s, %s, %s, %s)",
        (ctx.run_id, ctx.node, ctx.attempt, os.getpid()),
    )
    spec = ctx.input if isinstance(ctx.input, dict) else {}
    spec = {**spec, **spec.get("by_node", {}).get(ctx.node, {})}
    if ctx.attempt in spec.get("crash_on", ()):
        os.kill(os.getpid(), signal.SIGKILL)
    if ctx.attempt in spec.get("hang_on", ()):
        threading.Event().wait()  # never returns
    if ctx.attempt in spec.get("fail_on", ()):
        raise StepFailed(f"attempt {ctx.attempt} fails, as its input says")
    sleep_ms = spec.get("sleep_ms", 0)
    if sleep_ms:
        work_for(sleep_ms / 1000)
    return {"attempt": ctx.attempt, "pid": os.getpid()}


# -- what the tests read ------------------------------------------------------------------


def install(conn: psycopg.Connection[Any]) -> None:
    """The table, emptied."""
    conn.execute(_DDL)
    conn.execute(f"TRUNCATE {TABLE}")


def executions(conn: psycopg.Connection[Any], prefix: str = "") -> Counter[tuple[str, str, int]]:
    """How many times each (run, step, attempt) ran, for the runs whose id starts with
    ``prefix``."""
    rows = conn.execute(
        f"SELECT run_id, node, attempt, count(*) FROM {TABLE}"
        " WHERE starts_with(run_id, %s) GROUP BY 1, 2, 3",
        (prefix,),
    ).fetchall()
    return Counter({(r, n, a): c for r, n, a, c in rows})


def extra_executions(counts: Counter[tuple[str, str, int]]) -> int:
    """Executions beyond the first of each attempt."""
    return sum(n - 1 for n in counts.values())
