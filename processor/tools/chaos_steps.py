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

from processor.io.config.settings import Settings, load_settings
from processor.worker import StepContext, StepRegistry, sample_registry

# Where the steps write their executions: a DSN the chaos run and the tests give the workers
# they start (`ductor worker` removes its own DSNs from the environment before it imports the
# steps: processor/worker/environment.py); a worker in the test process keeps its environment,
# and the steps there use the settings'.
EXECUTION_LOG_VARIABLE = "DUCTOR_TEST_EXECUTION_LOG"


def execution_log_env(settings: Settings) -> dict[str, str]:
    """What a worker running these steps needs in its environment besides its settings."""
    return {EXECUTION_LOG_VARIABLE: settings.pg_dsn}


class ExecutionLog:
    """A table in which step functions write each execution before they do anything else
    (committed at once: a crash right after still counts), and what is read from it. The
    chaos run's steps write one, the integration tests' steps module another."""

    def __init__(self, table: str) -> None:
        self.table = table
        self._local = threading.local()  # a connection per step thread

    def install(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {self.table} (id bigserial PRIMARY KEY,"
            " run_id text NOT NULL, node text NOT NULL, attempt integer NOT NULL,"
            " pid integer NOT NULL, started_at timestamptz NOT NULL DEFAULT now())"
        )

    def record(self, ctx: StepContext) -> None:
        """One execution of ``ctx``'s attempt, on this thread's own connection."""
        conn: psycopg.Connection[Any] | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed:
            dsn = os.environ.get(EXECUTION_LOG_VARIABLE) or load_settings().pg_dsn
            conn = self._local.conn = psycopg.connect(dsn, autocommit=True)
        conn.execute(
            f"INSERT INTO {self.table} (run_id, node, attempt, pid) VALUES (%s, %s, %s, %s)",
            (ctx.run_id, ctx.node, ctx.attempt, os.getpid()),
        )

    def executions(
        self, conn: psycopg.Connection[Any], prefix: str = ""
    ) -> Counter[tuple[str, str, int]]:
        """How many times each (run, step, attempt) ran, for the runs whose id starts with
        ``prefix``."""
        rows = conn.execute(
            f"SELECT run_id, node, attempt, count(*) FROM {self.table}"
            " WHERE starts_with(run_id, %s) GROUP BY 1, 2, 3",
            (prefix,),
        ).fetchall()
        return Counter({(r, n, a): c for r, n, a, c in rows})


def extra_executions(counts: Counter[tuple[str, str, int]]) -> int:
    """Executions beyond the first of each attempt."""
    return sum(n - 1 for n in counts.values())


Attempt = tuple[str, str, int]  # run, step, attempt


def reached_a_worker(conn: psycopg.Connection[Any], prefix: str) -> set[Attempt]:
    """The attempts of the runs whose id starts with ``prefix`` that a worker took: claimed
    (their row in eec_step_attempt, written as a worker starts them) or run (the execution
    log)."""
    rows = conn.execute(
        "SELECT run_id, node_id, attempt FROM eec_step_attempt WHERE starts_with(run_id, %s)",
        (prefix,),
    ).fetchall()
    return {(r, n, a) for r, n, a in rows} | set(executions(conn, prefix))


def never_ran(attempt: Attempt, result_recorded: bool, reached: set[Attempt]) -> bool:
    """Whether a timed-out attempt is a lost task: no worker ever took it. An attempt whose
    worker was killed while running it has no recorded result either, and times out from
    its start (its timeout counts from there) unless another worker runs it again in time:
    that is a kill's cost, not a lost task."""
    return not result_recorded and attempt not in reached


LOG = ExecutionLog("chaos_step_execution")
install, executions = LOG.install, LOG.executions


def _counted(fn: Callable[[StepContext], Any]) -> Callable[[StepContext], Any]:
    def run(ctx: StepContext) -> Any:
        LOG.record(ctx)
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
