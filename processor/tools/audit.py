"""An audit trail of every committed write to a run row, and the checks made over it: no
transition applied twice, no step attempt dispatched or resolved twice, each succeeded node's
result recorded, no write that left the row's version where it was, and which attempts ended
by their deadline.

The trail is two triggers on ``eec_workflow_run`` writing one row per UPDATE in the same
transaction, so it holds exactly the writes that committed: one for the writes of a run's
state, one for any write that does not move ``db_record_version`` (the run row has one
writer, the versioned write: docs/guarantees.md). The integration tests install it (the
``audit`` fixture) and so does the chaos run (``processor.tools.chaos``); both use the checks
below. It slows every write a little: never install it on a production database.

A failed check raises ``AuditFailure`` (an AssertionError, so pytest reports it as one).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from processor.io.postgres.run_counts import like_prefix

_INSTALL_SQL = """
CREATE TABLE IF NOT EXISTS test_run_audit (
    id bigserial PRIMARY KEY, run_id text, old_version bigint, new_version bigint,
    old_seq bigint, new_seq bigint, old_nodes jsonb, new_nodes jsonb, new_status text);
-- When the write was made (tables made before the column existed get it here).
ALTER TABLE test_run_audit ADD COLUMN IF NOT EXISTS
    at timestamptz NOT NULL DEFAULT clock_timestamp();
CREATE OR REPLACE FUNCTION test_run_audit_fn() RETURNS trigger AS $$
BEGIN
  INSERT INTO test_run_audit (run_id, old_version, new_version, old_seq, new_seq,
                              old_nodes, new_nodes, new_status)
  VALUES (OLD.run_id, OLD.db_record_version, NEW.db_record_version, OLD.last_transition_seq,
          NEW.last_transition_seq, OLD.node_states, NEW.node_states, NEW.status);
  RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS test_run_audit_trg ON eec_workflow_run;
-- Writes of a run's state only (`runs release` moves the version alone, so that decisions made
-- before it are void: not a write of its state).
CREATE TRIGGER test_run_audit_trg AFTER UPDATE ON eec_workflow_run
    FOR EACH ROW WHEN (OLD.last_transition_seq IS DISTINCT FROM NEW.last_transition_seq
                       OR OLD.status IS DISTINCT FROM NEW.status
                       OR OLD.node_states IS DISTINCT FROM NEW.node_states
                       OR OLD.state_checksum IS DISTINCT FROM NEW.state_checksum)
    EXECUTE FUNCTION test_run_audit_fn();
-- Every write that leaves the version where it was, with the columns it changed (none: a write
-- of the same values, which still writes a new row version and holds the row's lock).
CREATE TABLE IF NOT EXISTS test_run_unversioned (
    id bigserial PRIMARY KEY, run_id text, version bigint, changed text[],
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE OR REPLACE FUNCTION test_run_unversioned_fn() RETURNS trigger AS $$
BEGIN
  INSERT INTO test_run_unversioned (run_id, version, changed)
  SELECT OLD.run_id, OLD.db_record_version, coalesce(array_agg(n.key ORDER BY n.key), '{}')
    FROM jsonb_each(to_jsonb(NEW)) n
   WHERE n.value IS DISTINCT FROM to_jsonb(OLD) -> n.key;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
DROP TRIGGER IF EXISTS test_run_unversioned_trg ON eec_workflow_run;
CREATE TRIGGER test_run_unversioned_trg AFTER UPDATE ON eec_workflow_run
    FOR EACH ROW WHEN (OLD.db_record_version IS NOT DISTINCT FROM NEW.db_record_version)
    EXECUTE FUNCTION test_run_unversioned_fn();
"""


class AuditFailure(AssertionError):
    """A check over the audit trail failed; the message names the first offending runs."""


@dataclass(frozen=True)
class TimedOut:
    """A step attempt that ended because its deadline passed (tick rule 4)."""

    run_id: str
    node: str
    attempt: int
    # epoch ms: the attempt's deadline: its start plus its timeout (core/tick.py, rule 4; its
    # dispatch plus its timeout when it was judged at that first look, having started then)
    deadline_ms: int
    at: datetime  # when the write that timed it out was made
    result_at: datetime | None  # when a worker recorded the attempt's result (None: never)


def install(conn: psycopg.Connection[Any]) -> None:
    """Create the trail (if missing) and the trigger that fills it."""
    conn.execute(_INSTALL_SQL)


def clear(conn: psycopg.Connection[Any], run_prefix: str = "") -> None:
    """Forget the trail: all of it, or the rows of the runs whose id starts with the prefix."""
    for table in ("test_run_audit", "test_run_unversioned"):
        if run_prefix:
            conn.execute(f"DELETE FROM {table} WHERE run_id LIKE %s", (like_prefix(run_prefix),))
        else:
            conn.execute(f"TRUNCATE {table}")


def uninstall(conn: psycopg.Connection[Any]) -> None:
    """Remove the triggers (the trail's rows stay until ``clear``)."""
    conn.execute("DROP TRIGGER IF EXISTS test_run_audit_trg ON eec_workflow_run")
    conn.execute("DROP TRIGGER IF EXISTS test_run_unversioned_trg ON eec_workflow_run")


def unversioned_writes(conn: psycopg.Connection[Any], run_prefix: str = "") -> Counter[str]:
    """The writes to run rows that left their version where it was (of every run, or of the
    runs whose id starts with ``run_prefix``), counted by the columns each changed."""
    rows = conn.execute(
        "SELECT array_to_string(changed, ', '), count(*) FROM test_run_unversioned"
        " WHERE run_id LIKE %s GROUP BY 1",
        (like_prefix(run_prefix),),
    ).fetchall()
    return Counter({(changed or "nothing"): n for changed, n in rows})


def assert_every_write_versioned(conn: psycopg.Connection[Any], run_prefix: str = "") -> None:
    """No write to a run row left its version where it was: the row has one writer, the
    versioned write (a committed tick, or `runs release` moving the version alone)."""
    found = unversioned_writes(conn, run_prefix)
    if found:
        example = conn.execute(
            "SELECT run_id, changed FROM test_run_unversioned WHERE run_id LIKE %s"
            " ORDER BY id LIMIT 5",
            (like_prefix(run_prefix),),
        ).fetchall()
        raise AuditFailure(
            f"{sum(found.values())} writes did not move the run row's version,"
            f" by the columns they changed: {dict(found)}; the first: {example}"
        )


def assert_transitions_applied_once(conn: psycopg.Connection[Any], run_prefix: str = "") -> int:
    """Every committed write moved its run by exactly one version and one seq, no version was
    written twice, each attempt of each node was dispatched once and resolved at most once
    (of every run, or of the runs whose id starts with ``run_prefix``).

    Returns how many writes were checked.
    """
    rows = conn.execute(
        "SELECT run_id, old_version, new_version, old_seq, new_seq, old_nodes, new_nodes"
        " FROM test_run_audit WHERE run_id LIKE %s ORDER BY id",
        (like_prefix(run_prefix),),
    ).fetchall()
    # (run id, db_record_version): the row version each write started from (not a workflow's
    # version: no two writes may start from the same one).
    from_versions: Counter[tuple[str, int]] = Counter()
    dispatched: Counter[tuple[str, str, int]] = Counter()
    resolved: Counter[tuple[str, str, int]] = Counter()
    for run_id, old_v, new_v, old_seq, new_seq, old_nodes, new_nodes in rows:
        _check(new_v == old_v + 1, f"{run_id}: version jumped {old_v} -> {new_v}")
        _check(new_seq == old_seq + 1, f"{run_id}: seq moved {old_seq} -> {new_seq}")
        from_versions[(run_id, old_v)] += 1
        for node, old in old_nodes.items():
            if node not in new_nodes and old["status"] == "dispatched":
                resolved[(run_id, node, old["attempt"])] += 1  # a map's item that succeeded
        for node, new in new_nodes.items():
            old = old_nodes.get(node, {"status": "pending", "attempt": 0})
            if new["status"] == "dispatched" and (old["status"], old["attempt"]) != (
                "dispatched",
                new["attempt"],
            ):
                dispatched[(run_id, node, new["attempt"])] += 1
            if old["status"] == "dispatched" and (new["status"], new["attempt"]) != (
                "dispatched",
                old["attempt"],
            ):
                resolved[(run_id, node, old["attempt"])] += 1
    twice = [k for k, n in from_versions.items() if n > 1]
    _check(not twice, f"versions written twice: {twice[:5]}")
    redispatched = [k for k, n in dispatched.items() if n > 1]
    _check(not redispatched, f"attempts dispatched twice: {redispatched[:5]}")
    reapplied = [k for k, n in resolved.items() if n > 1]
    _check(not reapplied, f"attempt outcomes applied twice: {reapplied[:5]}")
    return len(rows)


def assert_results_applied(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> None:
    """Each succeeded node's final attempt has a recorded success, and no later attempt ran."""
    rows = conn.execute(
        """
        SELECT r.run_id, n.key, (n.value->>'attempt')::int,
               (SELECT max(s.attempt) FROM eec_step_result s
                 WHERE s.run_id = r.run_id AND s.node_id = n.key),
               (SELECT s.outcome FROM eec_step_result s
                 WHERE s.run_id = r.run_id AND s.node_id = n.key
                   AND s.attempt = (n.value->>'attempt')::int)
          FROM eec_workflow_run r, jsonb_each(r.node_states) n
         WHERE r.run_id = ANY(%s) AND r.status = 'succeeded'
        """,
        (list(run_ids),),
    ).fetchall()
    for run_id, node, attempt, max_recorded, outcome in rows:
        _check(outcome == "succeeded", f"{run_id}/{node}: attempt {attempt} has result {outcome}")
        _check(
            max_recorded == attempt,
            f"{run_id}/{node}: results up to {max_recorded}, node at {attempt}",
        )


def timed_out_attempts(conn: psycopg.Connection[Any], run_prefix: str = "") -> list[TimedOut]:
    """The attempts a committed write ended by their deadline: the node was dispatched at that
    attempt and the write left it waiting to retry, or failed, with the tick's "timed out"
    error (a step that answered in time ends with its own result instead)."""
    rows = conn.execute(
        """
        SELECT a.run_id, n.key, (o.value->>'attempt')::int, (o.value->>'due_ms')::bigint, a.at,
               (SELECT s.recorded_at FROM eec_step_result s
                 WHERE s.run_id = a.run_id AND s.node_id = n.key
                   AND s.attempt = (o.value->>'attempt')::int)
          FROM test_run_audit a, jsonb_each(a.new_nodes) n, jsonb_each(a.old_nodes) o
         WHERE a.run_id LIKE %s
           AND o.key = n.key
           AND o.value->>'status' = 'dispatched'
           AND n.value->>'status' IN ('retry_wait', 'failed')
           AND n.value->>'attempt' = o.value->>'attempt'
           AND n.value->>'error' LIKE 'attempt %% timed out%%'
         ORDER BY a.id
        """,
        (like_prefix(run_prefix),),
    ).fetchall()
    return [TimedOut(*row) for row in rows]


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AuditFailure(message)
