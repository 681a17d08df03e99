"""The statements of the commit path (io/postgres/store.py runs them): the batched conditional
UPDATE with its outbox rows, in its variants; the force-fail write; the quarantine flags."""

from __future__ import annotations

from processor.io.postgres import limit_store

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
# enforce its deadlines.
#
# A map step's output (``m``: the map that ended), from its items' results by index: the items
# recorded by earlier commits (eec_map_item) and those this commit records (``{items}``).
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
       -- A live run is woken at its deadline at the latest (core/deadlines.py; least()
       -- ignores a null: no due time, or no deadline), but for one in its saga (live with
       -- the reason it will end with: core/sagas.py), which its deadline no longer holds.
       next_wakeup_at = CASE WHEN c.status IN ('pending', 'running') AND c.reason IS NULL
                             THEN least(to_timestamp(c.next_wakeup_ms / 1000.0), r.deadline_at)
                             WHEN c.status IN ('pending', 'running')
                             THEN to_timestamp(c.next_wakeup_ms / 1000.0)
                        END,
       updated_at = now(),
       last_transition_at = now(),
       output = CASE WHEN c.output IS NULL THEN r.output ELSE (
           SELECT CASE WHEN (c.output ->> 'single')::boolean THEN (array_agg(v.output))[1]
                       -- (every step of the mapping skipped: an empty one)
                       ELSE coalesce(jsonb_object_agg(v.key, v.output), '{{}}') END
             FROM (SELECT o.key, coalesce(s.output, g.payload, mm.output, so.output::jsonb)
                          AS output
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
                     -- A step this very commit ends with an output the tick made (a
                     -- sleep's, a wait's default).
                     LEFT JOIN jsonb_to_recordset(c.settled)
                          AS so(node text, attempt int, output text)
                       ON s.run_id IS NULL AND so.node = o.node AND so.attempt = o.attempt
                    WHERE s.run_id IS NOT NULL OR g.run_id IS NOT NULL
                       OR mm.output IS NOT NULL OR so.node IS NOT NULL) AS v)
       END
  FROM jsonb_to_recordset(%(batch)s::jsonb)
       AS c(run_id text, expected_version bigint, status text, node_states jsonb, seq bigint,
            checksum text, reason text, next_wakeup_ms bigint, effects jsonb, output jsonb,
            signalled jsonb, children jsonb, cancel_children jsonb, mapped jsonb, limits jsonb,
            items jsonb, unstarted jsonb, settled jsonb)
 WHERE r.run_id = c.run_id
   AND r.run_id = ANY(ARRAY(SELECT run_id FROM ordered))
   AND r.db_record_version = c.expected_version{{guard_check}}{{unstarted_check}}
RETURNING r.run_id, c.seq, c.effects, c.signalled, c.children, c.cancel_children, c.mapped,
          c.limits, c.items, c.settled, r.status,
          r.output, r.failure_reason, r.tier, r.parent_run_id, r.parent_node, r.parent_attempt
), started_children AS (
    -- core/children.py, rule 1: a child exists exactly when its parent's attempt does.
    INSERT INTO eec_workflow_run (run_id, workflow_name, workflow_version, status, node_states,
                                  last_transition_seq, state_checksum, tier, shard, input,
                                  next_wakeup_at, parent_run_id, parent_node, parent_attempt,
                                  timeout_ms, deadline_at)
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
               (SELECT x.output::jsonb
                  FROM jsonb_to_recordset(u.settled) AS x(node text, attempt int, output text)
                 WHERE x.node = k.input_from AND x.attempt = k.input_attempt),
               'null'::jsonb) END,
           now(), u.run_id, k.node, k.attempt,
           -- The child's own workflow's deadline, if it declares one (core/deadlines.py).
           d.timeout_ms, now() + d.timeout_ms * interval '1 millisecond'
      FROM updated u
     CROSS JOIN LATERAL jsonb_to_recordset(u.children)
           AS k(run_id text, node text, attempt int, workflow text, version int,
                input_from text, input_attempt int, shard bigint)
      JOIN LATERAL (SELECT w.name, w.version, (w.definition ->> 'timeout_ms')::bigint
                           AS timeout_ms
                      FROM eec_workflow_definition w
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
), settled_results AS (
    -- Steps that ended with an output the tick made: a sleep's, a wait's default.
    INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)
    SELECT u.run_id, x.node, x.attempt, 'succeeded', x.output::jsonb
      FROM updated u
     CROSS JOIN LATERAL jsonb_to_recordset(u.settled) AS x(node text, attempt int, output text)
     WHERE u.settled IS NOT NULL
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


def commit_sql(limited: bool, unstarted: bool = False) -> str:
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


COMMIT_SQL = commit_sql(limited=False)
_LIMITEDCOMMIT_SQL = commit_sql(limited=True)
COMMIT_SQLS = {
    (limited, unstarted): commit_sql(limited, unstarted)
    for limited in (False, True)
    for unstarted in (False, True)
}

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
FORCE_FAIL_SQL = f"""
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
SELECT (SELECT count(*) FROM failed),
       (SELECT coalesce(jsonb_object_agg(k.key, k.n), '{{}}') FROM
               (SELECT key, count(*) AS n FROM freed_holds GROUP BY key) k)
"""

# The flags live beside the run rows (eec_run_quarantine, io/postgres/run_marks.py), never on them:
# the row is written by versioned writes only, so nothing here can race a commit. A flag is written
# for the row's version as it was loaded (as it is now when unknown), and only while the row
# still has it: `ductor runs release` moves the version, so a flag decided before a release,
# still on its way, cannot undo it. A flag in force keeps its first reason; one left behind by
# a version the row no longer has is replaced.
QUARANTINE_SQL = """
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
QUARANTINE_WHY_CHARS = 1000
