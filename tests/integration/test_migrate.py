"""Two `ductor migrate` started at once on a fresh database: both succeed and each migration is
applied and recorded once. Each test migrates a scratch database of its own, dropped after."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.io.config.settings import Settings
from processor.io.postgres.migrate import MIGRATION_LOCK_KEY, MIGRATIONS_TABLE
from processor.io.shipped.files import migrations

from .children import child_env
from .samples import REPO
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _start_migrate(settings: Settings, dsn: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "processor", "migrate"],
        env=child_env(replace(settings, pg_dsn=dsn)),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(proc: subprocess.Popen[bytes]) -> tuple[int, str]:
    """Its exit code and what it printed; its log (stderr) is only shown when it fails."""
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err.decode()
    return proc.returncode, out.decode()


def _recorded(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        query = f"SELECT name, count(*) FROM {MIGRATIONS_TABLE} GROUP BY name"
        rows = conn.execute(query).fetchall()
    return {name: int(count) for name, count in rows}


def _check_both_succeeded(procs: list[subprocess.Popen[bytes]], dsn: str) -> None:
    expected = [m.name for m in migrations()]
    results = [_finish(p) for p in procs]
    assert [code for code, _ in results] == [0, 0], results
    outputs = sorted(text.strip() for _, text in results)
    # One applied everything, the other found the schema up to date.
    assert outputs == sorted(["applied: " + ", ".join(expected), "schema is up to date"]), outputs
    assert _recorded(dsn) == dict.fromkeys(expected, 1)


def _waiting_for_the_lock(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
    ).fetchone()
    return int(row[0]) if row else 0


def test_both_wait_for_the_lock_before_touching_the_schema(
    base_settings: Settings, scratch_dsn: str
) -> None:
    """Deterministic: the lock is held while both start, so both reach it; nothing, not even
    the bookkeeping table, may exist before one of them holds it."""
    with psycopg.connect(scratch_dsn, autocommit=True) as holder:
        holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))
        procs = [_start_migrate(base_settings, scratch_dsn) for _ in range(2)]
        try:
            wait_for(lambda: _waiting_for_the_lock(holder) == 2, 30, "both to wait for the lock")
            exists = holder.execute("SELECT to_regclass(%s)", (MIGRATIONS_TABLE,)).fetchone()
            assert exists == (None,), "the bookkeeping table was created before the lock"
        finally:
            holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
        _check_both_succeeded(procs, scratch_dsn)


def test_two_started_at_the_same_moment_both_succeed(
    base_settings: Settings, scratch_dsn: str
) -> None:
    procs = [_start_migrate(base_settings, scratch_dsn) for _ in range(2)]
    _check_both_succeeded(procs, scratch_dsn)
