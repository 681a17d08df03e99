"""Apply the SQL migrations the package ships (``schemas/migrations``, io/shipped/files.py) in
order, recording each one.

A migration is applied in its own transaction together with its record, so a crash leaves it
either fully applied and recorded or not at all. An advisory lock serialises concurrent
``ductor migrate`` runs (two instances started at once must not both apply 0001), and it is
taken before anything else, the bookkeeping table's creation included: two runs creating it at
once on a fresh database would race in the catalog, and one would fail.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import psycopg
from psycopg.errors import Diagnostic

from processor.io.shipped.files import Migration, migrations

log = logging.getLogger("ductor.migrate")

MIGRATIONS_TABLE = "ductor_schema_migration"
MIGRATION_LOCK_KEY = 0x0D0C7012  # arbitrary constant naming "ductor migrations"


def pending_migrations(available: Sequence[Migration], applied: set[str]) -> list[Migration]:
    return [m for m in available if m.name not in applied]


def migrate(dsn: str) -> list[str]:
    """Apply what is missing; return the names applied (empty when up to date)."""
    available = migrations()
    applied_now: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.add_notice_handler(_warn)
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        rows = conn.execute(f"SELECT name FROM {MIGRATIONS_TABLE}").fetchall()
        for migration in pending_migrations(available, {r[0] for r in rows}):
            with conn.transaction():
                conn.execute(migration.sql)
                conn.execute(
                    f"INSERT INTO {MIGRATIONS_TABLE} (name) VALUES (%s)", (migration.name,)
                )
            applied_now.append(migration.name)
    return applied_now


def _warn(notice: Diagnostic) -> None:
    """A migration's WARNING (one that could not do all it would, e.g. create the workers'
    role without CREATEROLE: 0023_worker_role.sql), logged with its hint; notices below that
    (NOTICE: a table that exists already) are not."""
    if notice.severity_nonlocalized == "WARNING":
        hint = f" ({notice.message_hint})" if notice.message_hint else ""
        log.warning("migration: %s%s", notice.message_primary, hint)
