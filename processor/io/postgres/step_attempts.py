"""The worker's claim on step attempts (``eec_step_attempt``), its start permits, and the
check that an attempt still matters.

A claim is one statement for a group of tasks: it reads each task's run (is this attempt the
node's dispatched one?), its result (already recorded?) and its attempt row (started before,
by whom, is that worker alive?), and takes the attempts that are right to run by inserting
their row (or, for a rerun, by counting one more start on the row of a worker that is gone).
The decision to take is made again under the row's lock (``ON CONFLICT ... DO UPDATE ...
WHERE``): two workers claiming one attempt at once cannot both take it. core/claims.py turns
what was read into each task's verdict. The same statement reads what each task it takes
needs and does not carry (the run's input, its dependencies' outputs: io/postgres/step_data.py).

A claim is not a start: a worker claims ahead of its free slots. Each claim carries the
worker's sequence number, and the worker raises its *start permit* (``started_through`` in its
instance row) before it starts a claim numbered beyond it, in the claim statement itself or
alone (``permit_starts``). A claim of a worker that is gone numbered past its permit never
started: the next claim takes it as new (core/claims.py sees no start), not as a rerun.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson
import psycopg

from processor.core.claims import ClaimFacts
from processor.core.step_task import AttemptKey, StepData, StepTask
from processor.io.postgres.instances import alive
from processor.io.postgres.step_data import DEPENDENCY_OUTPUTS, MissingData, data_of, deps_json

# The SQL condition "the claim on attempt row {a} never started": numbered past the permit of
# its worker (a worker whose row is forgotten may have started it).
UNSTARTED = """({a}.claim_seq IS NOT NULL AND EXISTS (
    SELECT 1 FROM eec_instance i
     WHERE i.instance_id = {a}.worker_id AND {a}.claim_seq > i.started_through))"""

_CLAIM_SQL = f"""
WITH t AS MATERIALIZED (
    SELECT * FROM jsonb_to_recordset(%(tasks)s::jsonb)
        AS t(i int, run_id text, node text, attempt int, deps jsonb, wants_data boolean,
             seq bigint, v int)
), permit AS (
    UPDATE eec_instance SET started_through = %(permit)s
     WHERE instance_id = %(me)s AND started_through < %(permit)s
), raw AS MATERIALIZED (
    SELECT t.i, t.run_id, t.node, t.attempt, t.deps, t.wants_data, t.seq, t.v,
           r.run_id IS NOT NULL AS run_exists,
           coalesce(r.status IN ('pending', 'running')
                    AND r.node_states -> t.node ->> 'status' = 'dispatched'
                    AND (r.node_states -> t.node ->> 'attempt')::int = t.attempt,
                    false) AS current,
           coalesce(r.status IN ('pending', 'running')
                    AND coalesce((r.node_states -> t.node ->> 'attempt')::int, 0) < t.attempt
                    -- A map's item the state no longer holds, below the items it started,
                    -- succeeded and left it (core/tick.py, rule 6): superseded, not ahead.
                    AND CASE WHEN right(t.node, 1) = ']' AND r.node_states -> t.node IS NULL
                                  AND t.node ~ '^[^[]+[[][0-9]{{1,9}}[]]$'
                             THEN coalesce((r.node_states -> split_part(t.node, '[', 1)
                                                         ->> 'started')::int, 0)
                                  <= substring(t.node FROM '[[]([0-9]+)[]]$')::int
                             ELSE true END,
                    false) AS ahead,
           res.found IS NOT NULL AS recorded,
           a.starts,
           coalesce({UNSTARTED.format(a="a")}, false) AS unstarted,
           coalesce(a.worker_id IS NOT NULL AND {alive("a.worker_id")}, false) AS starter_alive,
           coalesce(a.worker_id = %(me)s, false) AS mine,
           r.input, r.node_states, r.workflow_name, r.workflow_version
      FROM t
      LEFT JOIN eec_workflow_run r ON r.run_id = t.run_id
      -- A lookup per task, whatever the statistics say: joined, a plan made while they said
      -- the table was empty read all of it once per statement (tests/integration/
      -- test_query_plans.py), and kept doing so as the table filled.
      LEFT JOIN LATERAL (
          SELECT true AS found FROM eec_step_result res
           WHERE res.run_id = t.run_id AND res.node_id = t.node AND res.attempt = t.attempt
           LIMIT 1
      ) AS res ON true
      LEFT JOIN LATERAL (
          SELECT a.starts, a.claim_seq, a.worker_id FROM eec_step_attempt a
           WHERE a.run_id = t.run_id AND a.node_id = t.node AND a.attempt = t.attempt
           LIMIT 1
      ) AS a ON true
), seen AS MATERIALIZED (
    -- The executions begun: a claim that never started is not one.
    SELECT raw.*, CASE WHEN unstarted THEN nullif(starts - 1, 0) ELSE starts END AS began
      FROM raw
), claimed AS (
    INSERT INTO eec_step_attempt AS a
           (run_id, node_id, attempt, worker_id, claim_seq, reports, step_version)
    SELECT run_id, node, attempt, %(me)s, seq, true, v FROM seen
     WHERE current AND NOT recorded
       AND (began IS NULL
            OR (%(reruns)s AND NOT starter_alive AND %(judge)s AND began < %(max_starts)s))
     ORDER BY run_id, node, attempt
        ON CONFLICT (run_id, node_id, attempt) DO UPDATE
       -- A gone worker's claim that never started is taken over as it is (no start counted);
       -- a rerun counts one more start, and starts at its claim (no number). Either is an
       -- execution of its own: not ended, no beat yet (the details of the last one stay, for
       -- the step to read: ctx.last_heartbeat).
       SET starts = CASE WHEN %(reruns)s THEN a.starts + 1 ELSE a.starts END,
           claim_seq = excluded.claim_seq, worker_id = excluded.worker_id, started_at = now(),
           reports = true, ended_at = NULL, beat_at = NULL
     WHERE %(judge)s AND a.worker_id <> excluded.worker_id
       AND NOT {alive("a.worker_id")}
       AND CASE WHEN %(reruns)s THEN a.starts < %(max_starts)s
                ELSE {UNSTARTED.format(a="a")} END
    RETURNING a.run_id, a.node_id, a.attempt, a.starts
)
SELECT sn.i, sn.run_exists, sn.current, sn.ahead, sn.recorded, sn.began, sn.starter_alive,
       sn.mine, c.starts, taken.data, last.details
  FROM seen sn
  LEFT JOIN claimed c ON c.run_id = sn.run_id AND c.node_id = sn.node AND c.attempt = sn.attempt
  -- What a task taken here needs and does not carry: read now, in the same statement.
  LEFT JOIN LATERAL (
      SELECT json_build_array(sn.input, {
    DEPENDENCY_OUTPUTS.format(
        deps="sn.deps",
        node_states="sn.node_states",
        wf_name="sn.workflow_name",
        wf_version="sn.workflow_version",
        node="sn.node",
        run_id="sn.run_id",
    )
}) AS data
       WHERE sn.wants_data AND sn.run_exists
         AND (c.starts IS NOT NULL OR (sn.mine AND sn.current AND NOT sn.recorded))
      -- Kept a subquery (OFFSET 0), so that the condition gates reading the data: pulled up
      -- into the join, the data of every task was read and then dropped by the join's
      -- filter (the claim's backend CPU 22.5 -> 18 µs per task on tasks that carry theirs).
      OFFSET 0
  ) AS taken ON true
  -- The details of the last heartbeat an earlier execution of the step recorded (this
  -- attempt's, before a rerun; else the last attempt's that has any): ctx.last_heartbeat.
  -- Never looked for on a first attempt's first execution (most tasks).
  LEFT JOIN LATERAL (
      SELECT b.beat_details AS details FROM eec_step_attempt b
       WHERE (sn.attempt > 1 OR sn.starts IS NOT NULL)
         AND (c.starts IS NOT NULL OR (sn.mine AND sn.current AND NOT sn.recorded))
         AND b.run_id = sn.run_id AND b.node_id = sn.node AND b.attempt <= sn.attempt
         AND b.beat_details IS NOT NULL
       ORDER BY b.attempt DESC LIMIT 1
  ) AS last ON true
"""


def claim_params(
    tasks: Sequence[StepTask],
    worker_id: str,
    *,
    max_starts: int,
    may_judge: bool,
    gone_after_s: float,
    reruns: bool = False,
    seqs: Sequence[int] | None = None,
    permit: int = 0,
) -> dict[str, Any]:
    """The parameters of the claim statement for ``tasks`` (``claim_attempts`` says what they
    mean)."""
    numbers: Sequence[int | None] = [None] * len(tasks) if seqs is None else seqs
    wanted = orjson.dumps(
        [
            {
                "i": i,
                "run_id": t.run_id,
                "node": t.node,
                "attempt": t.attempt,
                "deps": deps_json(t),
                "wants_data": t.data is None,
                "seq": seq,
                "v": t.step_version,
            }
            for i, (t, seq) in enumerate(zip(tasks, numbers, strict=True))
        ]
    ).decode()
    return {
        "tasks": wanted,
        "me": worker_id,
        "max_starts": max_starts,
        "judge": may_judge,
        "gone_after_s": gone_after_s,
        "reruns": reruns,
        "permit": permit,
    }


def claim_attempts(
    conn: psycopg.Connection[Any],
    tasks: Sequence[StepTask],
    worker_id: str,
    *,
    max_starts: int,
    may_judge: bool,
    gone_after_s: float,
    reruns: bool = False,
    seqs: Sequence[int] | None = None,
    permit: int = 0,
) -> list[tuple[ClaimFacts, StepData | MissingData | None, Any]]:
    """Claim what is right to run of ``tasks`` for ``worker_id``: the facts of each, in
    order, with the data of each task taken here that does not carry its own (None for the
    others) and the details of the last heartbeat an earlier execution of its step recorded
    (None: none). ``seqs`` numbers the claims (None: they start at once, as reruns do); the
    worker's start permit is raised to ``permit`` in the same statement. Attempts a worker
    that is gone started are taken only with ``reruns`` (a claim the worker makes for them
    apart: core/claims.py, rule 5)."""
    if not tasks:
        return []
    params = claim_params(
        tasks,
        worker_id,
        max_starts=max_starts,
        may_judge=may_judge,
        gone_after_s=gone_after_s,
        reruns=reruns,
        seqs=seqs,
        permit=permit,
    )
    answers: list[tuple[ClaimFacts, StepData | MissingData | None, Any] | None]
    answers = [None] * len(tasks)
    for i, *facts, data, details in conn.execute(_CLAIM_SQL, params).fetchall():
        read = None if data is None else data_of(tasks[i], (data[0], data[1]))
        answers[i] = (ClaimFacts(*facts), read, details)
    assert all(a is not None for a in answers)
    return answers  # type: ignore[return-value]


_NOT_CURRENT_SQL = """
SELECT t.i
  FROM jsonb_to_recordset(%s::jsonb) AS t(i int, run_id text, node text, attempt int)
  LEFT JOIN eec_workflow_run r ON r.run_id = t.run_id
 WHERE NOT coalesce(r.status IN ('pending', 'running')
                    AND r.node_states -> t.node ->> 'status' = 'dispatched'
                    AND (r.node_states -> t.node ->> 'attempt')::int = t.attempt, false)
"""


def not_current(conn: psycopg.Connection[Any], attempts: Sequence[AttemptKey]) -> list[int]:
    """The indexes of the ``attempts`` that no longer matter: their run was cancelled or ended
    (or deleted), or the node's dispatched attempt is another one (this one timed out)."""
    if not attempts:
        return []
    return [row[0] for row in conn.execute(_NOT_CURRENT_SQL, (attempts_param(attempts),))]


def attempts_param(attempts: Sequence[AttemptKey]) -> str:
    """The attempts as ``not_current`` reads them: a JSON array, one object each."""
    return orjson.dumps(
        [{"i": i, "run_id": r, "node": n, "attempt": a} for i, (r, n, a) in enumerate(attempts)]
    ).decode()


_UNCLAIM_SQL = """
WITH t AS MATERIALIZED (
    SELECT * FROM jsonb_to_recordset(%(tasks)s::jsonb) AS t(run_id text, node text, attempt int)
), forgotten AS (
    DELETE FROM eec_step_attempt a USING t
     WHERE a.run_id = t.run_id AND a.node_id = t.node AND a.attempt = t.attempt
       AND a.worker_id = %(me)s AND a.starts = 1
)
UPDATE eec_step_attempt a SET starts = a.starts - 1 FROM t
 WHERE a.run_id = t.run_id AND a.node_id = t.node AND a.attempt = t.attempt
   AND a.worker_id = %(me)s AND a.starts > 1
"""


def unclaim_attempts(
    conn: psycopg.Connection[Any], attempts: Sequence[AttemptKey], worker_id: str
) -> None:
    """Give back claims whose step never started (the worker stops, or lost the partition):
    the next worker takes them as never started, not as the reruns of a worker that died."""
    if attempts:
        tasks = orjson.dumps([{"run_id": r, "node": n, "attempt": a} for r, n, a in attempts])
        conn.execute(_UNCLAIM_SQL, {"tasks": tasks.decode(), "me": worker_id})


def permit_starts(conn: psycopg.Connection[Any], worker_id: str, through: int) -> None:
    """The worker may start its claims numbered up to ``through`` (a worker that dies leaves
    those as started, later ones as never started)."""
    conn.execute(
        "UPDATE eec_instance SET started_through = %s"
        " WHERE instance_id = %s AND started_through < %s",
        (through, worker_id, through),
    )


# What a worker reports of its executions, each on the attempt row of its own claim (a worker
# that took the attempt over since, as a rerun, has its own execution there): its start on a
# slot, when that came well after its claim (what its start-to-close timeout counts from:
# core/tick.py, rule 4); its heartbeats, with the details of the last one (None: keep the
# details recorded before); its end. An end is written once: the first one stays.
#
# The rows are locked in key order first, as the results' statement locks those it ends
# (io/postgres/step_data.py) and the claim those it takes: the worker's two lanes never deadlock.
_REPORT_SQL = """
WITH t AS MATERIALIZED (
    SELECT * FROM jsonb_to_recordset(%(reports)s::jsonb)
        AS t(run_id text, node text, attempt int, started boolean, beat boolean, details jsonb,
             ended boolean)
), locked AS MATERIALIZED (
    -- A lookup per report (LIMIT 1: joined, a plan read the whole index), in key order.
    SELECT a.row_id, o.*
      FROM (SELECT * FROM t ORDER BY t.run_id, t.node, t.attempt) AS o
     CROSS JOIN LATERAL (
           SELECT a.ctid AS row_id FROM eec_step_attempt a
            WHERE a.run_id = o.run_id AND a.node_id = o.node AND a.attempt = o.attempt
              AND a.worker_id = %(me)s
            LIMIT 1 FOR NO KEY UPDATE) AS a
)
UPDATE eec_step_attempt a
   SET started_at = CASE WHEN l.started THEN now() ELSE a.started_at END,
       beat_at = CASE WHEN l.beat THEN now() ELSE a.beat_at END,
       beat_details = coalesce(l.details, a.beat_details),
       ended_at = CASE WHEN l.ended THEN coalesce(a.ended_at, now()) ELSE a.ended_at END
  FROM locked l
 WHERE a.ctid = l.row_id
"""


class Report(NamedTuple):
    """What a worker reports of one execution: it started now on a slot (``started``), it
    beat (``beat``, with ``details`` when the step gave any: JSON text), it ended
    (``ended``)."""

    key: AttemptKey
    started: bool = False
    beat: bool = False
    details: str | None = None
    ended: bool = False


def report_executions(
    conn: psycopg.Connection[Any], reports: Sequence[Report], worker_id: str
) -> None:
    """Write what ``worker_id`` reports of its executions, in one statement (several reports
    of one attempt: merged first, a row is written once per statement)."""
    if not reports:
        return
    merged: dict[AttemptKey, dict[str, Any]] = {}
    for r in reports:
        run_id, node, attempt = r.key
        row = merged.setdefault(
            r.key,
            {
                "run_id": run_id,
                "node": node,
                "attempt": attempt,
                "started": False,
                "beat": False,
                "details": None,
                "ended": False,
            },
        )
        row["started"] |= r.started
        row["beat"] |= r.beat
        row["ended"] |= r.ended
        if r.details is not None:
            row["details"] = orjson.Fragment(r.details)
    param = orjson.dumps(list(merged.values())).decode()
    conn.execute(_REPORT_SQL, {"reports": param, "me": worker_id})
