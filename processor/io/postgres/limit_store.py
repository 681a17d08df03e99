"""The SQL of limits at dispatch (core/limits.py has the rules): what the commit path loads for
a batch with limited steps, the parts of the commit statement that write them, and the waiters
to wake once slots were freed. Batches without limited steps run none of it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence, Set
from typing import Any

import orjson
import psycopg

from processor.core.limit_values import Guard, LimitInputs, LimitView
from processor.core.limits import RATE_LOOKAHEAD, needs_of, paths_of
from processor.core.model import Loaded, LoadedRun
from processor.core.plans import Commit
from processor.core.run_keys import run_need, run_paths
from processor.core.shapes import RunRef
from processor.io.postgres.instances import alive
from processor.io.postgres.run_marks import quarantined

# The SQL condition "the execution of the attempt holding slot {h} may still run": a worker
# started it (a claim numbered past its worker's start permit never did, nor did an attempt
# no worker took), reports the ends of its executions (io/postgres/step_attempts.py), has not
# reported this one's, and ``{worker}``: the worker is not known to be gone. The commit path takes a
# worker for gone only once it said it stopped (a slot is kept rather than given to two
# executions: right after an outage of the database every heartbeat looks old); the
# watchdog, which judges silence only when it may (io/postgres/instances.py's Judge), by its
# heartbeat too (``gone_after_s``, named by the statement).
_RUNNING = """EXISTS (
    SELECT 1 FROM eec_step_attempt x
     WHERE x.run_id = {h}.run_id AND x.node_id = {h}.node AND x.attempt = {h}.attempt
       AND x.reports AND x.ended_at IS NULL AND {worker}
       AND NOT (x.claim_seq IS NOT NULL AND EXISTS (
           SELECT 1 FROM eec_instance p
            WHERE p.instance_id = x.worker_id AND x.claim_seq > p.started_through)))"""
_NOT_STOPPED = """NOT EXISTS (SELECT 1 FROM eec_instance s
                WHERE s.instance_id = x.worker_id AND s.stopped_at IS NOT NULL)"""


def running(hold: str, judged: bool = False) -> str:
    """The condition "the execution holding slot ``hold`` may still run" (``judged``: its
    worker's silence says it is gone too)."""
    worker = alive("x.worker_id") if judged else _NOT_STOPPED
    return _RUNNING.replace("{h}", hold).replace("{worker}", worker)


_VALUES_SQL = """
SELECT g.run_id, g.path, coalesce(r.input #>> g.path::text[], '')
  FROM jsonb_to_recordset(%s::jsonb) AS g(run_id text, path text)
  JOIN eec_workflow_run r ON r.run_id = g.run_id
"""

# A waiter whose run can no longer move (quarantined, ended, deleted) is passed over: one bad
# row never holds the line behind it.
LIVE_WAITER = f"""EXISTS (SELECT 1 FROM eec_workflow_run r WHERE r.run_id = q.run_id
                  AND r.status IN ('pending', 'running') AND NOT {quarantined("r")})"""

# Each counter's version, holders, oldest waiters and, for a rate counter, the dispatches
# that bound its next admissions (``span`` before its count, ``ahead`` of them: one range of
# its rows, whatever its limit), read in one snapshot: a slot taken is always seen with the
# version its taker wrote (core/limits.py, rules 3 and 5).
_VIEWS_SQL = """
SELECT (extract(epoch FROM now()) * 1000)::bigint,
       k.key, coalesce(l.version, 0), coalesce(l.dispatched, 0),
       (SELECT coalesce(jsonb_agg(jsonb_build_array(d.seq, d.at_ms) ORDER BY d.seq), '[]')
          FROM eec_limit_rate d
         WHERE k.ahead > 0 AND d.key = k.key
           AND d.seq >= coalesce(l.dispatched, 0) - k.span
           AND d.seq < coalesce(l.dispatched, 0) - k.span + k.ahead),
       (SELECT count(*) FROM eec_limit_hold h WHERE h.key = k.key),
       (SELECT coalesce(jsonb_agg(jsonb_build_array(w.since_ms, w.run_id, w.node)
                                  ORDER BY w.turn, w.since_ms, w.run_id, w.node), '[]'::jsonb)
          FROM ({line}) w)
  FROM jsonb_to_recordset(%s::jsonb) AS k(key text, bound int, span bigint, ahead int)
  LEFT JOIN eec_limit l ON l.key = k.key
"""

# The first ``{first}`` waiters of the counter ``k.key``, in the line's order
# (core/limit_line.py: by round, then by age; the index eec_limit_wait_line).
_LINE = """
SELECT since_ms, run_id, node, tier, round AS turn FROM eec_limit_wait q
 WHERE key = k.key AND {live}
 ORDER BY round, since_ms, run_id, node LIMIT {first}
""".replace("{live}", LIVE_WAITER)
_VIEWS_SQL = _VIEWS_SQL.replace("{line}", _LINE.replace("{first}", "k.bound"))


def load_limits(conn: psycopg.Connection[Any], loaded: Mapping[str, Loaded]) -> LimitInputs:
    """What ``admit`` needs for the live runs of ``loaded`` whose workflows have limits:
    their input values at the limits' paths, and every counter their steps may use. Two
    statements, and only for a batch with such runs."""
    runs = [
        r
        for r in loaded.values()
        if isinstance(r, LoadedRun) and r.wf.has_limits and not r.state.status.terminal
    ]
    if not runs:
        return LimitInputs({}, {})
    values = _input_values(conn, runs)
    limits: dict[str, int] = {}
    rated: set[str] = set()
    for run in runs:
        if (need := run_need(run.wf, values.get(run.run_id, {}))) is not None:
            limits[need.key] = max(limits.get(need.key, 0), need.limit)
        for step in run.wf.steps:
            for need in needs_of(step, values.get(run.run_id, {})):
                limits[need.key] = max(limits.get(need.key, 0), need.limit)
                if need.per_ms:
                    rated.add(need.key)
    views, read_ms = _views(conn, limits, rated)
    return LimitInputs(values, views, read_ms)


def _input_values(
    conn: psycopg.Connection[Any], runs: Sequence[LoadedRun]
) -> dict[str, dict[tuple[str, ...], str]]:
    """Each run's input values at its limits' paths (the first statement)."""
    wanted: list[dict[str, str]] = []
    by_literal: dict[str, tuple[str, ...]] = {}  # the paths as the statement names them
    for run in runs:
        for path in sorted(paths_of(run.wf.steps) | run_paths(run.wf)):
            literal = _array_literal(path)
            by_literal[literal] = path
            wanted.append({"run_id": run.run_id, "path": literal})
    values: dict[str, dict[tuple[str, ...], str]] = {}
    if wanted:
        for run_id, literal, value in conn.execute(
            _VALUES_SQL, (orjson.dumps(wanted).decode(),)
        ).fetchall():
            values.setdefault(run_id, {})[by_literal[literal]] = value
    return values


def _views(
    conn: psycopg.Connection[Any], limits: Mapping[str, int], rated: Set[str]
) -> tuple[dict[str, LimitView], int]:
    """The counters of ``limits`` (key -> its limit; ``rated``: the rate limits' keys) as
    they stand (the second statement), and Postgres's time when it read them (epoch ms)."""
    keys = []
    for key, limit in sorted(limits.items()):
        # A rate counter lets a batch in RATE_LOOKAHEAD times at most: its waiters beyond
        # those cannot be let in before they are.
        ahead = min(limit, RATE_LOOKAHEAD) if key in rated else 0
        bound = ahead or limit
        keys.append({"key": key, "bound": bound, "span": limit, "ahead": ahead})
    views = {}
    read_ms = 0
    for now_ms, key, version, dispatched, rows, holders, queue in conn.execute(
        _VIEWS_SQL, (orjson.dumps(keys).decode(),)
    ).fetchall():
        read_ms = now_ms
        span = limits[key]
        first = dispatched - span
        at = dict(rows)
        bounds = tuple(at.get(first + j, 0) for j in range(min(span, RATE_LOOKAHEAD)))
        views[key] = LimitView(
            version,
            holders,
            bounds if key in rated else (),
            tuple((int(s), r, n) for s, r, n in queue),
            dispatched,
            span,
        )
    return views, read_ms


def _array_literal(path: tuple[str, ...]) -> str:
    """A Postgres text[] literal of ``path`` (each element quoted)."""
    quoted = ('"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"' for p in path)
    return "{" + ",".join(quoted) + "}"


# -- the commit statement's parts (io/postgres/store.py puts them in when a batch has limits)
# ------------

# Before the runs' UPDATE: every counter a run of the batch counted on moves to the next
# version if it is still at the one loaded (a counter without a row yet is created at 1), and
# a rate counter's count by the dispatches the batch let in; those are written as its rows,
# and the rows that fell out of what it keeps (its limit) deleted: a row each, whatever the
# limit (core/limits.py, rule 5). The times a counter kept as an array before (migration
# 0020 made them its first rows) are dropped at its first write: the row stays small.
GUARDED_CTE = """guarded AS (
    INSERT INTO eec_limit AS l (key, version, dispatched)
    SELECT g.key, g.expected + 1, g.first + coalesce(cardinality(g.times), 0)
      FROM jsonb_to_recordset(%(guards)s::jsonb)
           AS g(key text, expected bigint, times bigint[], first bigint)
    ON CONFLICT (key) DO UPDATE SET version = l.version + 1, dispatched = EXCLUDED.dispatched,
                                    recent = '{}'::bigint[]
     WHERE l.version = EXCLUDED.version - 1
    RETURNING l.key
), rate_taken AS (
    INSERT INTO eec_limit_rate (key, seq, at_ms)
    SELECT g.key, g.first + t.ord - 1, t.at
      FROM jsonb_to_recordset(%(guards)s::jsonb) AS g(key text, times bigint[], first bigint)
     CROSS JOIN LATERAL unnest(g.times) WITH ORDINALITY AS t(at, ord)
     WHERE g.key IN (SELECT key FROM guarded)
    ON CONFLICT (key, seq) DO UPDATE SET at_ms = EXCLUDED.at_ms
), rate_gone AS (
    -- Found through the key and the range of numbers (a lookup per counter: joined, the
    -- planner read every row of the counter), then deleted by their row ids.
    DELETE FROM eec_limit_rate d
     WHERE d.ctid = ANY(ARRAY(
           SELECT x.ctid
             FROM jsonb_to_recordset(%(guards)s::jsonb)
                  AS g(key text, times bigint[], first bigint, keep bigint)
            CROSS JOIN LATERAL (
                  SELECT x.ctid FROM eec_limit_rate x
                   WHERE x.key = g.key AND x.seq >= g.first - g.keep
                     AND x.seq < g.first + cardinality(g.times) - g.keep
                   LIMIT {lookahead}) AS x
            WHERE cardinality(g.times) > 0 AND g.key IN (SELECT key FROM guarded)))
), """.replace("{lookahead}", str(RATE_LOOKAHEAD))

# The runs' UPDATE writes a run only if every counter it counted on was guarded.
GUARD_CHECK = """
   AND (c.limits IS NULL OR NOT EXISTS (
        SELECT 1 FROM jsonb_array_elements_text(c.limits -> 'guards') AS k(key)
         WHERE k.key NOT IN (SELECT key FROM guarded)))"""

# After it, for the runs written: slots taken and freed, waits begun and ended, and the
# version of each counter a slot of which was freed moved (but those guarded already: a row
# is written once per statement).
LIMIT_CTES = """limit_holds AS (
    INSERT INTO eec_limit_hold (run_id, node, attempt, key)
    SELECT u.run_id, h.node, h.attempt, h.key
      FROM updated u
     CROSS JOIN LATERAL jsonb_to_recordset(u.limits -> 'holds')
           AS h(key text, node text, attempt int)
     WHERE u.limits IS NOT NULL
    ON CONFLICT DO NOTHING
), limit_releases AS (
    -- A slot whose attempt ended is freed, unless its execution still runs (a step in a
    -- thread, which cannot be stopped, after a timeout or a cancel): the slot then stays
    -- with it, lingering, until the watchdog sees it end (``free_lingering``).
    DELETE FROM eec_limit_hold h
     USING updated u
     WHERE u.limits IS NOT NULL AND h.run_id = u.run_id
       AND ((u.limits ->> 'ends')::boolean
            OR (h.node, h.attempt) IN (
                SELECT x.node, x.attempt
                  FROM jsonb_to_recordset(u.limits -> 'releases') AS x(node text, attempt int)))
       AND NOT {running}
    RETURNING h.key
), limit_lingers AS (
    UPDATE eec_limit_hold h SET lingering_since = coalesce(h.lingering_since, now())
      FROM updated u
     WHERE u.limits IS NOT NULL AND h.run_id = u.run_id
       AND ((u.limits ->> 'ends')::boolean
            OR (h.node, h.attempt) IN (
                SELECT x.node, x.attempt
                  FROM jsonb_to_recordset(u.limits -> 'releases') AS x(node text, attempt int)))
       AND {running}
), limit_waits AS (
    -- A waiter joins the line in its round (core/limit_line.py): no earlier than the round
    -- of the line's first, and after the last of its run key's own; those of one run key
    -- joining in this statement one round after another.
    INSERT INTO eec_limit_wait (key, run_id, node, since_ms, tier, run_key, round)
    SELECT j.key, j.run_id, j.node, j.since, j.tier, j.run_key,
           greatest(
               coalesce((SELECT q.round FROM eec_limit_wait q WHERE q.key = j.key AND {live}
                          ORDER BY q.round, q.since_ms, q.run_id, q.node LIMIT 1), 0),
               coalesce((SELECT max(m.round) + 1 FROM eec_limit_wait m
                          WHERE m.key = j.key AND m.run_key = j.run_key), 0))
           + row_number() OVER (PARTITION BY j.key, j.run_key
                                ORDER BY j.since, j.run_id, j.node) - 1
      FROM (SELECT w.key, u.run_id, w.node, w.since, u.tier,
                   coalesce(u.limits ->> 'run_key', '') AS run_key
              FROM updated u
             CROSS JOIN LATERAL jsonb_to_recordset(u.limits -> 'waits')
                   AS w(key text, node text, since bigint)
             WHERE u.limits IS NOT NULL
               AND NOT EXISTS (SELECT 1 FROM eec_limit_wait x WHERE x.run_id = u.run_id
                                  AND x.node = w.node AND x.key = w.key)) j
    ON CONFLICT DO NOTHING
), limit_unwaits AS (
    DELETE FROM eec_limit_wait w
     USING updated u
     WHERE u.limits IS NOT NULL AND w.run_id = u.run_id
       AND ((u.limits ->> 'ends')::boolean
            OR w.node IN (SELECT jsonb_array_elements_text(u.limits -> 'unwaits')))
), limit_freed AS (
    UPDATE eec_limit l SET version = l.version + 1
     WHERE l.key IN (SELECT key FROM limit_releases)
       AND l.key NOT IN (SELECT key FROM guarded)
), """.replace("{running}", running("h")).replace("{live}", LIVE_WAITER)


def guards_param(commits: Sequence[Commit]) -> str:
    """The batch's guards, one per counter, in key order (so two statements that guard the
    same counters lock their rows in the same order)."""
    guards: dict[str, Guard] = {}
    for commit in commits:
        if commit.limits is not None:
            for guard in commit.limits.guards:
                guards[guard.key] = guard
    return orjson.dumps(
        [
            {
                "key": g.key,
                "expected": g.expected,
                "times": g.times,
                "first": g.first,
                "keep": g.keep,
            }
            for g in sorted(guards.values())
        ]
    ).decode()


def limits_row(commit: Commit) -> dict[str, Any] | None:
    """A run's limit writes as the commit statement reads them (None: nothing)."""
    limits = commit.limits
    if limits is None:
        return None
    return {
        "guards": [g.key for g in limits.guards],
        "holds": [{"key": k, "node": n, "attempt": a} for k, n, a in limits.holds],
        "releases": [{"node": n, "attempt": a} for n, a in limits.releases],
        "waits": [{"key": k, "node": n, "since": s} for k, n, s in limits.waits],
        "unwaits": list(limits.unwaits),
        "ends": limits.ends,
        "run_key": limits.run_key,
    }


# -- after the commit ---------------------------------------------------------------------------

_WAITERS_SQL = """
SELECT DISTINCT w.run_id, w.tier
  FROM jsonb_to_recordset(%s::jsonb) AS k(key text, freed int)
 CROSS JOIN LATERAL ({line}) w
""".replace("{line}", _LINE.replace("{first}", "k.freed"))


def waiters_to_wake(conn: psycopg.Connection[Any], freed: Counter[str]) -> list[RunRef]:
    """(run id, tier) of the oldest waiters of each counter, one per slot ``freed``."""
    if not freed:
        return []
    keys = [{"key": k, "freed": n} for k, n in sorted(freed.items())]
    rows = conn.execute(_WAITERS_SQL, (orjson.dumps(keys).decode(),)).fetchall()
    return [(r[0], r[1]) for r in rows]


# The run force-failed (io/postgres/store.py's force-fail statement): its slots and waits go with
# it, but the slots of executions still running, which linger until they end.
FORCE_FAIL_CTES: str = """, freed_holds AS (
    DELETE FROM eec_limit_hold h USING failed f WHERE h.run_id = f.run_id AND NOT {running}
    RETURNING h.key
), lingering_holds AS (
    UPDATE eec_limit_hold h SET lingering_since = coalesce(h.lingering_since, now())
      FROM failed f WHERE h.run_id = f.run_id AND {running}
), ended_waits AS (
    DELETE FROM eec_limit_wait w USING failed f WHERE w.run_id = f.run_id
), freed_versions AS (
    UPDATE eec_limit l SET version = l.version + 1 WHERE l.key IN (SELECT key FROM freed_holds)
)""".replace("{running}", running("h"))


# The slots of executions that outlived their attempts, whose executions are over now (their
# worker reported their end, or is gone): freed, and their counters' versions moved (as a
# commit that frees a slot moves it: core/limits.py, rule 4), the freed counted by counter
# for their oldest waiters to be woken. Any instance's sweep takes them, a few at a time, and
# passes over the rows another holds (a lingering slot is rare: a step that ignored its
# cancellation, a hung one).
_FREE_LINGERING_SQL = """
WITH over AS (
    DELETE FROM eec_limit_hold h
     WHERE h.ctid = ANY(ARRAY(
           SELECT l.ctid FROM eec_limit_hold l
            WHERE l.lingering_since IS NOT NULL AND NOT {running}
            ORDER BY l.lingering_since LIMIT %(limit)s
              FOR UPDATE SKIP LOCKED))
    RETURNING h.key
), moved AS (
    UPDATE eec_limit l SET version = l.version + 1 WHERE l.key IN (SELECT key FROM over)
)
SELECT key, count(*) FROM over GROUP BY key
""".replace("{running}", running("l", judged=True))


def free_lingering(conn: psycopg.Connection[Any], gone_after_s: float, limit: int) -> Counter[str]:
    """Free the slots held by executions that outlived their attempts and are over now; how
    many were freed, by counter (their waiters to wake: ``waiters_to_wake``). Only an
    instance that may judge others gone asks (io/postgres/instances.py's Judge)."""
    rows = conn.execute(
        _FREE_LINGERING_SQL, {"gone_after_s": gone_after_s, "limit": limit}
    ).fetchall()
    return Counter({key: int(n) for key, n in rows})
