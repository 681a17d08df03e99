"""`ductor gc --finished-before` on the real database: finished runs older than the cutoff go
with their step results, signals and outbox rows, in batches; finished runs younger than it and
live runs of any age stay with everything of theirs; a processor and a worker working meanwhile
are unaffected."""

from __future__ import annotations

import re
import uuid
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs

from .audit import assert_results_applied
from .children import run_ductor
from .instances import ProcessorThread, WorkerThread
from .runs import count_terminal, run_statuses
from .samples import sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

_REPORT = re.compile(
    r"(deleted|would delete) (\d+) run\(s\), (\d+) step result\(s\), (\d+) signal\(s\),"
    r" (\d+) outbox row\(s\), 0 kept cancel\(s\) \(finished before \S+;"
    r" (dry run|\d+ batch\(es\))\)"
)


def _make_runs(
    pg: psycopg.Connection[Any], prefix: str, count: int, status: str, age: str
) -> list[str]:
    """``count`` runs that ended (or last moved) ``age`` ago in ``status``, each with two step
    results and a signal."""
    ids = [f"{prefix}-{uuid.uuid4().hex[:6]}-{i}" for i in range(count)]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in ids], "t1")
    pg.execute(
        "UPDATE eec_workflow_run SET status = %s, last_transition_at = now() - %s::interval"
        " WHERE run_id = ANY(%s)",
        (status, age, ids),
    )
    pg.execute(
        "INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)"
        " SELECT r, n, 1, 'succeeded', '{}' FROM unnest(%s::text[]) r,"
        " unnest(ARRAY['fetch', 'enrich']) n",
        (ids,),
    )
    pg.execute(
        "INSERT INTO eec_run_signal (run_id, signal_id, kind)"
        " SELECT r, 'cancel-' || r, 'cancel' FROM unnest(%s::text[]) r",
        (ids,),
    )
    return ids


def _rows(pg: psycopg.Connection[Any], table: str, ids: list[str]) -> int:
    row = pg.execute(f"SELECT count(*) FROM {table} WHERE run_id = ANY(%s)", (ids,)).fetchone()
    return int(row[0]) if row else 0


def _gc(settings: Settings, *args: str) -> tuple[int, str, str]:
    done = run_ductor(settings, "gc", *args)
    return done.returncode, done.stdout, done.stderr


def _report(stdout: str) -> tuple[str, int, int, int, int, str]:
    match = _REPORT.fullmatch(stdout.strip())
    assert match is not None, stdout
    verb, runs, results, signals, outbox, how = match.groups()
    return verb, int(runs), int(results), int(signals), int(outbox), how


def test_only_finished_runs_older_than_the_cutoff_go_with_everything_of_theirs(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    doomed = (
        _make_runs(pg, "old-succeeded", 3, "succeeded", "10 days")
        + _make_runs(pg, "old-failed", 2, "failed", "7 days 1 minute")
        + _make_runs(pg, "old-cancelled", 2, "cancelled", "400 days")
    )
    pg.execute("INSERT INTO eec_outbox (run_id, seq, records) VALUES (%s, 1, '[]')", (doomed[0],))
    kept = (
        _make_runs(pg, "young-succeeded", 2, "succeeded", "1 day")
        + _make_runs(pg, "young-failed", 1, "failed", "6 days 23 hours")
        + _make_runs(pg, "old-pending", 2, "pending", "30 days")
        + _make_runs(pg, "old-running", 2, "running", "10 days")
    )

    code, out, err = _gc(settings, "--finished-before", "7d", "--dry-run")
    assert code == 0, err
    assert _report(out) == ("would delete", 7, 14, 7, 1, "dry run")
    assert _rows(pg, "eec_workflow_run", doomed) == 7  # a dry run deletes nothing

    code, out, err = _gc(settings, "--finished-before", "7d", "--batch-size", "3")
    assert code == 0, err
    # Three batches of at most 3 runs, then one that finds none.
    assert _report(out) == ("deleted", 7, 14, 7, 1, "3 batch(es)")
    for table in ("eec_workflow_run", "eec_step_result", "eec_run_signal", "eec_outbox"):
        assert _rows(pg, table, doomed) == 0, table
    assert sorted(run_statuses(pg, kept)) == sorted(kept)
    assert _rows(pg, "eec_step_result", kept) == 2 * len(kept)
    assert _rows(pg, "eec_run_signal", kept) == len(kept)

    code, out, _ = _gc(settings, "--finished-before", "7d")
    assert code == 0 and _report(out) == ("deleted", 0, 0, 0, 0, "0 batch(es)")
    code, out, _ = _gc(settings, "--finished-before", "12h")  # now the young finished runs go
    assert code == 0 and _report(out) == ("deleted", 3, 6, 3, 0, "1 batch(es)")
    assert sorted(run_statuses(pg, kept)) == sorted(r for r in kept if "old-" in r)


def test_a_processor_and_a_worker_working_meanwhile_are_unaffected(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    old = _make_runs(pg, "old", 3000, "succeeded", "8 days")
    # Enough runs that they are still going when gc starts (a few hundred can all end between
    # two looks at them).
    run_ids = [f"live-{i}" for i in range(2000)]
    instance: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        start_runs(settings, "sample", run_ids)
        wait_for(
            lambda: 0 < count_terminal(pg, run_ids) < len(run_ids) / 2,
            60,
            "the first runs to end",
            interval=0.01,
        )
        code, out, err = _gc(settings, "--finished-before", "7d", "--batch-size", "100")
        assert code == 0, err
        assert _report(out)[:5] == ("deleted", 3000, 6000, 3000, 0)
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 120, "every run to end")
    finally:
        worker.stop()
    assert _rows(pg, "eec_workflow_run", old) == 0
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert instance.stats.error_count == 0
    assert not instance.stats.dead_letters
