"""The coordinator's batched load (io/postgres/store.py runs it): every run of a batch, with
what its tick can use, read in one statement and returned as one JSON document."""

from __future__ import annotations

from processor.core.step_task import MAX_INLINE_DATA_BYTES
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
# A live run's deadline (core/deadlines.py) comes last: a run without one costs a null.
# Each row is read by name as core/load_row.py's LoadRow, whose fields follow this array.
LOAD_SQL = """
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
         {starts},
         CASE WHEN r.deadline_at IS NOT NULL AND r.status IN ('pending', 'running') THEN
             json_build_array((extract(epoch FROM r.deadline_at) * 1000)::bigint, r.timeout_ms)
         END)), '[]')::text,
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
LOAD_SQL = LOAD_SQL.replace("{starts}", _STARTS)

# The input of a pending run (its first tick dispatches its first steps) rides with the load,
# for those steps to carry it inline (core/dataflow.py); no other tick loads it. The stored
# size is only a first filter (a large input may be stored compressed); the task's encoder
# checks the bound exactly.
INPUT_LOAD_BYTES = 2 * MAX_INLINE_DATA_BYTES
