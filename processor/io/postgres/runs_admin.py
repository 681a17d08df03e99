"""Postgres off the hot paths: registering workflows, inserting runs and signals, reading a
run for inspection, and the few queries the demo and the benchmark make about their own runs.

Like ``store.py``, every statement is one round trip on an autocommit connection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import psycopg

from processor.core.child_graph import ChildCycle, ChildRef, child_cycle
from processor.core.model import RunStatus, SignalKind, initial_state, state_checksum
from processor.core.routing import DEFAULT_QUEUE, run_shard
from processor.core.workflow import WorkflowDef, parse_workflow, workflow_to_json
from processor.io.postgres.kept_signals import take_kept_signals
from processor.io.postgres.run_marks import flag_column


@dataclass(frozen=True)
class RunColumns:
    """The bookkeeping columns of a run row that its loaded state does not carry."""

    version: int
    next_wakeup_at: datetime | None
    created_at: datetime
    updated_at: datetime
    failure_reason: str | None
    workflow: tuple[str, int]
    status: str  # as stored (a row that cannot be loaded still has one)
    tier: str
    quarantined_at: datetime | None
    quarantine_reason: str | None
    start_at: datetime | None = None  # started for later: not before then
    tags: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunResult:
    """Where a run stands and what it gave: its status, its output (None while it has not
    succeeded, or when its workflow declares none) and why it failed or was cancelled."""

    run_id: str
    status: RunStatus
    output: Any
    failure_reason: str | None

    @property
    def finished(self) -> bool:
        return self.status.terminal


@dataclass(frozen=True)
class RunSummary:
    """A run as ``ductor runs list`` shows it."""

    run_id: str
    workflow: tuple[str, int]
    status: RunStatus
    last_transition_at: datetime
    failure_reason: str | None
    quarantine_reason: str | None  # None unless the run is quarantined
    created_at: datetime | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


# Registrations of definitions that start children take turns (a transaction-scoped advisory
# lock, this key): two registered at once could each close half of a cycle unseen.
_CHILD_GRAPH_LOCK = 0x64756374  # "duct"


def register_workflow(conn: psycopg.Connection[Any], wf: WorkflowDef) -> bool:
    """Register a definition; True if new. Re-registering the same content is a no-op, a
    different content under an existing (name, version) is refused (versions are immutable),
    and so is one whose step starts a child run of a workflow (version) not registered, or
    whose registration would close a cycle of child workflows (ChildCycle: core/child_graph.py).
    """
    if not wf.has_children:
        return _register(conn, wf)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_CHILD_GRAPH_LOCK,))
        _check_children_registered(conn, wf)
        new = _register(conn, wf)
        if new:  # read with the new row, in this transaction: raising takes it back
            cycle = child_cycle(wf.key, _child_graph(conn))
            if cycle is not None:
                raise ChildCycle(wf.key, cycle)
        return new


def _check_children_registered(conn: psycopg.Connection[Any], wf: WorkflowDef) -> None:
    for step in wf.steps:
        if step.starts_child:
            row = conn.execute(
                "SELECT 1 FROM eec_workflow_definition WHERE name = %s"
                " AND (%s::integer IS NULL OR version = %s::integer) LIMIT 1",
                (step.child_workflow, step.child_version, step.child_version),
            ).fetchone()
            if row is None:
                which = "" if step.child_version is None else f" version {step.child_version}"
                raise ValueError(
                    f"step {step.name!r} starts workflow {step.child_workflow!r}{which}, which"
                    " is not registered: register it first"
                )


def _child_graph(conn: psycopg.Connection[Any]) -> dict[tuple[str, int], list[ChildRef]]:
    """Every registered version with the children its steps start (core/child_graph.py)."""
    rows = conn.execute(
        "SELECT w.name, w.version, st ->> 'workflow', st ->> 'version'"
        " FROM eec_workflow_definition w"
        f" LEFT JOIN LATERAL {_STEPS.format(d='w.definition')} AS st"
        "   ON st ->> 'kind' = 'workflow' AND jsonb_typeof(st -> 'workflow') = 'string'"
    ).fetchall()
    graph: dict[tuple[str, int], list[ChildRef]] = {}
    for name, version, child, child_version in rows:
        refs = graph.setdefault((name, version), [])
        if child is not None:
            pinned = int(child_version) if child_version and child_version.isdigit() else None
            refs.append((child, pinned))
    return graph


def _register(conn: psycopg.Connection[Any], wf: WorkflowDef) -> bool:
    body = orjson.dumps(workflow_to_json(wf)).decode()
    row = conn.execute(
        "INSERT INTO eec_workflow_definition (name, version, definition) VALUES (%s, %s, %s)"
        " ON CONFLICT (name, version) DO NOTHING RETURNING 1",
        (wf.name, wf.version, body),
    ).fetchone()
    if row is not None:
        return True
    existing = conn.execute(
        "SELECT definition FROM eec_workflow_definition WHERE name = %s AND version = %s",
        (wf.name, wf.version),
    ).fetchone()
    if existing is not None and parse_workflow(existing[0]) != wf:
        raise ValueError(
            f"workflow {wf.name!r} version {wf.version} is already registered with a different"
            " definition; register it under a new version"
        )
    return False


# The steps of definition {d}, as rows: none for a definition written by hand whose ``steps``
# is not a list (it cannot be run; a listing or a topic creation must not fail on it).
_STEPS = """jsonb_array_elements(CASE WHEN jsonb_typeof({d} -> 'steps') = 'array'
                                   THEN {d} -> 'steps' ELSE '[]'::jsonb END)"""


@dataclass(frozen=True)
class WorkflowVersion:
    """One registered version of a workflow, as ``ductor workflows list`` shows it."""

    name: str
    version: int
    registered_at: datetime
    steps: tuple[str, ...]


def workflow_versions(conn: psycopg.Connection[Any]) -> list[WorkflowVersion]:
    """Every registered version, by name, then version."""
    rows = conn.execute(
        "SELECT name, version, registered_at,"
        f" ARRAY(SELECT st ->> 'name' FROM {_STEPS.format(d='definition')} AS st)"
        " FROM eec_workflow_definition ORDER BY name, version"
    ).fetchall()
    return [WorkflowVersion(n, v, at, tuple(steps)) for n, v, at, steps in rows]


def registered_queues(conn: psycopg.Connection[Any]) -> list[str]:
    """The queues the steps of the registered workflows name (each its steps topic)."""
    rows = conn.execute(
        "SELECT DISTINCT coalesce(st ->> 'queue', %s) FROM eec_workflow_definition w,"
        f" {_STEPS.format(d='w.definition')} AS st ORDER BY 1",
        (DEFAULT_QUEUE,),
    ).fetchall()
    return [r[0] for r in rows]


@dataclass(frozen=True)
class ExistingRun:
    """A run id given to ``insert_runs`` that a run had already: its workflow, and whether it
    was started with the same input (jsonb equality: key order and spacing do not count)."""

    run_id: str
    workflow: tuple[str, int]
    same_input: bool
    tier: str = "t1"  # the wakeup tier it was started on


@dataclass(frozen=True)
class InsertedRuns:
    """What ``insert_runs`` did with each run id: created, or found already there."""

    created: list[str]
    existing: list[ExistingRun]


# One statement per batch: the INSERT returns the rows it created, and the SELECT beside it,
# which reads the table as it was before the statement, the rows it found there instead (the
# run ids it skipped, with their workflow and whether their input is the one given). Only the
# ids the INSERT skipped are looked up, each in the primary key (LATERAL ... LIMIT 1: a plain
# join lets the planner read the whole table): a batch of new runs costs no lookup at all.
_INSERT_RUNS = """
WITH given AS (
    SELECT * FROM unnest(%(ids)s::text[], %(shards)s::bigint[], %(inputs)s::jsonb[])
        AS i(run_id, shard, input)
), created AS (
    INSERT INTO eec_workflow_run (run_id, workflow_name, workflow_version, status, node_states,
                                  last_transition_seq, state_checksum, tier, shard, input,
                                  next_wakeup_at, start_at, tags)
    SELECT g.run_id, %(name)s, %(version)s, %(status)s, %(nodes)s::jsonb, 0, %(checksum)s,
           %(tier)s, g.shard, g.input,
           greatest(now(), to_timestamp(%(start_ms)s::bigint / 1000.0)),
           to_timestamp(%(start_ms)s::bigint / 1000.0), %(tags)s::jsonb
      FROM given g
    ON CONFLICT (run_id) DO NOTHING
    RETURNING run_id
)
SELECT run_id, NULL::text, NULL::integer, NULL::boolean, NULL::text FROM created
UNION ALL
SELECT r.run_id, r.workflow_name, r.workflow_version, r.input = g.input, r.tier
  FROM given g
 CROSS JOIN LATERAL (
       SELECT x.run_id, x.workflow_name, x.workflow_version, x.input, x.tier
         FROM eec_workflow_run x WHERE x.run_id = g.run_id LIMIT 1
       ) r
 WHERE g.run_id NOT IN (SELECT run_id FROM created)
"""


def insert_runs(
    conn: psycopg.Connection[Any],
    wf: WorkflowDef,
    runs: Sequence[tuple[str, Any]],
    tier: str,
    start_ms: int | None = None,
    tags: Mapping[str, str] | None = None,
) -> InsertedRuns:
    """Insert new runs idempotently (an existing run id is left alone, and reported with its
    workflow and whether its input is the same), in one statement.
    A run created takes the signals ``ductor.requests`` kept for it that can land there
    (io/postgres/kept_signals.py).
    A new run is due at once (``next_wakeup_at``): should its start wakeup never reach a
    processor (the broker was unreachable, the client died before producing it), the overdue
    sweep starts it. With ``start_ms`` (epoch ms) it is due then, and does not start before
    (``start_at``: its tick is a no-op until then, whatever wakes it). ``tags`` (checked by
    the caller: core/run_search.tags_problem) are the same for every run of the batch."""
    state = initial_state(wf)
    ids = [r[0] for r in runs]
    inputs = [orjson.dumps(r[1]).decode() for r in runs]
    rows = conn.execute(
        _INSERT_RUNS,
        {
            "ids": ids,
            "shards": [run_shard(i) for i in ids],
            "inputs": inputs,
            "name": wf.name,
            "version": wf.version,
            "status": state.status.value,
            "nodes": orjson.dumps(state.nodes_json()).decode(),
            "checksum": state_checksum(state),
            "tier": tier,
            "start_ms": start_ms,
            "tags": orjson.dumps(tags or {}).decode(),
        },
    ).fetchall()
    created = [r[0] for r in rows if r[1] is None]
    take_kept_signals(conn, wf, created)
    existing = [ExistingRun(r[0], (r[1], r[2]), bool(r[3]), r[4]) for r in rows if r[1] is not None]
    seen = {*created, *(e.run_id for e in existing)}
    unseen = [(run_id, i) for run_id, i in zip(ids, inputs, strict=True) if run_id not in seen]
    if unseen:
        # Inserted by another transaction after this statement's snapshot was taken (two
        # starts of one id at once): rare, so read at the cost of a second statement.
        existing += _existing(conn, dict(unseen))
    return InsertedRuns(created, existing)


def _existing(conn: psycopg.Connection[Any], inputs: dict[str, str]) -> list[ExistingRun]:
    rows = conn.execute(
        "SELECT r.run_id, r.workflow_name, r.workflow_version, r.input = g.input, r.tier"
        "  FROM unnest(%s::text[], %s::jsonb[]) AS g(run_id, input)"
        "  JOIN eec_workflow_run r ON r.run_id = g.run_id",
        (list(inputs), list(inputs.values())),
    ).fetchall()
    return [ExistingRun(r[0], (r[1], r[2]), bool(r[3]), r[4]) for r in rows]


def insert_signal(
    conn: psycopg.Connection[Any],
    run_id: str,
    signal_id: str,
    name: str | SignalKind,
    payload: Any = None,
) -> bool:
    """Record signal ``name`` (with ``payload``, {} when None) for the run, once per
    ``signal_id``; True when this call recorded it."""
    row = conn.execute(
        "INSERT INTO eec_run_signal (run_id, signal_id, kind, payload) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT DO NOTHING RETURNING 1",
        (run_id, signal_id, str(name), orjson.dumps({} if payload is None else payload).decode()),
    ).fetchone()
    return row is not None


def insert_cancels(conn: psycopg.Connection[Any], run_ids: Sequence[str], signal_id: str) -> None:
    """Record a cancel signal ``signal_id`` for each run, in one statement (idempotent)."""
    conn.execute(
        "INSERT INTO eec_run_signal (run_id, signal_id, kind)"
        " SELECT unnest(%s::text[]), %s, %s ON CONFLICT DO NOTHING",
        (list(run_ids), signal_id, str(SignalKind.CANCEL)),
    )


def run_columns(conn: psycopg.Connection[Any], run_id: str) -> RunColumns | None:
    """The run row's columns as stored (readable or not), or None if there is no such run."""
    row = conn.execute(
        "SELECT r.db_record_version, r.next_wakeup_at, r.created_at, r.updated_at,"
        "       r.failure_reason, r.workflow_name, r.workflow_version, r.status, r.tier,"
        f"      {flag_column('r', 'quarantined_at')}, {flag_column('r', 'reason')},"
        "       r.start_at, r.tags"
        " FROM eec_workflow_run r WHERE r.run_id = %s",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    version, next_wakeup_at, created, updated, failure, wf_name, wf_version, *rest = row
    status, tier, quarantined_at, quarantine_reason, start_at, tags = rest
    return RunColumns(
        version,
        next_wakeup_at,
        created,
        updated,
        failure,
        (wf_name, wf_version),
        status,
        tier,
        quarantined_at,
        quarantine_reason,
        start_at,
        tags or {},
    )


def run_result(conn: psycopg.Connection[Any], run_id: str) -> RunResult | None:
    """The run's status, output and failure reason, or None if there is no such run."""
    row = conn.execute(
        "SELECT status, output, failure_reason FROM eec_workflow_run WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    return None if row is None else RunResult(run_id, RunStatus(row[0]), row[1], row[2])


# The release deletes the flag and moves the row's version, conditioned on the version the
# flag holds for: a versioned write, the only one to the run row that is not a tick's
# (docs/guarantees.md). Moving the version voids what was decided on the row before the
# release: a flag still on its way is not written (io/postgres/store.py), and a commit computed from
# the row before its repair conflicts instead of overwriting the repair.
_RELEASE_SQL = """
WITH released AS (
    DELETE FROM eec_run_quarantine f USING eec_workflow_run r
     WHERE f.run_id = %(run_id)s AND r.run_id = f.run_id AND r.db_record_version = f.run_version
    RETURNING f.run_id, f.run_version
)
UPDATE eec_workflow_run r SET db_record_version = r.db_record_version + 1
  FROM released
 WHERE r.run_id = released.run_id AND r.db_record_version = released.run_version
RETURNING r.run_id
"""


def release_quarantine(conn: psycopg.Connection[Any], run_id: str) -> bool:
    """Clear a run's quarantine flag (its row was repaired); False if it was not flagged. The
    row is locked first (waited for: an operator's command, not the commit path), so the
    flag read and the version moved are the row's as it is."""
    with conn.transaction():
        conn.execute(
            "SELECT 1 FROM eec_workflow_run WHERE run_id = %s FOR NO KEY UPDATE", (run_id,)
        )
        return conn.execute(_RELEASE_SQL, {"run_id": run_id}).fetchone() is not None


def run_tier(conn: psycopg.Connection[Any], run_id: str) -> str | None:
    """The wakeup tier of the run, or None if there is no such run."""
    row = conn.execute("SELECT tier FROM eec_workflow_run WHERE run_id = %s", (run_id,)).fetchone()
    return None if row is None else str(row[0])


def like_prefix(prefix: str) -> str:
    """A LIKE pattern matching the strings that start with ``prefix`` (its % and _ literal)."""
    escaped = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


def statuses(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> dict[str, str]:
    """The status of each of ``run_ids`` that exists."""
    rows = conn.execute(
        "SELECT run_id, status FROM eec_workflow_run WHERE run_id = ANY(%s)", (list(run_ids),)
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def statuses_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> dict[str, str]:
    """The status of every run whose id starts with ``prefix``, by run id."""
    rows = conn.execute(
        "SELECT run_id, status FROM eec_workflow_run WHERE run_id LIKE %s", (like_prefix(prefix),)
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def count_ticked_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> int:
    """How many runs whose id starts with ``prefix`` were ticked at least once."""
    row = conn.execute(
        "SELECT count(*) FROM eec_workflow_run WHERE run_id LIKE %s AND last_transition_seq >= 1",
        (like_prefix(prefix),),
    ).fetchone()
    return int(row[0]) if row else 0


def count_ticked(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> int:
    """How many of ``run_ids`` were ticked at least once."""
    row = conn.execute(
        "SELECT count(*) FROM eec_workflow_run WHERE run_id = ANY(%s) AND last_transition_seq >= 1",
        (list(run_ids),),
    ).fetchone()
    return int(row[0]) if row else 0


def count_ended(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> int:
    """How many of ``run_ids`` reached a terminal status."""
    row = conn.execute(
        "SELECT count(*) FROM eec_workflow_run"
        " WHERE run_id = ANY(%s) AND status IN ('succeeded', 'failed', 'cancelled')",
        (list(run_ids),),
    ).fetchone()
    return int(row[0]) if row else 0


def outcomes_with_prefix(
    conn: psycopg.Connection[Any], prefix: str
) -> dict[tuple[str, str | None], int]:
    """How many runs whose id starts with ``prefix`` are in each (status, failure reason)."""
    rows = conn.execute(
        "SELECT status, failure_reason, count(*) FROM eec_workflow_run WHERE run_id LIKE %s"
        " GROUP BY 1, 2",
        (like_prefix(prefix),),
    ).fetchall()
    return {(r[0], r[1]): int(r[2]) for r in rows}


def live_runs_with_prefix(
    conn: psycopg.Connection[Any], prefix: str, limit: int
) -> list[tuple[str, str, Any, datetime | None]]:
    """Up to ``limit`` runs whose id starts with ``prefix`` that have not ended: run id,
    status, node states and next wakeup time (to show why they did not end)."""
    rows = conn.execute(
        "SELECT run_id, status, node_states, next_wakeup_at FROM eec_workflow_run"
        " WHERE run_id LIKE %s AND status IN ('pending', 'running') ORDER BY run_id LIMIT %s",
        (like_prefix(prefix), limit),
    ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def count_outbox_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> int:
    """Outbox rows (effects not yet acknowledged) of the runs whose id starts with ``prefix``."""
    row = conn.execute(
        "SELECT count(*) FROM eec_outbox WHERE run_id LIKE %s", (like_prefix(prefix),)
    ).fetchone()
    return int(row[0]) if row else 0


def delete_runs_with_prefix(conn: psycopg.Connection[Any], prefix: str) -> int:
    """Delete the runs whose id starts with ``prefix`` (their signals go with them by
    cascade, their results, outbox rows, step attempts, map items, kept signals and marks
    explicitly); returns how many were deleted."""
    pattern = like_prefix(prefix)
    conn.execute("DELETE FROM eec_kept_signal WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_run_rewake WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_run_quarantine WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_step_result WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_outbox WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_step_attempt WHERE run_id LIKE %s", (pattern,))
    conn.execute("DELETE FROM eec_map_item WHERE run_id LIKE %s", (pattern,))
    cur = conn.execute("DELETE FROM eec_workflow_run WHERE run_id LIKE %s", (pattern,))
    return cur.rowcount


def vacuum_runs(conn: psycopg.Connection[Any]) -> None:
    """VACUUM (ANALYZE) the run table and the tables the workers read with it: dead rows gone
    and statistics fresh (the benchmark starts from there: a statement planned on the
    statistics of a table just emptied reads it the wrong way once it has grown). Needs an
    autocommit connection."""
    conn.execute("VACUUM (ANALYZE) eec_workflow_run, eec_step_result, eec_step_attempt")
