"""What admitting one dispatch under a rate limit costs, as its limit grows to the largest a
step may declare, its window the longest (a week):

    python -m processor.tools.bench_limits --limits 100 10000 100000

For each limit, on a database created empty for it (``<database>_bench``): the counter is
filled to one short of its limit with dispatches inside its window, as a busy limit's is;
then runs whose one step declares the limit are ticked one at a time through the commit
path's own functions (no Kafka, no processor): their load, the limits' load, the batch's tick
and admission, and the commit statement, each timed (the first few, while the connection
prepares its statements, are not), and the size of the counter's row after them. The
figures to compare are between limits of one run (a cost that grows with the limit) and
against the smallest limit's.

It prints the figures and asserts nothing about speed. Needs the local Postgres up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg

from processor.core.decide import tick_batch
from processor.core.model import LoadedRun
from processor.core.routing import TopicNames
from processor.core.run_state import NodeStatus
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import load_settings
from processor.io.postgres import limit_store, store
from processor.io.postgres.migrate import migrate
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow
from processor.tools.bench_harness import fresh_database

WEEK_S = 604_800
STAGES = ("load", "limits", "tick", "commit")


# Admissions not timed first: psycopg prepares a statement at its fifth execution.
WARMUP = 6


def admissions(conn: psycopg.Connection[Any], limit: int, runs: int) -> dict[str, float]:
    """Median ms of each stage per admission, and the bytes of the counter's row after them."""
    runs += WARMUP
    name = f"bench-rate-{limit}"
    wf = _limited(name, limit)
    register_workflow(conn, wf)
    key = f"r/{name}"
    row = conn.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()
    assert row is not None
    now_ms = int(row[0])
    _fill(conn, key, [now_ms - WEEK_S * 500 + i for i in range(limit - runs - 1)])
    ids = [f"{name}-{i}" for i in range(runs)]
    insert_runs(conn, wf, [(r, {}) for r in ids], "t1")
    definitions = store.Definitions()
    names = TopicNames("bench-limits")
    took: dict[str, list[float]] = {s: [] for s in STAGES}
    for n, run_id in enumerate(ids):
        marks = _admit(conn, definitions, names, run_id)
        if n >= WARMUP:
            for stage, start, end in zip(STAGES, marks, marks[1:], strict=False):
                took[stage].append((end - start) * 1000)
    figures = {s: statistics.median(v) for s, v in took.items()}
    sizes = conn.execute(
        "SELECT pg_column_size(l.*) FROM eec_limit l WHERE key = %s", (key,)
    ).fetchone()
    figures["counter_row_bytes"] = float(sizes[0]) if sizes else 0.0
    return figures


def _limited(name: str, limit: int) -> WorkflowDef:
    """One step under a rate limit of ``limit`` dispatches a week."""
    return parse_workflow(
        {
            "name": name,
            "version": 1,
            "steps": [
                {
                    "name": "call",
                    "type": "fast",
                    "rate_limit": {"limit": limit, "per_s": WEEK_S, "name": name},
                }
            ],
        }
    )


def _fill(conn: psycopg.Connection[Any], key: str, kept: list[int]) -> None:
    """The counter holding ``kept`` dispatches (all in the window)."""
    # The counter as either version keeps it: the times as an array on its row, and, where
    # the table exists, as rows of its dispatches, numbered (migration 0020).
    conn.execute(
        "INSERT INTO eec_limit (key, version, recent) VALUES (%s, 1, %s)"
        " ON CONFLICT (key) DO UPDATE SET version = 1, recent = EXCLUDED.recent",
        (key, kept),
    )
    if conn.execute("SELECT to_regclass('eec_limit_rate')").fetchone() != (None,):
        conn.execute(
            "INSERT INTO eec_limit_rate (key, seq, at_ms)"
            " SELECT %s, i - 1, t FROM unnest(%s::bigint[]) WITH ORDINALITY AS u(t, i)",
            (key, kept),
        )
        conn.execute("UPDATE eec_limit SET dispatched = %s WHERE key = %s", (len(kept), key))
    conn.execute("VACUUM ANALYZE eec_limit")


def _admit(
    conn: psycopg.Connection[Any], definitions: store.Definitions, names: TopicNames, run_id: str
) -> list[float]:
    """One run ticked through the commit path's functions: the clock before and after each
    of the ``STAGES``."""
    marks = [time.perf_counter()]
    loaded, db_now = store.load_runs_at(conn, definitions, [run_id])
    marks.append(time.perf_counter())
    inputs = limit_store.load_limits(conn, loaded)
    marks.append(time.perf_counter())
    commits = tick_batch(loaded, db_now, names, inputs)
    marks.append(time.perf_counter())
    answer = store.commit_batch(conn, list(commits.values()), (), "bench-limits")
    marks.append(time.perf_counter())
    if answer.committed != {run_id}:
        raise RuntimeError(f"{run_id}: not committed ({answer})")
    run = loaded[run_id]
    assert isinstance(run, LoadedRun)
    if commits[run_id].state.node("call").status is not NodeStatus.DISPATCHED:
        raise RuntimeError(f"{run_id}: not let in, the window was meant to have room")
    return marks


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m processor.tools.bench_limits")
    parser.add_argument("--limits", type=int, nargs="+", default=[100, 10_000, 100_000])
    parser.add_argument("--runs", type=int, default=30, help="admissions timed per limit")
    args = parser.parse_args(argv)
    settings = fresh_database(load_settings())
    migrate(settings.pg_dsn)
    rows = []
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        for limit in args.limits:
            rows.append((limit, admissions(conn, limit, args.runs)))
    print("rate limit (per week)  load ms  limits ms  tick ms  commit ms  counter row B")
    for limit, f in rows:
        print(
            f"{limit:>21,}  {f['load']:>7.2f}  {f['limits']:>9.2f}  {f['tick']:>7.2f}"
            f"  {f['commit']:>9.2f}  {f['counter_row_bytes']:>13,.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
