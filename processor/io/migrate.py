"""Apply the SQL migrations in ``schemas/migrations`` in order, recording each one.

A migration is applied in its own transaction together with its record, so a crash leaves it
either fully applied and recorded or not at all. An advisory lock serialises concurrent
``ductor migrate`` runs (two instances started at once must not both apply 0001), and it is
taken before anything else, the bookkeeping table's creation included: two runs creating it at
once on a fresh database would race in the catalog, and one would fail.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import psycopg

MIGRATIONS_TABLE = "ductor_schema_migration"
MIGRATION_LOCK_KEY = 0x0D0C7012  # arbitrary constant naming "ductor migrations"


def migrations_dir() -> Path:
    """schemas/migrations of the source tree (installed editable or run from the checkout)."""
    package_root = Path(str(resources.files("processor"))).parent
    return package_root / "schemas" / "migrations"


def pending_migrations(directory: Path, applied: set[str]) -> list[Path]:
    files = sorted(p for p in directory.glob("*.sql") if p.is_file())
    return [p for p in files if p.stem not in applied]


def migrate(dsn: str, directory: Path | None = None) -> list[str]:
    """Apply what is missing; return the names applied (empty when up to date)."""
    directory = directory or migrations_dir()
    if not directory.is_dir():
        raise FileNotFoundError(f"no migrations directory at {directory}")
    applied_now: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as conn, conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK_KEY,))
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {MIGRATIONS_TABLE} ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        rows = conn.execute(f"SELECT name FROM {MIGRATIONS_TABLE}").fetchall()
        for path in pending_migrations(directory, {r[0] for r in rows}):
            with conn.transaction():
                conn.execute(path.read_text())
                conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} (name) VALUES (%s)", (path.stem,))
            applied_now.append(path.stem)
    return applied_now
