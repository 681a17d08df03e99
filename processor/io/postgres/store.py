"""Postgres on the hot paths: the coordinator's batched load, the seed's versioned conditional
UPDATE (batched), the force-fail write and the watchdog's sweeps; the workers' idempotent
insert of step results. The statements' text is in ``load_sql.py`` and ``commit_sql.py``, the
outbox's rows in ``outbox.py``; registration, starting runs, signals and inspection in
``runs_admin.py``.

Every statement is a single round trip on an autocommit connection: one statement is atomic on
its own, so no transaction is ever left open between steps of the commit path.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import orjson
import psycopg

from processor.core.batch_values import ForceFailWritten, QuarantineFlag
from processor.core.load_row import LoadRow, loaded_run
from processor.core.model import Loaded, LoadedRun, UnknownWorkflow
from processor.core.plans import Commit, Send
from processor.core.routing import run_shard
from processor.core.run_state import RunState, row_checksum, state_checksum
from processor.core.shapes import OutboxKey, WorkflowKey
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import ValidationError, WorkflowDef
from processor.io.postgres import limit_store
from processor.io.postgres.commit_sql import (
    COMMIT_SQLS,
    FORCE_FAIL_SQL,
    QUARANTINE_SQL,
    QUARANTINE_WHY_CHARS,
)
from processor.io.postgres.load_sql import INPUT_LOAD_BYTES, LOAD_SQL
from processor.io.postgres.outbox import delete_outbox, outbox_record, pairs
from processor.io.postgres.selected import read_selected, wanted


class Definitions:
    """Workflow definitions by (name, version). Registered versions are immutable, so cache."""

    def __init__(self) -> None:
        self._cache: dict[WorkflowKey, WorkflowDef] = {}

    def get(self, conn: psycopg.Connection[Any], key: WorkflowKey) -> WorkflowDef:
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        row = conn.execute(
            "SELECT definition FROM eec_workflow_definition WHERE name = %s AND version = %s", key
        ).fetchone()
        if row is None:
            raise UnknownWorkflow(f"workflow {key[0]!r} version {key[1]} is not registered")
        try:
            wf = parse_workflow(row[0])
        except ValidationError as exc:  # written by hand: its runs cannot be ticked
            raise UnknownWorkflow(
                f"workflow {key[0]!r} version {key[1]} cannot be read: {exc}"
            ) from None
        self._cache[key] = wf
        return wf

    def latest(self, conn: psycopg.Connection[Any], name: str) -> WorkflowDef:
        row = conn.execute(
            "SELECT max(version) FROM eec_workflow_definition WHERE name = %s", (name,)
        ).fetchone()
        if row is None or row[0] is None:
            raise UnknownWorkflow(f"workflow {name!r} is not registered")
        return self.get(conn, (name, int(row[0])))


def load_runs(
    conn: psycopg.Connection[Any], definitions: Definitions, run_ids: Iterable[str]
) -> dict[str, Loaded]:
    """Load many runs in one round trip. Runs that do not exist are absent from the result."""
    return load_runs_at(conn, definitions, run_ids)[0]


# A child run's row as its parent's commit writes it: pending, no node written yet (read
# back as every node pending: model.state_from_row), at seq 0.
NEW_CHILD_CHECKSUM = row_checksum("pending", {}, 0, None)


def load_runs_at(
    conn: psycopg.Connection[Any], definitions: Definitions, run_ids: Iterable[str]
) -> tuple[dict[str, Loaded], int]:
    """``load_runs``, and Postgres's time of the load (epoch ms): the time the batch's ticks
    are judged at (io/postgres/db_clock.py)."""
    # Ids travel as one JSON array: one orjson call instead of escaping an array element-wise.
    # The whole batch comes back as one JSON document: one orjson call instead of psycopg
    # converting every column of every row.
    ids = orjson.dumps(list(run_ids)).decode()
    found = conn.execute(LOAD_SQL, (INPUT_LOAD_BYTES, ids)).fetchone()
    assert found is not None
    loaded: dict[str, Loaded] = {}
    for raw in orjson.loads(found[0]):
        row = LoadRow(*raw)
        try:
            wf = definitions.get(conn, row.workflow)
        except UnknownWorkflow as exc:
            loaded[row.run_id] = UnknownWorkflow(str(exc), row.version)
            continue
        loaded[row.run_id] = loaded_run(row, wf)
    # Steps that read values of the run before they start (a sleep's until, a condition):
    # what their selectors find, in one more statement, only when a run of the batch has one
    # about to start (io/postgres/selected.py).
    queries = [q for run in loaded.values() if isinstance(run, LoadedRun) for q in wanted(run)]
    if queries:
        for run_id, selected in read_selected(conn, queries).items():
            run = loaded[run_id]
            assert isinstance(run, LoadedRun)
            loaded[run_id] = run.with_selected(selected)
    return loaded, int(found[1])


class CommitAnswer(NamedTuple):
    """What a batched commit did: the runs it committed, and those it skipped because another
    transaction held their row (the others of the batch lost their version race)."""

    committed: set[str]
    locked: set[str]


def commit_batch(
    conn: psycopg.Connection[Any],
    commits: Sequence[Commit],
    acknowledged: Sequence[OutboxKey] = (),
    owner: str | None = None,
) -> CommitAnswer:
    """The batched conditional UPDATE, with each transition's records into the outbox (owned
    by ``owner``, the committing instance) and the ``acknowledged`` (run_id, seq) outbox rows
    deleted."""
    if not commits:
        delete_outbox(conn, acknowledged)
        return CommitAnswer(set(), set())
    params = commit_params(commits, acknowledged, owner)
    sql = COMMIT_SQLS[("guards" in params, any(c.unstarted for c in commits))]
    committed: set[str] = set()
    locked: set[str] = set()
    for run_id, updated in conn.execute(sql, params).fetchall():
        (committed if updated else locked).add(run_id)
    return CommitAnswer(committed, locked)


def commit_params(
    commits: Sequence[Commit], acknowledged: Sequence[OutboxKey], owner: str | None
) -> dict[str, Any]:
    """The parameters of the batched commit statement (commit_sql.py)."""
    # The whole batch travels as one JSON document: one orjson call instead of adapting
    # nine arrays element by element.
    params = {
        "ids": orjson.dumps([c.run_id for c in commits]).decode(),
        "batch": orjson.dumps([_commit_row(c) for c in commits]).decode(),
        "acked": pairs(acknowledged),
        "owner": owner,
        "new_child": NEW_CHILD_CHECKSUM,
    }
    if any(c.limits is not None for c in commits):  # the statement with limits' parts
        params["guards"] = limit_store.guards_param(commits)
    return params


def _commit_row(c: Commit) -> dict[str, Any]:
    state = c.state
    status, nodes = state.status, state.nodes_json()  # encoded once, hashed as written
    row = {
        "run_id": c.run_id,
        "expected_version": c.expected_version,
        "status": status,
        "node_states": nodes,
        "seq": state.seq,
        "checksum": row_checksum(status, nodes, state.seq, state.reason),
        "reason": state.reason,
        "next_wakeup_ms": state.next_due_ms(),
        "effects": [outbox_record(s) for s in c.effects] if c.effects else None,
    }
    if c.output is not None:
        row["output"] = c.output.to_json()
    if c.signalled:
        row["signalled"] = [{"node": n, "attempt": a, "signal_id": g} for n, a, g in c.signalled]
    if c.children:
        row["children"] = [
            {
                "run_id": k.run_id,
                "node": k.node,
                "attempt": k.attempt,
                "workflow": k.workflow,
                "version": k.version,
                "input_from": k.input_from,
                "input_attempt": k.input_attempt,
                "shard": run_shard(k.run_id),
            }
            for k in c.children
        ]
    if c.cancel_children:
        row["cancel_children"] = list(c.cancel_children)
    if c.limits is not None:
        row["limits"] = limit_store.limits_row(c)
    if c.mapped:
        row["mapped"] = [{"node": n, "attempt": a, "items": k} for n, a, k in c.mapped]
    if c.items:
        row["items"] = [{"node": n, "item": i, "attempt": a} for n, i, a in c.items]
    if c.unstarted:
        row["unstarted"] = [{"node": n, "attempt": a} for n, a in c.unstarted]
    if c.settled:
        row["settled"] = [{"node": n, "attempt": a, "output": o} for n, a, o in c.settled]
    return row


def commits_landed(conn: psycopg.Connection[Any], commits: Sequence[Commit]) -> set[str]:
    """Which of ``commits`` are in the table: the row is at the version the commit wrote, with
    the checksum of its state (for a commit whose answer was lost with its connection)."""
    expected = {c.run_id: (c.expected_version + 1, state_checksum(c.state)) for c in commits}
    rows = conn.execute(
        "SELECT run_id, db_record_version, state_checksum FROM eec_workflow_run"
        " WHERE run_id = ANY(%s)",
        (list(expected),),
    ).fetchall()
    return {run_id for run_id, version, checksum in rows if expected[run_id] == (version, checksum)}


def force_fail_write(
    conn: psycopg.Connection[Any],
    run_id: str,
    loaded_checksum: str,
    failed: RunState,
    cancel_children: Sequence[str] = (),
    effects: Sequence[Send] = (),
) -> ForceFailWritten:
    """Write a force-failed state if the run did not move since it was loaded; with it, a
    cancel signal for each of ``cancel_children`` and ``effects`` into the outbox (without
    an owner) as the failed transition's records. Its limit slots go with it (but those of
    executions still running): how many, by limit key, for their waiters to be woken."""
    params = {
        "status": failed.status.value,
        "nodes": orjson.dumps(failed.nodes_json()).decode(),
        "seq": failed.seq,
        "checksum": state_checksum(failed),
        "reason": failed.reason,
        "run_id": run_id,
        "loaded": loaded_checksum,
        "cancel": orjson.dumps(list(cancel_children)).decode(),
        "effects": orjson.dumps([outbox_record(s) for s in effects]).decode() if effects else None,
    }
    row = conn.execute(FORCE_FAIL_SQL, params).fetchone()
    if row is None or row[0] != 1:
        return ForceFailWritten(False, Counter())
    return ForceFailWritten(True, Counter({key: int(n) for key, n in row[1].items()}))


def quarantine_runs(conn: psycopg.Connection[Any], runs: Sequence[QuarantineFlag]) -> set[str]:
    """Flag runs whose rows cannot be used, with why, so the sweeps skip them, if their row
    is still at the version it was found at; returns the ones newly flagged (a run flagged
    already keeps its first reason)."""
    first: dict[str, QuarantineFlag] = {}
    for flag in runs:  # one row per run: an upsert may not meet the same key twice
        first.setdefault(flag.run_id, flag)
    flagged = orjson.dumps(
        [
            {"run_id": run_id, "why": why[:QUARANTINE_WHY_CHARS], "version": version}
            for run_id, why, version in first.values()
        ]
    ).decode()
    rows = conn.execute(QUARANTINE_SQL, {"flagged": flagged}).fetchall()
    return {r[0] for r in rows}
