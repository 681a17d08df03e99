"""Postgres off the hot paths: inserting runs and signals, reading a run for inspection,
releasing a quarantined one. Registering workflows is in ``workflows.py``, the queries the
demo, the benchmark and the tests make about their own runs in ``run_counts.py``.

Like ``store.py``, every statement is one round trip on an autocommit connection.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import orjson
import psycopg

from processor.core.model import SignalKind
from processor.core.routing import run_shard
from processor.core.run_state import RunStatus, initial_state, state_checksum
from processor.core.shapes import WorkflowKey
from processor.core.workflow_def import WorkflowDef
from processor.io.postgres.kept_signals import take_kept_signals
from processor.io.postgres.run_marks import flag_column
from processor.io.postgres.run_tags import merged_tags


@dataclass(frozen=True)
class RunColumns:
    """The bookkeeping columns of a run row that its loaded state does not carry."""

    version: int
    next_wakeup_at: datetime | None
    created_at: datetime
    updated_at: datetime
    failure_reason: str | None
    workflow: WorkflowKey
    status: str  # as stored (a row that cannot be loaded still has one)
    tier: str
    quarantined_at: datetime | None
    quarantine_reason: str | None
    start_at: datetime | None = None  # started for later: not before then
    # Given at its start, with those its steps set (io/postgres/run_tags.py).
    tags: Mapping[str, str] = field(default_factory=dict)
    deadline_at: datetime | None = None  # when it must have ended (core/deadlines.py)
    timeout_ms: int | None = None  # the timeout its deadline came from


@dataclass(frozen=True)
class RunResult:
    """Where a run stands and what it gave: its status, its output (None while it has not
    succeeded, or when its workflow declares none) and why it failed or was cancelled."""

    run_id: str
    status: RunStatus
    output: Any
    failure_reason: str | None
    # What became of its saga (core/sagas.py ``compensation_of``): "none", "running",
    # "completed", "failed" or "stopped".
    compensation: str = "none"

    @property
    def finished(self) -> bool:
        return self.status.terminal


@dataclass(frozen=True)
class RunSummary:
    """A run as ``ductor runs list`` shows it."""

    run_id: str
    workflow: WorkflowKey
    status: RunStatus
    last_transition_at: datetime
    failure_reason: str | None
    quarantine_reason: str | None  # None unless the run is quarantined
    created_at: datetime | None = None
    tags: Mapping[str, str] = field(default_factory=dict)  # with those set by its steps


@dataclass(frozen=True)
class ExistingRun:
    """A run id given to ``insert_runs`` that a run had already: its workflow, and whether it
    was started with the same input (jsonb equality: key order and spacing do not count)."""

    run_id: str
    workflow: WorkflowKey
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
                                  next_wakeup_at, start_at, tags, timeout_ms, deadline_at)
    SELECT g.run_id, %(name)s, %(version)s, %(status)s, %(nodes)s::jsonb, 0, %(checksum)s,
           %(tier)s, g.shard, g.input,
           greatest(now(), to_timestamp(%(start_ms)s::bigint / 1000.0)),
           to_timestamp(%(start_ms)s::bigint / 1000.0), %(tags)s::jsonb, %(timeout_ms)s,
           greatest(now(), to_timestamp(%(start_ms)s::bigint / 1000.0))
               + %(timeout_ms)s::bigint * interval '1 millisecond'
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
    timeout_ms: int | None = None,
) -> InsertedRuns:
    """Insert new runs idempotently (an existing run id is left alone, and reported with its
    workflow and whether its input is the same), in one statement.
    A run created takes the signals ``ductor.requests`` kept for it that can land there
    (io/postgres/kept_signals.py).
    A new run is due at once (``next_wakeup_at``): should its start wakeup never reach a
    processor (the broker was unreachable, the client died before producing it), the overdue
    sweep starts it. With ``start_ms`` (epoch ms) it is due then, and does not start before
    (``start_at``: its tick is a no-op until then, whatever wakes it). ``tags`` (checked by
    the caller: core/run_search.tags_problem) are the same for every run of the batch.
    ``timeout_ms`` (checked by the caller: core/deadlines.timeout_problem; None: the
    workflow's) gives each run its deadline, that long after it may start."""
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
            "timeout_ms": wf.timeout_ms if timeout_ms is None else timeout_ms,
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


def restart_deadline(conn: psycopg.Connection[Any], run_id: str) -> None:
    """Give a run just resumed by ``ductor runs retry`` its whole timeout again, from now
    (core/deadlines.py), in the transaction of the commit that resumed it: the deadline that
    failed it would otherwise fail it again at its next tick. Its next wakeup is the new
    deadline (a resumed state has no due time of its own)."""
    conn.execute(
        "UPDATE eec_workflow_run SET deadline_at = now() + timeout_ms * interval '1 millisecond',"
        " next_wakeup_at = now() + timeout_ms * interval '1 millisecond'"
        " WHERE run_id = %s AND timeout_ms IS NOT NULL",
        (run_id,),
    )


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
        f"       r.start_at, {merged_tags('r')}, r.deadline_at, r.timeout_ms"
        " FROM eec_workflow_run r WHERE r.run_id = %s",
        (run_id,),
    ).fetchone()
    if row is None:
        return None
    version, next_wakeup_at, created, updated, failure, wf_name, wf_version, *rest = row
    status, tier, quarantined_at, quarantine_reason, start_at, tags, deadline, timeout = rest
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
        deadline,
        timeout,
    )


# A run's compensation as core/sagas.py's ``compensation_of`` reads it, from its row's node
# states: its saga's nodes are named ``undo(step)`` (a workflow with compensations names no
# step so), and a failed one stops it.
COMPENSATION_SQL = """(SELECT CASE WHEN count(*) = 0 THEN 'none'
            WHEN bool_or(v ->> 'status' = 'failed') THEN 'failed'
            WHEN bool_and(v ->> 'status' = 'succeeded') THEN 'completed'
            WHEN status IN ('pending', 'running') THEN 'running'
            ELSE 'stopped' END
       FROM jsonb_each(node_states) AS e(k, v) WHERE k LIKE 'undo(%%)')"""


def run_result(conn: psycopg.Connection[Any], run_id: str) -> RunResult | None:
    """The run's status, output and failure reason, or None if there is no such run."""
    row = conn.execute(
        f"SELECT status, output, failure_reason, {COMPENSATION_SQL} FROM eec_workflow_run"
        " WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    return None if row is None else RunResult(run_id, RunStatus(row[0]), row[1], row[2], row[3])


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
