"""Connections to Postgres, as every part of the system opens them: autocommit, jsonb parsed by
orjson, a statement timeout, a lock timeout, no sequential scans; the durable flavour for the
writes a process acknowledges to others."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
from psycopg.types.json import set_json_loads

# How long a statement of the processor or the worker waits for a lock held by another
# transaction before it gives up (and is retried after a backoff).
LOCK_TIMEOUT_MS = 2000


def use_orjson(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """Parse jsonb with orjson on this connection (several times faster than the stdlib)."""
    set_json_loads(orjson.loads, conn)
    return conn


def connect(dsn: str, connect_timeout_s: int = 5) -> psycopg.Connection[Any]:
    """A connection for the processor's own statements: autocommit, jsonb parsed by orjson,
    and a statement timeout. Every statement here is short; one that runs for minutes is a
    hung database, and it must fail (and be counted) rather than hold the loop, the watchdog
    or a shutdown."""
    conn = psycopg.connect(dsn, autocommit=True, connect_timeout=connect_timeout_s)
    conn.execute("SET statement_timeout = '30s'")
    # No statement here waits on a run row's lock (the commit and the result inserts skip a
    # row another transaction holds: io/postgres/store.py, io/postgres/step_data.py). Any other lock
    # held by someone else (an operator's open transaction, a repair script) costs a statement at
    # most this long, then it fails as a lock timeout (io/postgres/db_errors.py) and is retried.
    conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_MS}ms'")
    # Every statement here reaches its rows through an index (run ids, the outbox's keys, the
    # sweeps' partial indexes). A table's statistics can say it is empty long after it filled
    # (step results, between two autoanalyzes): the planner then scanned all of it once per
    # run loaded, and a load took seconds. No sequential scan unless there is no other way.
    conn.execute("SET enable_seqscan = off")
    # No JIT: these statements take a millisecond, and JIT compiling one costs 100-300 ms. A
    # statement with no index to use (the registry's few rows) is planned as a sequential
    # scan at the 1e10 cost ``enable_seqscan = off`` adds, far above ``jit_above_cost``: with
    # JIT on (Postgres's default where it was built with LLVM, as Debian's is), every such
    # statement was compiled, and a run started in that second waited for it.
    conn.execute("SET jit = off")
    return use_orjson(conn)


def connect_durable(dsn: str) -> psycopg.Connection[Any]:
    """A connection as ``connect``, whose commits are durable before they return
    (synchronous_commit on, whatever the server's default). The worker's: it acknowledges a
    task once its result is recorded, and a result lost afterwards by a crash of the database
    would be recovered only when the attempt times out."""
    conn = connect(dsn)
    conn.execute("SET synchronous_commit = on")
    return conn


def server_started(conn: psycopg.Connection[Any]) -> object:
    """When the server at the other end of ``conn`` started: another value on a new connection
    means the database restarted or another server took its place (a failover)."""
    row = conn.execute("SELECT pg_postmaster_start_time()").fetchone()
    return row[0] if row else None


def ping(conn: psycopg.Connection[Any]) -> None:
    """A round trip that proves the database answers (raises psycopg.Error otherwise)."""
    conn.execute("SELECT 1")
