"""The worker's statements: the read of what its steps need and their tasks do not carry (the
run's input and the outputs of the steps' dependencies; core/step_task.py says when a task
carries them), and the write of each attempt's result.

One statement for a whole batch of tasks, on the worker's own connection. A task names its
dependencies and the attempts of theirs that succeeded (``dep_attempts``): primary-key reads.
A task from a coordinator older than data flow names nothing; its dependencies are then read
from the run's definition and their attempts from the run's node states (a succeeded node
stays succeeded, so the attempt read is the one the coordinator applied).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import orjson
import psycopg

from processor.core.model import StepOutcome
from processor.core.step_task import StepData, StepTask, step_data

# The outputs of a task's dependencies as one JSON object by step name: an SQL expression over
# a task's ``deps`` (dependency -> attempt; NULL for a task from before data flow, whose
# dependencies are then read from the definition and their attempts from the run's node
# states) and its run's row. Shared with the worker's claim (io/postgres/step_attempts.py), which
# reads the data of the tasks it takes in the same statement.
DEPENDENCY_OUTPUTS = """
       (SELECT jsonb_object_agg(s.node_id, s.output)
          FROM jsonb_each_text(coalesce({deps}, (
                   SELECT jsonb_object_agg(dep, {node_states} -> dep -> 'attempt')
                     FROM eec_workflow_definition w
                    CROSS JOIN jsonb_array_elements(w.definition -> 'steps') AS st
                    CROSS JOIN jsonb_array_elements_text(st -> 'depends_on') AS dep
                    WHERE w.name = {wf_name} AND w.version = {wf_version}
                      AND st ->> 'name' = {node}))) AS d(node, attempt)
          JOIN eec_step_result s
            ON s.run_id = {run_id} AND s.node_id = d.node AND s.attempt = d.attempt::int)
"""

_FETCH_SQL = f"""
SELECT t.i, r.input, {
    DEPENDENCY_OUTPUTS.format(
        deps="t.deps",
        node_states="r.node_states",
        wf_name="r.workflow_name",
        wf_version="r.workflow_version",
        node="t.node",
        run_id="r.run_id",
    )
}
  FROM jsonb_to_recordset(%s::jsonb) AS t(i int, run_id text, node text, deps jsonb)
  JOIN eec_workflow_run r ON r.run_id = t.run_id
"""


def deps_json(task: StepTask) -> dict[str, int] | None:
    """What the statements read a task's dependencies by (None: from the run's definition)."""
    return None if task.dep_attempts is None else dict(task.dep_attempts)


class MissingData(LookupError):
    """What a task's step needs is not in the database; the message says what."""


def fetch_step_data(
    conn: psycopg.Connection[Any], tasks: Sequence[StepTask]
) -> list[StepData | MissingData]:
    """The data of each task, in order: the run's input and its dependencies' outputs, or
    what is missing (the run was deleted, a dependency's output is not recorded)."""
    if not tasks:
        return []
    wanted = orjson.dumps(
        [
            {"i": i, "run_id": t.run_id, "node": t.node, "deps": deps_json(t)}
            for i, t in enumerate(tasks)
        ]
    ).decode()
    found = {
        i: (run_input, outputs) for i, run_input, outputs in conn.execute(_FETCH_SQL, (wanted,))
    }
    return [data_of(task, found.get(i)) for i, task in enumerate(tasks)]


def data_of(task: StepTask, found: tuple[Any, Any] | None) -> StepData | MissingData:
    """A task's data from what a statement read of it: the run's input and its dependencies'
    outputs (``None``: its run was not found), or what is missing."""
    if found is None:
        return MissingData(f"run {task.run_id!r} no longer exists")
    run_input, outputs = found
    outputs = outputs or {}
    missing = [d for d, _ in task.dep_attempts or () if d not in outputs]
    if missing:
        attempts = dict(task.dep_attempts or ())
        return MissingData(
            "no recorded output for " + ", ".join(f"{d!r} attempt {attempts[d]}" for d in missing)
        )
    return step_data(run_input, outputs)


class StepResultRow(NamedTuple):
    """A result as the worker records it."""

    run_id: str
    node: str
    attempt: int
    outcome: StepOutcome
    output: Any
    error: str | None
    retryable: bool = True  # False: the step declared the failure final (NonRetryable)
    # The execution that gave it ended with it (False: it was given up while it still runs,
    # its end is reported when it comes: io/postgres/step_attempts.py), and the details of its last
    # heartbeat not recorded yet (JSON text; None: none).
    ended: bool = False
    details: str | None = None
    # A failure the step raised: its exception's type, and its traceback (bounded:
    # core/failures.py); None for the other results.
    error_type: str | None = None
    traceback: str | None = None
    # The tags a success's step set on its run (``ctx.tag``), written with it (None: none).
    tags: Mapping[str, str] | None = None


# A result is recorded only while its run exists, read without a lock: the results table has
# no foreign key to the runs (schemas/migrations/0011_step_results_without_foreign_key.sql),
# so an insert never locks, or waits for, the run's row, whoever holds it (a commit, an
# operator's `SELECT ... FOR UPDATE`). The statement returns the results it left out because
# their run no longer exists. A redelivered result conflicts on the key and changes nothing.
_INSERT_RESULTS_SQL_TEMPLATE = """
WITH r AS MATERIALIZED (
    SELECT r.*, EXISTS (SELECT 1 FROM eec_workflow_run w WHERE w.run_id = r.run_id) AS known
      FROM jsonb_to_recordset(%(results)s::jsonb)
        AS r(i int, run_id text, node_id text, attempt int, outcome text, output jsonb,
             error text, retryable boolean, ended boolean, details jsonb, error_type text,
             traceback text, tags jsonb)
), inserted AS (
    INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output, error, retryable,
                                 error_type, traceback)
    SELECT r.run_id, r.node_id, r.attempt, r.outcome, coalesce(r.output, 'null'::jsonb), r.error,
           coalesce(r.retryable, true), r.error_type, r.traceback
      FROM r
     WHERE r.known
     ORDER BY r.run_id, r.node_id, r.attempt
        ON CONFLICT DO NOTHING{returning}
), ends AS (
    -- The end of the execution that gave each result, on its worker's claim, with the last
    -- details it beat with: a lookup per result (LIMIT 1: joined, a plan read the whole
    -- index), the rows locked in key order (io/postgres/step_attempts.py).
    SELECT a.row_id, e.ended, e.details
      FROM (SELECT * FROM r WHERE %(me)s::text IS NOT NULL AND (r.ended OR r.details IS NOT NULL)
             ORDER BY r.run_id, r.node_id, r.attempt) AS e
     CROSS JOIN LATERAL (
           SELECT a.ctid AS row_id FROM eec_step_attempt a
            WHERE a.run_id = e.run_id AND a.node_id = e.node_id AND a.attempt = e.attempt
              AND a.worker_id = %(me)s
            LIMIT 1 FOR NO KEY UPDATE) AS a
), ended AS (
    UPDATE eec_step_attempt a
       SET ended_at = CASE WHEN e.ended THEN coalesce(a.ended_at, now()) ELSE a.ended_at END,
           beat_details = coalesce(e.details, a.beat_details)
      FROM ends e
     WHERE a.ctid = e.row_id
){tagged}
SELECT r.i FROM r WHERE NOT r.known
"""

# The tags the steps of successes set on their runs (``ctx.tag``), written by the statement
# that records the results, for the results it inserted only: a redelivered result, already
# recorded, writes none again. A later value of a key replaces the earlier one (within the
# statement, the result given last); the rows are written in key order, as every writer of the
# table does, and the database refuses a run's 17th key (schemas/migrations/0045_run_tags.sql),
# which fails the statement: the results are then recorded one by one (worker/database.py).
_TAGGED = """, tagged AS (
    INSERT INTO eec_run_tag (run_id, key, value, node_id)
    SELECT DISTINCT ON (r.run_id, t.key) r.run_id, t.key, t.value, r.node_id
      FROM r
      JOIN inserted USING (run_id, node_id, attempt)
     CROSS JOIN jsonb_each_text(r.tags) AS t(key, value)
     WHERE r.tags IS NOT NULL
     ORDER BY r.run_id, t.key, r.i DESC
        ON CONFLICT (run_id, key) DO UPDATE
       SET value = EXCLUDED.value, node_id = EXCLUDED.node_id, set_at = now()
     WHERE eec_run_tag.value IS DISTINCT FROM EXCLUDED.value
)"""
# Without tags, results are recorded by the statement they always were (the hot path).
_INSERT_RESULTS_SQL = _INSERT_RESULTS_SQL_TEMPLATE.format(returning="", tagged="")
_INSERT_TAGGED_RESULTS_SQL = _INSERT_RESULTS_SQL_TEMPLATE.format(
    returning=" RETURNING run_id, node_id, attempt", tagged=_TAGGED
)


def insert_step_results(
    conn: psycopg.Connection[Any],
    results: Sequence[StepResultRow],
    worker_id: str | None = None,
) -> list[int]:
    """Record results in one statement (a redelivered one is ignored; an output of None is
    stored as JSON null), except those of runs that no longer exist: their indexes in
    ``results`` are returned; with them, the end of each execution that ended with its
    result, on ``worker_id``'s claim. A result the database refuses fails the whole
    statement, and nothing of it is written: the caller then records the results one by
    one, to learn which."""
    params = {"results": results_param(results), "me": worker_id}
    tagged = any(r.tags for r in results)
    sql = _INSERT_TAGGED_RESULTS_SQL if tagged else _INSERT_RESULTS_SQL
    return [row[0] for row in conn.execute(sql, params)]


def results_param(results: Sequence[StepResultRow]) -> str:
    """The results as the insert statement reads them: a JSON array, one object each."""
    rows = [
        {"i": i, "run_id": r, "node_id": n, "attempt": a, "outcome": o, "output": out, "error": e}
        | ({} if retryable else {"retryable": False})
        | ({"ended": True} if ended else {})
        | ({} if details is None else {"details": orjson.Fragment(details)})
        | ({} if kind is None else {"error_type": kind})
        | ({} if trace is None else {"traceback": trace})
        | ({"tags": dict(tags)} if tags else {})
        for i, (r, n, a, o, out, e, retryable, ended, details, kind, trace, tags) in enumerate(
            results
        )
    ]
    return orjson.dumps(rows).decode()
