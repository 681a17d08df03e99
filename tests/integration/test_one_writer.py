"""The run row has one writer: every write to it moves its version, conditioned on the version
it read (a committed tick, or `ductor runs release` moving the version alone). The watchdog's
re-wake marks and the quarantine flags live in tables of their own (migration 0021): driven
through the sweeps (overdue runs re-woken, a stuck run woken, a run quarantined, repaired and
released), the audit trail counts no write to a run row that left its version where it was.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.routing import run_shard
from processor.core.run_state import initial_state, state_checksum
from processor.io.config.settings import Settings
from processor.io.postgres.migrate import MIGRATIONS_TABLE, migrate
from processor.io.postgres.runs_admin import insert_runs, run_columns
from processor.io.postgres.workflows import register_workflow
from processor.io.shipped.files import migrations
from processor.tools import audit as audit_trail

from .audit import assert_every_write_versioned, assert_transitions_applied_once
from .children import run_ductor
from .instances import ProcessorThread, WorkerThread
from .runs import count_terminal, run_statuses
from .samples import sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

LOST = 12  # runs whose start wakeups were never sent: the overdue sweep starts them


def _set(pg: psycopg.Connection[Any], run_ids: list[str], assignments: str) -> None:
    pg.execute(f"UPDATE eec_workflow_run SET {assignments} WHERE run_id = ANY(%s)", (run_ids,))


def _flag(pg: psycopg.Connection[Any], run_id: str) -> str | None:
    columns = run_columns(pg, run_id)
    assert columns is not None
    return columns.quarantine_reason


def test_the_sweeps_and_the_quarantine_never_write_the_run_row(
    settings: Settings,
    pg: psycopg.Connection[Any],
    audit: psycopg.Connection[Any],
    processor_thread: Any,
) -> None:
    settings = replace(settings, sweep_grace_s=0.0, stuck_after_s=3.0)
    prefix = f"one-{uuid.uuid4().hex[:6]}-"
    lost = [f"{prefix}lost-{i}" for i in range(LOST)]
    stuck = f"{prefix}stuck"  # pending, no wakeup due, no transition for an hour
    tampered = f"{prefix}tampered"  # changed out of band: quarantined
    insert_runs(pg, sample_workflow(), [(r, {}) for r in [*lost, stuck, tampered]], "t1")
    # The set-up writes the rows by hand (as an outage and an outside writer would leave
    # them), then the trail starts empty: what it holds from here is the processor's.
    _set(pg, lost, "next_wakeup_at = now() - interval '1 minute'")
    _set(pg, [stuck], "next_wakeup_at = NULL, last_transition_at = now() - interval '1 hour'")
    row = pg.execute(
        "SELECT state_checksum FROM eec_workflow_run WHERE run_id = %s", (tampered,)
    ).fetchone()
    assert row is not None
    _set(
        pg,
        [tampered],
        "state_checksum = 'changed-by-hand', next_wakeup_at = now() - interval '1 hour'",
    )
    audit_trail.clear(pg)

    instance: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, [*lost, stuck]) == LOST + 1, 90, "the runs to end")
        wait_for(lambda: _flag(pg, tampered) is not None, 30, "the tampered run's flag")
        assert (_flag(pg, tampered) or "").startswith("checksum_mismatch")
        watchdog = instance.processor.watchdog
        assert watchdog.rewoken >= LOST + 1  # every lost run, and the stuck one
        # Sweeps go on over the flagged run: none of them writes its row either.
        sweeps = watchdog.sweeps
        wait_for(lambda: watchdog.sweeps >= sweeps + 3, 30, "three more sweeps")
        assert_every_write_versioned(pg, prefix)
        # What users see of the flag, read beside the row: the listing and inspect.
        listed = run_ductor(settings, "runs", "list", "--id-prefix", prefix, "-o", "json")
        assert listed.returncode == 0, listed.stderr
        runs = map(orjson.loads, listed.stdout.splitlines())
        flagged = {r["run_id"] for r in runs if r["quarantined"]}
        assert flagged == {tampered}
        shown = run_ductor(settings, "inspect", tampered)
        assert shown.returncode == 1 and "QUARANTINED since" in shown.stdout

        # The operator repairs the row (by hand: not the processor's write, left out of the
        # trail) and releases it: `runs release` moves the version, and the run goes on.
        _set(pg, [tampered], f"state_checksum = '{row[0]}'")
        audit_trail.clear(pg)
        released = run_ductor(settings, "runs", "release", tampered)
        assert released.returncode == 0, released.stderr
        wait_for(lambda: count_terminal(pg, [tampered]) == 1, 60, "the released run to end")
    finally:
        worker.stop()
    assert set(run_statuses(pg, [*lost, stuck, tampered]).values()) == {"succeeded"}
    assert _flag(pg, tampered) is None
    assert_every_write_versioned(pg, prefix)
    assert_transitions_applied_once(pg, prefix)
    # Where the marks went: beside the rows.
    marked = pg.execute(
        "SELECT count(*) FROM eec_run_rewake WHERE run_id = ANY(%s)", ([*lost, stuck],)
    ).fetchone()
    assert marked == (LOST + 1,)


def test_the_migration_moves_the_marks_off_the_run_row(scratch_dsn: str) -> None:
    """A database with re-wake marks and quarantine flags on its run rows (before 0021): the
    migration moves them into their tables, the flag for the version the row has."""
    before = [m for m in migrations() if m.name < "0021"]
    with psycopg.connect(scratch_dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {MIGRATIONS_TABLE}"
            " (name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in before:
            conn.execute(migration.sql)
            conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} (name) VALUES (%s)", (migration.name,))
        wf = sample_workflow()
        register_workflow(conn, wf)
        # Rows as that schema has them, written by hand: today's insert reads tables of
        # later migrations.
        state = initial_state(wf)
        for run_id in ("plain", "rewoken", "flagged"):
            conn.execute(
                "INSERT INTO eec_workflow_run (run_id, workflow_name, workflow_version, status,"
                " node_states, state_checksum, shard) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (
                    run_id,
                    wf.name,
                    wf.version,
                    state.status.value,
                    orjson.dumps(state.nodes_json()).decode(),
                    state_checksum(state),
                    run_shard(run_id),
                ),
            )
        conn.execute(
            "UPDATE eec_workflow_run SET rewoken_at = '2030-01-01T00:00:00Z'"
            " WHERE run_id IN ('rewoken', 'flagged')"
        )
        conn.execute(
            "UPDATE eec_workflow_run SET quarantined_at = '2030-01-02T00:00:00Z',"
            " quarantine_reason = 'poison: bad', db_record_version = 7 WHERE run_id = 'flagged'"
        )
    assert "0021_run_marks" in migrate(scratch_dsn)
    with psycopg.connect(scratch_dsn, autocommit=True) as conn:
        conn.execute("SET TimeZone = 'UTC'")
        rewakes = conn.execute(
            "SELECT run_id, rewoken_at::text FROM eec_run_rewake ORDER BY run_id"
        ).fetchall()
        assert rewakes == [
            ("flagged", "2030-01-01 00:00:00+00"),
            ("rewoken", "2030-01-01 00:00:00+00"),
        ]
        flags = conn.execute(
            "SELECT run_id, run_version, reason FROM eec_run_quarantine"
        ).fetchall()
        assert flags == [("flagged", 7, "poison: bad")]
        assert _flag(conn, "flagged") == "poison: bad" and _flag(conn, "plain") is None
        gone = conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_name = 'eec_workflow_run'"
            " AND column_name IN ('rewoken_at', 'quarantined_at', 'quarantine_reason')"
        ).fetchall()
        assert gone == []
