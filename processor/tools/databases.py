"""Dropping a database the tools or the tests made for themselves (the benchmark's
``<database>_bench``, the tests' scratch databases)."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from processor.tools.waiting import polls


def drop_database(conn: psycopg.Connection[Any], name: str, wait_s: float = 120.0) -> None:
    """DROP DATABASE ... WITH (FORCE) on ``conn`` (autocommit). It ends the sessions this role
    may end and fails at once on one it may not: an autovacuum worker, which the rows just
    written or deleted draw to that database (`make bench` twice in a row stopped there, and a
    test's scratch database once in CI), or another role's session. Tried again until those
    sessions end, for ``wait_s`` at most; then an error naming them."""
    drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
    refused: psycopg.errors.InsufficientPrivilege | None = None
    for _ in polls(wait_s, 0.5):  # until the sessions it may not end are gone
        try:
            conn.execute(drop)
            return
        except psycopg.errors.InsufficientPrivilege as exc:
            refused = exc
    # Another role's session shows its role; an autovacuum worker its kind.
    holders = ", ".join(
        f"pid {pid} ({who or kind or 'not shown to this role'})"
        for pid, who, kind in conn.execute(
            "SELECT pid, usename, backend_type FROM pg_stat_activity WHERE datname = %s",
            (name,),
        ).fetchall()
    )
    raise RuntimeError(
        f"cannot drop the database {name!r}: sessions this role may not end have used it for"
        f" {wait_s:.0f} s ({holders}); end them (pg_terminate_backend as a superuser) and try"
        f" again"
    ) from refused
