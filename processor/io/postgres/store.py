"""Postgres on the hot paths: the coordinator's batched load, the seed's versioned conditional
UPDATE (batched), the force-fail write and the watchdog's sweeps; the workers' idempotent
insert of step results. Registration, starting runs, signals and inspection are in
``runs_admin.py``.

Every statement is a single round trip on an autocommit connection: one statement is atomic on
its own, so no transaction is ever left open between steps of the commit path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any, NamedTuple

import orjson
import psycopg

from processor.core.batch_values import QuarantineFlag as QuarantineFlag  # noqa: PLC0414 (re-exported)
from processor.core.decide import Commit, Send
from processor.core.model import (
    Loaded,
    LoadedRun,
    ParentLink,
    RunInput,
    RunState,
    SignalKind,
    Started,
    Starts,
    StepOutcome,
    StepResult,
    UnknownWorkflow,
    UnreadableRun,
    row_checksum,
    state_checksum,
    state_from_row,
)
from processor.core.routing import run_shard
from processor.core.step_task import MAX_INLINE_DATA_BYTES
from processor.core.workflow import ValidationError, WorkflowDef, parse_workflow
from processor.io.postgres import limit_store
from processor.io.postgres.instances import alive
from processor.io.postgres.step_attempts import UNSTARTED

# Every statement here selects rows by a batch of run ids that travels as one JSON array. The
# planner cannot see how many ids a set-returning function yields and assumes 100: against a
# run table of a few thousand rows it then hashes the batch and scans the whole table, which
# costs a small batch (a run or ten, the common case at moderate load) a millisecond or more
# per statement. `= ANY(ARRAY(SELECT ...))` makes the ids one array, estimated at ten
# elements, so the rows are found through the primary key whatever the table's size
# (docs/performance.md has the figures).
#
# What a live run's tick can use, whatever the run received. Its step results: a run with a
# map step (its state says so: ``items``) reads the result of each node at its attempt, a
# lookup per node, never the results of the items that left its state; any other run has as
# many results as its steps made attempts, read in one range of the key (cheaper than a
# lookup per node: most runs). Its signals, for a run that got any: one cancel and the first
# signal of each name its wait steps wait for (core/tick.py, rule 3; the names from its
# definition, an index lookup each), never every signal it got. Each LIMIT 1 keeps its lookup
# per row whatever the planner thinks of the tables (joined, it may read every row of the run).
_LOAD_SQL = """
SELECT coalesce(json_agg(json_build_array(
         r.run_id, r.workflow_name, r.workflow_version, r.status, r.node_states,
         r.last_transition_seq, r.state_checksum, r.db_record_version, r.failure_reason, r.tier,
         CASE WHEN r.status NOT IN ('pending', 'running') THEN NULL
              WHEN r.node_states @? '$.*.items' THEN
             (SELECT json_agg({result})
                FROM jsonb_each(r.node_states) AS n(node, st)
               CROSS JOIN LATERAL (
                     SELECT * FROM eec_step_result s
                      WHERE s.run_id = r.run_id AND s.node_id = n.node
                        AND s.attempt = (n.st ->> 'attempt')::int
                      LIMIT 1) AS s
               WHERE (n.st ->> 'attempt')::int > 0)
         ELSE
             (SELECT json_agg({result}) FROM eec_step_result s WHERE s.run_id = r.run_id)
         END,
         CASE WHEN r.status IN ('pending', 'running')
               AND EXISTS (SELECT 1 FROM eec_run_signal g WHERE g.run_id = r.run_id) THEN
             (SELECT json_agg(json_build_array(g.kind, g.signal_id)
                              ORDER BY g.received_at, g.signal_id)
                FROM (SELECT 'cancel' AS name
                      UNION
                      SELECT w ->> 'signal' FROM eec_workflow_definition d
                       CROSS JOIN LATERAL jsonb_array_elements(d.definition -> 'steps') AS w
                       WHERE d.name = r.workflow_name AND d.version = r.workflow_version
                         AND w ->> 'kind' = 'wait') AS wanted
               CROSS JOIN LATERAL (
                     SELECT g.kind, g.signal_id, g.received_at FROM eec_run_signal g
                      WHERE g.run_id = r.run_id AND g.kind = wanted.name
                      ORDER BY g.received_at, g.signal_id
                      LIMIT 1) AS g)
         END,
         CASE WHEN r.status = 'pending' AND pg_column_size(r.input) <= %s THEN
             json_build_array(r.input)
         END,
         CASE WHEN r.status = 'pending' THEN
             (extract(epoch FROM r.start_at) * 1000)::bigint
         END,
         CASE WHEN r.parent_run_id IS NOT NULL THEN
             json_build_array(r.parent_run_id, r.parent_node, r.parent_attempt)
         END,
         CASE WHEN r.status IN ('pending', 'running') AND jsonb_typeof(r.input) = 'array'
              THEN jsonb_array_length(r.input) END,
         {starts})), '[]')::text,
       (extract(epoch FROM now()) * 1000)::bigint
  FROM eec_workflow_run r
 WHERE r.run_id = ANY(ARRAY(SELECT jsonb_array_elements_text(%s::jsonb)))
""".replace(
    "{result}",
    """json_build_array(s.node_id, s.attempt, s.outcome, s.error, s.retryable,
                        CASE WHEN jsonb_typeof(s.output) = 'array'
                             THEN jsonb_array_length(s.output) END)""",
)
# What the workers recorded of the attempts in flight whose due time passed (core/tick.py, rule
# 4: their timeouts count from their start), read only for a run whose next wakeup passed (a
# step that answers in time never costs its run this read): for each such node, the claim of
# its attempt (or its start on a slot, when that came later: io/postgres/step_attempts.py) and its
# last heartbeat recorded, unless the claim never started (numbered past its worker's start
# permit). A node due by the tick's clock (the statement's ``now`` in ms, as returned) is due
# here: the gate on the row is a superset, the test on each node the same as the tick's.
_STARTS = f"""CASE WHEN r.status IN ('pending', 'running')
              AND r.next_wakeup_at <= now() + interval '1 millisecond' THEN
             coalesce((SELECT json_agg(json_build_array(n.node, a.attempt, a.started_ms,
                                                        a.beat_ms, a.reports))
                FROM jsonb_each(r.node_states) AS n(node, st)
               CROSS JOIN LATERAL (
                     SELECT a.attempt, (extract(epoch FROM a.started_at) * 1000)::bigint
                                       AS started_ms,
                            (extract(epoch FROM a.beat_at) * 1000)::bigint AS beat_ms,
                            a.reports
                       FROM eec_step_attempt a
                      WHERE a.run_id = r.run_id AND a.node_id = n.node
                        AND a.attempt = (n.st ->> 'attempt')::int AND a.starts > 0
                        AND NOT {UNSTARTED.format(a="a")}
                      LIMIT 1) AS a
               WHERE n.st ->> 'status' = 'dispatched'
                 AND (n.st ->> 'due_ms')::bigint <= (extract(epoch FROM now()) * 1000)::bigint),
                      '[]')
         END"""
_LOAD_SQL = _LOAD_SQL.replace("{starts}", _STARTS)

# The input of a pending run (its first tick dispatches its first steps) rides with the load,
# for those steps to carry it inline (core/dataflow.py); no other tick loads it. The stored
# size is only a first filter (a large input may be stored compressed); the task's encoder
# checks the bound exactly.
_INPUT_LOAD_BYTES = 2 * MAX_INLINE_DATA_BYTES

# The seed's conditional UPDATE, generalised to many rows: each run carries its own expected
# version, and a run whose version moved on simply matches no row (its conflict is detected
# individually by its absence from RETURNING). The same statement writes each committed
# transition's records to the outbox (so a crash after the commit cannot lose them) and
# deletes the outbox rows whose records the broker has acknowledged since the last commit.
# The commit that ends a run succeeded names the step results its declared output is made of
# (``output``, absent from every other row): the statement reads them and writes the output
# with the status, so no run is ever succeeded without it.
#
# Two instances committing overlapping batches would deadlock if each waited for the other's
# rows, and a row held by an outside transaction (an operator's `SELECT ... FOR UPDATE`, a
# repair script) would hold the whole batch. So the rows are first locked in run_id order
# without waiting: a row another transaction holds is skipped (SKIP LOCKED), its run is
# answered as locked (retried after a backoff, core/decide.py), and the rest of the batch
# commits at once. The lock mode is FOR NO KEY UPDATE (the key never changes); the workers'
# step-result inserts take no lock on the run's row at all (no foreign key:
# io/postgres/step_data.py), so commits and inserts never wait on each other. The UPDATE reads the
# locked rows as an array built once (an InitPlan, run before the UPDATE reads its first row, so
# every lock is taken first) and reaches them through the primary key; it never touches a row it did
# not lock. (Joining the CTE instead made Postgres compare each updated row with every locked one:
# quadratic in the batch, 80 % of the statement's time at 500 rows.) The runs skipped are
# listed only when there are any (a one-time filter on the count). The locks last only for
# this one statement: nothing is held between the load and the commit. A run that commits a
# transition is usable, whatever a quarantine flag said of it (it was repaired without
# `ductor runs release`): a flag holds for the version it was decided on only
# (io/postgres/run_marks.py), so the commit leaves it behind without writing it, and the sweeps
# enforce its deadlines. A map step's output (``m``: the map that ended), from its items' results by
# index: the items recorded by earlier commits (eec_map_item) and those this commit records
# (``{items}``).
_MAPPED_OUTPUT = """coalesce((
    SELECT jsonb_agg(s2.output ORDER BY p.item)
      FROM (SELECT i.item, i.attempt FROM eec_map_item i
             WHERE i.run_id = {run} AND i.node = m.node
            UNION ALL
            SELECT x.item, x.attempt
              FROM jsonb_to_recordset({items}) AS x(node text, item int, attempt int)
             WHERE x.node = m.node) AS p
      JOIN eec_step_result s2
        ON s2.run_id = {run} AND s2.node_id = m.node || '[' || p.item || ']'
       AND s2.attempt = p.attempt), '[]'::jsonb)"""

_COMMIT_TEMPLATE = f"""
WITH ordered AS MATERIALIZED (
    SELECT run_id FROM eec_workflow_run
     WHERE run_id = ANY(ARRAY(SELECT jsonb_array_elements_text(%(ids)s::jsonb)))
     ORDER BY run_id FOR NO KEY UPDATE SKIP LOCKED
), {{guarded_cte}}{{unstarted_cte}}updated AS (
UPDATE eec_workflow_run AS r
   SET db_record_version = r.db_record_version + 1,
       status = c.status,
       node_states = c.node_states,
       last_transition_seq = c.seq,
       state_checksum = c.checksum,
       failure_reason = c.reason,
       next_wakeup_at = to_timestamp(c.next_wakeup_ms / 1000.0),
       updated_at = now(),
       last_transition_at = now(),
       output = CASE WHEN c.output IS NULL THEN r.output ELSE (
           SELECT CASE WHEN (c.output ->> 'single')::boolean THEN (array_agg(v.output))[1]
                       ELSE jsonb_object_agg(v.key, v.output) END
             FROM (SELECT o.key, coalesce(s.output, g.payload, mm.output) AS output
                     FROM jsonb_to_recordset(c.output -> 'refs')
                          AS o(key text, node text, attempt int)
                     LEFT JOIN eec_step_result s
                       ON s.run_id = r.run_id AND s.node_id = o.node AND s.attempt = o.attempt
                     -- A wait step this very commit ends: its result is not written yet.
                     LEFT JOIN jsonb_to_recordset(c.signalled)
                          AS w(node text, attempt int, signal_id text)
                       ON s.run_id IS NULL AND w.node = o.node AND w.attempt = o.attempt
                     LEFT JOIN LATERAL (
                         SELECT g.run_id, g.payload FROM eec_run_signal g
                          WHERE g.run_id = r.run_id AND g.signal_id = w.signal_id
                          LIMIT 1) AS g ON true
                     -- A map step this very commit ends: its items' outputs, in order.
                     LEFT JOIN LATERAL (
                         SELECT {_MAPPED_OUTPUT.format(run="r.run_id", items="c.items")}
                                AS output
                           FROM jsonb_to_recordset(c.mapped) AS m(node text, attempt int)
                          WHERE s.run_id IS NULL AND m.node = o.node AND m.attempt = o.attempt
                     ) AS mm ON true
                    WHERE s.run_id IS NOT NULL OR g.run_id IS NOT NULL
                       OR mm.output IS NOT NULL) AS v)
       END
  FROM jsonb_to_recordset(%(batch)s::jsonb)
       AS c(run_id text, expected_version bigint, status text, node_states jsonb, seq bigint,
            checksum text, reason text, next_wakeup_ms bigint, effects jsonb, output jsonb,
            signalled jsonb, children jsonb, cancel_children jsonb, mapped jsonb, limits jsonb,
            items jsonb, unstarted jsonb)
 WHERE r.run_id = c.run_id
   AND r.run_id = ANY(ARRAY(SELECT run_id FROM ordered))
   AND r.db_record_version = c.expected_version{{guard_check}}{{unstarted_check}}
RETURNING r.run_id, c.seq, c.effects, c.signalled, c.children, c.cancel_children, c.mapped,
          c.limits, c.items, r.status,
          r.output, r.failure_reason, r.tier, r.parent_run_id, r.parent_node, r.parent_attempt
), started_children AS (
    -- core/children.py, rule 1: a child exists exactly when its parent's attempt does.
    INSERT INTO eec_workflow_run (run_id, workflow_name, workflow_version, status, node_states,
                                  last_transition_seq, state_checksum, tier, shard, input,
                                  next_wakeup_at, parent_run_id, parent_node, parent_attempt)
    SELECT k.run_id, d.name, d.version, 'pending', '{{}}'::jsonb, 0, %(new_child)s, u.tier,
           k.shard,
           CASE WHEN k.input_from IS NULL THEN
               (SELECT p.input FROM eec_workflow_run p WHERE p.run_id = u.run_id)
           ELSE coalesce(
               (SELECT s.output FROM eec_step_result s
                 WHERE s.run_id = u.run_id AND s.node_id = k.input_from
                   AND s.attempt = k.input_attempt),
               -- A step this very commit ends (its result is written by this statement,
               -- which cannot read it back): a wait step's signal, a map's items.
               (SELECT g.payload
                  FROM jsonb_to_recordset(u.signalled) AS w(node text, attempt int, signal_id text)
                  JOIN eec_run_signal g ON g.run_id = u.run_id AND g.signal_id = w.signal_id
                 WHERE w.node = k.input_from AND w.attempt = k.input_attempt LIMIT 1),
               (SELECT {_MAPPED_OUTPUT.format(run="u.run_id", items="u.items")}
                  FROM jsonb_to_recordset(u.mapped) AS m(node text, attempt int)
                 WHERE m.node = k.input_from AND m.attempt = k.input_attempt),
               'null'::jsonb) END,
           now(), u.run_id, k.node, k.attempt
      FROM updated u
     CROSS JOIN LATERAL jsonb_to_recordset(u.children)
           AS k(run_id text, node text, attempt int, workflow text, version int,
                input_from text, input_attempt int, shard bigint)
      JOIN LATERAL (SELECT w.name, w.version FROM eec_workflow_definition w
                     WHERE w.name = k.workflow AND (k.version IS NULL OR w.version = k.version)
                     ORDER BY w.version DESC LIMIT 1) d ON true
     WHERE u.children IS NOT NULL
    ON CONFLICT (run_id) DO NOTHING
), cancelled_children AS (
    -- Rule 3: an attempt that ended without its child's result cancels the child.
    INSERT INTO eec_run_signal (run_id, signal_id, kind)
    SELECT x.run_id, 'parent:' || u.run_id || ':' || u.seq, 'cancel'
      FROM updated u
     CROSS JOIN LATERAL jsonb_array_elements_text(u.cancel_children) AS x(run_id)
     WHERE u.cancel_children IS NOT NULL
       AND EXISTS (SELECT 1 FROM eec_workflow_run c WHERE c.run_id = x.run_id)
    ON CONFLICT DO NOTHING
), child_results AS (
    -- Rule 2: a child's end is its parent's step result.
    INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output, error)
    SELECT u.parent_run_id, u.parent_node, u.parent_attempt,
           CASE WHEN u.status = 'succeeded' THEN 'succeeded' ELSE 'failed' END,
           CASE WHEN u.status = 'succeeded' THEN u.output END,
           CASE WHEN u.status <> 'succeeded' THEN
               'child run ' || u.run_id || ' ' || u.status
               || coalesce(': ' || u.failure_reason, '') END
      FROM updated u
     WHERE u.parent_run_id IS NOT NULL AND u.status IN ('succeeded', 'failed', 'cancelled')
    ON CONFLICT DO NOTHING
), map_items AS (
    -- Map items that left the state, succeeded: each one's applied attempt (core/tick.py).
    INSERT INTO eec_map_item (run_id, node, item, attempt)
    SELECT u.run_id, x.node, x.item, x.attempt
      FROM updated u
     CROSS JOIN LATERAL jsonb_to_recordset(u.items) AS x(node text, item int, attempt int)
     WHERE u.items IS NOT NULL
    ON CONFLICT DO NOTHING
), map_results AS (
    -- A map step that ended: its output is its items' outputs, in order (core/tick.py).
    INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)
    SELECT u.run_id, m.node, m.attempt, 'succeeded',
           {_MAPPED_OUTPUT.format(run="u.run_id", items="u.items")}
      FROM updated u
     CROSS JOIN LATERAL jsonb_to_recordset(u.mapped) AS m(node text, attempt int)
     WHERE u.mapped IS NOT NULL
    ON CONFLICT DO NOTHING
), signal_results AS (
    INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)
    SELECT u.run_id, w.node, w.attempt, 'succeeded', g.payload
      FROM updated u
     CROSS JOIN LATERAL jsonb_to_recordset(u.signalled)
           AS w(node text, attempt int, signal_id text)
     -- A lookup per signal (LIMIT 1), whatever the statistics: with those of a run that got
     -- thousands of signals, a join planned a read of every signal at every commit.
     CROSS JOIN LATERAL (
           SELECT g.payload FROM eec_run_signal g
            WHERE g.run_id = u.run_id AND g.signal_id = w.signal_id
            LIMIT 1) AS g
     WHERE u.signalled IS NOT NULL
    ON CONFLICT DO NOTHING
), {{limit_ctes}}outboxed AS (
    INSERT INTO eec_outbox (run_id, seq, records, owner)
    SELECT run_id, seq, effects, %(owner)s FROM updated WHERE effects IS NOT NULL
), acknowledged AS (
    DELETE FROM eec_outbox o
     USING jsonb_to_recordset(%(acked)s::jsonb) AS a(run_id text, seq bigint)
     WHERE o.run_id = a.run_id AND o.seq = a.seq
       AND o.run_id = ANY(ARRAY(SELECT jsonb_array_elements(%(acked)s::jsonb) ->> 'run_id'))
)
SELECT run_id, true FROM updated
UNION ALL
SELECT id, false FROM jsonb_array_elements_text(%(ids)s::jsonb) AS id
 WHERE (SELECT count(*) FROM ordered) < jsonb_array_length(%(ids)s::jsonb)
   AND id NOT IN (SELECT run_id FROM ordered)
"""


# A transition that fails attempts no worker started (a schedule-to bound passed while they
# waited in their queue: core/tick.py, rule 4) marks each one never to be started: a row of
# its own in eec_step_attempt, of no worker (''), no execution (``starts`` 0) and ended. The
# row's key arbitrates with a worker's claim of the same attempt (io/postgres/step_attempts.py): a
# claim committed first makes the insert find a real claim, and the run is not written (its
# commit lost a race: retried, from a load that sees the attempt started); a claim that comes
# after finds the attempt no longer the node's, or this row, which no claim takes. So an
# attempt that failed for its wait never runs, and one that ran never failed for it. A mark
# written for a run whose commit did not hold (its version had moved) is taken again by the
# next one.
_UNSTARTED_CTE = """unstarted AS (
    INSERT INTO eec_step_attempt AS a (run_id, node_id, attempt, worker_id, starts, ended_at,
                                       reports)
    SELECT c.run_id, x.node, x.attempt, '', 0, now(), true
      FROM jsonb_to_recordset(%(batch)s::jsonb) AS c(run_id text, unstarted jsonb)
     CROSS JOIN LATERAL jsonb_to_recordset(c.unstarted) AS x(node text, attempt int)
     WHERE c.unstarted IS NOT NULL
     ORDER BY 1, 2, 3
    ON CONFLICT (run_id, node_id, attempt) DO UPDATE SET ended_at = excluded.ended_at
     WHERE a.worker_id = ''
    RETURNING a.run_id, a.node_id, a.attempt
), """
# The run is written only if every attempt it fails unstarted was marked so.
_UNSTARTED_CHECK = """
   AND (c.unstarted IS NULL OR NOT EXISTS (
        SELECT 1 FROM jsonb_to_recordset(c.unstarted) AS x(node text, attempt int)
         WHERE (c.run_id, x.node, x.attempt) NOT IN (SELECT * FROM unstarted)))"""


def _commit_sql(limited: bool, unstarted: bool = False) -> str:
    """The commit statement: with the parts that write limits (io/postgres/limit_store.py) for a
    batch with limited steps, and those that mark attempts never started for a batch that fails
    some, without them for every other (the hot path, unchanged)."""
    parts = {
        "{guarded_cte}": limit_store.GUARDED_CTE if limited else "",
        "{guard_check}": limit_store.GUARD_CHECK if limited else "",
        "{limit_ctes}": limit_store.LIMIT_CTES if limited else "",
        "{unstarted_cte}": _UNSTARTED_CTE if unstarted else "",
        "{unstarted_check}": _UNSTARTED_CHECK if unstarted else "",
    }
    sql = _COMMIT_TEMPLATE
    for marker, text in parts.items():
        sql = sql.replace(marker, text)
    return sql


_COMMIT_SQL = _commit_sql(limited=False)
_LIMITED_COMMIT_SQL = _commit_sql(limited=True)
_COMMIT_SQLS = {
    (limited, unstarted): _commit_sql(limited, unstarted)
    for limited in (False, True)
    for unstarted in (False, True)
}

_DELETE_OUTBOX_SQL = """
DELETE FROM eec_outbox o USING jsonb_to_recordset(%(acked)s::jsonb) AS a(run_id text, seq bigint)
 WHERE o.run_id = a.run_id AND o.seq = a.seq
   AND o.run_id = ANY(ARRAY(SELECT jsonb_array_elements(%(acked)s::jsonb) ->> 'run_id'))
"""

# A relay claims the outbox rows no live instance will send: those whose owner (the instance
# that committed them, or last relayed them) is gone from the registry (io/postgres/instances.py),
# and those without one (a client wrote them), once they waited longer than the relay does. It
# takes them over (owner and time), so no other relay sends them while it lives; the claim
# needs no lease: a relay that dies is gone in turn. A row its live owner holds is never sent
# again by anyone else, however long the broker is away: that instance's producer still has
# it, and re-sending it only made copies (each one a step run again).
_CLAIM_OUTBOX_SQL = f"""
UPDATE eec_outbox SET created_at = now(), owner = %(me)s
 WHERE (run_id, seq) IN (
       SELECT run_id, seq FROM eec_outbox o
        WHERE created_at < now() - make_interval(secs => %(older_than_s)s)
          AND o.parked_at IS NULL
          AND (o.owner IS NULL OR (%(judge)s AND NOT {alive("o.owner")}))
        ORDER BY created_at LIMIT %(limit)s
          FOR UPDATE SKIP LOCKED)
RETURNING run_id, seq, records
"""

# The terminal path shared by the livelock guard and the watchdog. It is conditioned on the
# state checksum rather than the version: it only applies if no transition happened since the
# state was loaded (a progressing run is never force-failed), and an outside writer that merely
# bumps the version cannot keep a livelocked run alive forever.
# The same statement ends what the run's end ends (core/children.py, rule 4), so a crash
# after it loses nothing: its children in flight get a cancel signal each (the id names the
# failed transition: written again, it is the same signal), and the records of the end (their
# wakeups, its parent's) go to the outbox. Without an owner: the writer produces them at once
# and deletes the row once they are in, and any relay sends them after DUCTOR_RELAY_AFTER_S if
# it could not (it died, or the statement's answer was lost with its connection, so the writer
# never learnt it landed); a copy of a wakeup is a no-op tick. A child run force-failed is its
# parent's step result too (rule 2).
_FORCE_FAIL_SQL = f"""
WITH failed AS (
    UPDATE eec_workflow_run
       SET db_record_version = db_record_version + 1,
           status = %(status)s, node_states = %(nodes)s, last_transition_seq = %(seq)s,
           state_checksum = %(checksum)s, failure_reason = %(reason)s, next_wakeup_at = NULL,
           updated_at = now(), last_transition_at = now()
     WHERE run_id = %(run_id)s AND state_checksum = %(loaded)s
       AND status IN ('pending', 'running')
    RETURNING run_id, status, failure_reason, parent_run_id, parent_node, parent_attempt
), child_results AS (
    INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, error)
    SELECT parent_run_id, parent_node, parent_attempt, 'failed',
           'child run ' || run_id || ' ' || status || coalesce(': ' || failure_reason, '')
      FROM failed WHERE parent_run_id IS NOT NULL
    ON CONFLICT DO NOTHING
), cancelled_children AS (
    INSERT INTO eec_run_signal (run_id, signal_id, kind)
    SELECT x.run_id, 'parent:' || f.run_id || ':' || %(seq)s, 'cancel'
      FROM failed f
     CROSS JOIN LATERAL jsonb_array_elements_text(%(cancel)s::jsonb) AS x(run_id)
     WHERE EXISTS (SELECT 1 FROM eec_workflow_run c WHERE c.run_id = x.run_id)
    ON CONFLICT DO NOTHING
), outboxed AS (
    INSERT INTO eec_outbox (run_id, seq, records, owner)
    SELECT f.run_id, %(seq)s, %(effects)s::jsonb, NULL
      FROM failed f WHERE %(effects)s::jsonb IS NOT NULL
    ON CONFLICT DO NOTHING
){limit_store.FORCE_FAIL_CTES}
SELECT count(*) FROM failed
"""

# The flags live beside the run rows (eec_run_quarantine, io/postgres/run_marks.py), never on them:
# the row is written by versioned writes only, so nothing here can race a commit. A flag is written
# for the row's version as it was loaded (as it is now when unknown), and only while the row
# still has it: `ductor runs release` moves the version, so a flag decided before a release,
# still on its way, cannot undo it. A flag in force keeps its first reason; one left behind by
# a version the row no longer has is replaced.
_QUARANTINE_SQL = """
INSERT INTO eec_run_quarantine AS f (run_id, run_version, quarantined_at, reason)
SELECT r.run_id, r.db_record_version, now(), q.why
  FROM jsonb_to_recordset(%(flagged)s::jsonb) AS q(run_id text, why text, version bigint)
  JOIN eec_workflow_run r ON r.run_id = q.run_id
 WHERE r.db_record_version = coalesce(q.version, r.db_record_version)
   AND r.run_id = ANY(ARRAY(SELECT jsonb_array_elements(%(flagged)s::jsonb) ->> 'run_id'))
ON CONFLICT (run_id) DO UPDATE
   SET run_version = EXCLUDED.run_version, quarantined_at = EXCLUDED.quarantined_at,
       reason = EXCLUDED.reason
 WHERE f.run_version <> EXCLUDED.run_version
RETURNING f.run_id
"""
_QUARANTINE_WHY_CHARS = 1000


class Definitions:
    """Workflow definitions by (name, version). Registered versions are immutable, so cache."""

    def __init__(self) -> None:
        self._cache: dict[tuple[str, int], WorkflowDef] = {}

    def get(self, conn: psycopg.Connection[Any], key: tuple[str, int]) -> WorkflowDef:
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
_CANCEL = SignalKind.CANCEL.value
_CANCELLED, _NO_SIGNAL = frozenset({SignalKind.CANCEL}), frozenset[SignalKind]()


def load_runs_at(
    conn: psycopg.Connection[Any], definitions: Definitions, run_ids: Iterable[str]
) -> tuple[dict[str, Loaded], int]:
    """``load_runs``, and Postgres's time of the load (epoch ms): the time the batch's ticks
    are judged at (io/postgres/db_clock.py)."""
    # Ids travel as one JSON array: one orjson call instead of escaping an array element-wise.
    # The whole batch comes back as one JSON document: one orjson call instead of psycopg
    # converting every column of every row.
    ids = orjson.dumps(list(run_ids)).decode()
    found = conn.execute(_LOAD_SQL, (_INPUT_LOAD_BYTES, ids)).fetchone()
    assert found is not None
    loaded: dict[str, Loaded] = {}
    for row in orjson.loads(found[0]):
        run_id, wf_name, wf_version, status, nodes, seq, checksum, version, reason, tier = row[:10]
        raw_results, raw_signals, raw_input, not_before_ms = row[10], row[11], row[12], row[13]
        raw_parent, input_length, raw_starts = row[14], row[15], row[16]
        try:
            wf = definitions.get(conn, (wf_name, wf_version))
        except UnknownWorkflow as exc:
            loaded[run_id] = UnknownWorkflow(str(exc), version)
            continue
        try:
            state = state_from_row(status, nodes, seq, reason, wf)
        except (KeyError, ValueError, TypeError) as unreadable:
            # Only an outside writer can leave a row we cannot read: report it like a checksum
            # mismatch rather than let one row stop the batch.
            loaded[run_id] = UnreadableRun(
                f"run {run_id!r}: node_states cannot be read: {unreadable!r}", version
            )
            continue
        results = tuple(
            StepResult(r[0], r[1], StepOutcome(r[2]), r[3], r[4], r[5]) for r in (raw_results or ())
        )
        received = raw_signals or ()
        signals = _CANCELLED if any(k == _CANCEL for k, _ in received) else _NO_SIGNAL
        named = tuple((k, sid) for k, sid in received if k != _CANCEL)
        loaded[run_id] = LoadedRun(
            run_id=run_id,
            wf=wf,
            state=state,
            version=version,
            tier=tier,
            results=results,
            signals=signals,
            stored_checksum=checksum,
            verified=checksum == row_checksum(status, nodes, seq, reason),
            input=None if raw_input is None else RunInput(raw_input[0]),
            not_before_ms=not_before_ms,
            named=named,
            parent=None if raw_parent is None else ParentLink(*raw_parent),
            input_length=input_length,
            starts=None if raw_starts is None else _starts(raw_starts),
        )
    return loaded, int(found[1])


def _starts(raw: list[list[Any]]) -> Starts:
    """The starts a load read, as the tick takes them."""
    return tuple(
        (node, Started(attempt, at, beat, reports)) for node, attempt, at, beat, reports in raw
    )


class CommitAnswer(NamedTuple):
    """What a batched commit did: the runs it committed, and those it skipped because another
    transaction held their row (the others of the batch lost their version race)."""

    committed: set[str]
    locked: set[str]


def commit_batch(
    conn: psycopg.Connection[Any],
    commits: Sequence[Commit],
    acknowledged: Sequence[tuple[str, int]] = (),
    owner: str | None = None,
) -> CommitAnswer:
    """The batched conditional UPDATE, with each transition's records into the outbox (owned
    by ``owner``, the committing instance) and the ``acknowledged`` (run_id, seq) outbox rows
    deleted."""
    if not commits:
        delete_outbox(conn, acknowledged)
        return CommitAnswer(set(), set())
    params = commit_params(commits, acknowledged, owner)
    sql = _COMMIT_SQLS[("guards" in params, any(c.unstarted for c in commits))]
    committed: set[str] = set()
    locked: set[str] = set()
    for run_id, updated in conn.execute(sql, params).fetchall():
        (committed if updated else locked).add(run_id)
    return CommitAnswer(committed, locked)


def commit_params(
    commits: Sequence[Commit], acknowledged: Sequence[tuple[str, int]], owner: str | None
) -> dict[str, Any]:
    """The parameters of the batched commit statement (``_COMMIT_SQL``)."""
    # The whole batch travels as one JSON document: one orjson call instead of adapting
    # nine arrays element by element.
    params = {
        "ids": orjson.dumps([c.run_id for c in commits]).decode(),
        "batch": orjson.dumps([_commit_row(c) for c in commits]).decode(),
        "acked": _pairs(acknowledged),
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
        "effects": [_outbox_record(s) for s in c.effects] if c.effects else None,
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


def delete_outbox(conn: psycopg.Connection[Any], acknowledged: Sequence[tuple[str, int]]) -> None:
    """Delete the outbox rows whose records the broker acknowledged."""
    if acknowledged:
        conn.execute(_DELETE_OUTBOX_SQL, {"acked": _pairs(acknowledged)})


def claim_outbox(
    conn: psycopg.Connection[Any],
    older_than_s: float,
    limit: int,
    relay: OutboxRelay | None = None,
) -> list[tuple[str, int, tuple[Send, ...]]]:
    """Outbox rows no live instance will send, left for longer than ``older_than_s``,
    claimed for this relay (``relay``: who relays; without it, only rows without an owner)."""
    me, judge, gone_after_s = relay or OutboxRelay("", False, 0.0)
    params = {
        "older_than_s": older_than_s,
        "limit": limit,
        "me": me or None,
        "judge": judge,
        "gone_after_s": gone_after_s,
    }
    rows = conn.execute(_CLAIM_OUTBOX_SQL, params).fetchall()
    return [
        (run_id, seq, tuple(_send_of(record) for record in records))
        for run_id, seq, records in rows
    ]


_PARK_SQL = """
UPDATE eec_outbox o SET parked_at = now(), parked_reason = p.why
  FROM jsonb_to_recordset(%s::jsonb) AS p(run_id text, seq bigint, why text)
 WHERE o.run_id = p.run_id AND o.seq = p.seq AND o.parked_at IS NULL
"""


def park_outbox(conn: psycopg.Connection[Any], rows: Sequence[tuple[str, int, str]]) -> None:
    """Park outbox rows (run id, seq, why) whose record the broker refuses for good: kept,
    relayed by no one until unparked."""
    if rows:
        parked = [{"run_id": r, "seq": s, "why": why} for r, s, why in rows]
        conn.execute(_PARK_SQL, (orjson.dumps(parked).decode(),))


class ParkedRow(NamedTuple):
    run_id: str
    seq: int
    parked_at: datetime
    reason: str
    topics: list[str]

    def describe(self) -> str:
        return (
            f"{self.run_id} #{self.seq} parked {self.parked_at.isoformat(timespec='seconds')}"
            f" ({', '.join(self.topics)}): {self.reason}"
        )


def parked_outbox(conn: psycopg.Connection[Any], limit: int) -> list[ParkedRow]:
    """The parked outbox rows, oldest first: the run, the transition, when, why, and the
    topics of its records."""
    rows = conn.execute(
        "SELECT run_id, seq, parked_at, coalesce(parked_reason, ''),"
        " ARRAY(SELECT DISTINCT r ->> 0 FROM jsonb_array_elements(records) AS r)"
        " FROM eec_outbox WHERE parked_at IS NOT NULL ORDER BY parked_at LIMIT %s",
        (limit,),
    ).fetchall()
    return [ParkedRow(*row) for row in rows]


def unpark_outbox(conn: psycopg.Connection[Any], run_id: str | None, seq: int | None) -> int:
    """Hand parked rows back to the relay (all of them with ``run_id`` None; else the run's,
    or its one transition ``seq``): no owner, and old enough to be relayed at the next sweep.
    How many were parked."""
    cur = conn.execute(
        "UPDATE eec_outbox SET parked_at = NULL, parked_reason = NULL, owner = NULL,"
        " created_at = now() - interval '1 day'"
        " WHERE parked_at IS NOT NULL"
        " AND (%(run)s::text IS NULL OR run_id = %(run)s)"
        " AND (%(seq)s::bigint IS NULL OR seq = %(seq)s)",
        {"run": run_id, "seq": seq},
    )
    return cur.rowcount


class OutboxRelay(NamedTuple):
    """Who relays: the instance, whether it may take silent owners for gone
    (io/postgres/instances.py's Judge), and the heartbeat age after which an owner is gone."""

    instance_id: str
    may_judge: bool
    gone_after_s: float


def _outbox_record(send: Send) -> list[str | None]:
    """A record as the outbox keeps it: keys and values of the engine's records are UTF-8
    JSON text and run ids; headers are not kept (trace context is added when sent)."""
    key = None if send.key is None else send.key.decode()
    value = None if send.value is None else send.value.decode()
    return [send.topic, key, value, send.by_run]


def _send_of(record: list[str | None]) -> Send:
    topic, key, value, by_run = record
    assert topic is not None
    return Send(
        topic,
        key=None if key is None else key.encode(),
        value=None if value is None else value.encode(),
        by_run=by_run,
    )


def _pairs(acknowledged: Sequence[tuple[str, int]]) -> str:
    return orjson.dumps([{"run_id": r, "seq": s} for r, s in acknowledged]).decode()


def force_fail_write(
    conn: psycopg.Connection[Any],
    run_id: str,
    loaded_checksum: str,
    failed: RunState,
    cancel_children: Sequence[str] = (),
    effects: Sequence[Send] = (),
) -> bool:
    """Write a force-failed state if the run did not move since it was loaded; with it, a
    cancel signal for each of ``cancel_children`` and ``effects`` into the outbox (without
    an owner) as the failed transition's records."""
    params = {
        "status": failed.status.value,
        "nodes": orjson.dumps(failed.nodes_json()).decode(),
        "seq": failed.seq,
        "checksum": state_checksum(failed),
        "reason": failed.reason,
        "run_id": run_id,
        "loaded": loaded_checksum,
        "cancel": orjson.dumps(list(cancel_children)).decode(),
        "effects": orjson.dumps([_outbox_record(s) for s in effects]).decode() if effects else None,
    }
    cur = conn.execute(_FORCE_FAIL_SQL, params).fetchone()
    return cur is not None and cur[0] == 1


def quarantine_runs(conn: psycopg.Connection[Any], runs: Sequence[QuarantineFlag]) -> set[str]:
    """Flag runs whose rows cannot be used, with why, so the sweeps skip them, if their row
    is still at the version it was found at; returns the ones newly flagged (a run flagged
    already keeps its first reason)."""
    first: dict[str, QuarantineFlag] = {}
    for flag in runs:  # one row per run: an upsert may not meet the same key twice
        first.setdefault(flag.run_id, flag)
    flagged = orjson.dumps(
        [
            {"run_id": run_id, "why": why[:_QUARANTINE_WHY_CHARS], "version": version}
            for run_id, why, version in first.values()
        ]
    ).decode()
    rows = conn.execute(_QUARANTINE_SQL, {"flagged": flagged}).fetchall()
    return {r[0] for r in rows}
