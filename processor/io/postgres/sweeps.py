"""The watchdog's queries (engine/watchdog.py): live runs whose next wakeup is overdue (to wake
again, spaced out), and live runs stuck without a transition, each over the shards (wakeup
partitions) this instance owns. Quarantined runs are left out of both.

Neither writes a run's row (written only by versioned writes: docs/guarantees.md). When a run
was last re-woken is kept in ``eec_run_rewake``, and whether it is quarantined in
``eec_run_quarantine`` (io/postgres/run_marks.py). Each sweep walks its partial index of the live
runs in order and probes both tables by primary key for each run it reaches (scalar subqueries, so
that no plan joins a whole table of marks), up to its limit: its cost is the runs it passes
over (quarantined, re-woken lately) plus the runs it returns, never the size of either table
(tests/integration/test_query_plans.py reads the plans).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import psycopg

from processor.core.shapes import RunAtSeq, RunRef
from processor.io.postgres.run_marks import quarantined

# A run is re-woken once it is overdue by more than the grace, and again only once it has
# been overdue since the previous re-wake for longer than it was then (a run in a backlog is
# re-woken after 2, 4, 8 ... times the grace, not on every sweep).
_DUE_SQL = f"""
SELECT r.run_id, r.tier FROM eec_workflow_run r
 WHERE r.status IN ('pending', 'running')
   AND r.next_wakeup_at < now() - make_interval(secs => %(grace_s)s)
   AND r.shard %% %(modulus)s = ANY(%(shards)s)
   AND NOT {quarantined("r")}
   AND coalesce((
       SELECT now() - w.rewoken_at > greatest(make_interval(secs => %(grace_s)s),
                                              w.rewoken_at - r.next_wakeup_at)
         FROM eec_run_rewake w WHERE w.run_id = r.run_id), true)
 ORDER BY r.next_wakeup_at LIMIT %(limit)s
"""
# The due runs are marked in the same statement. Two sweeps of one shard (only while its
# partitions change hands) may both find a run; the one whose mark came second sees the
# first's and leaves the run to it (the condition on the mark is read again under its lock).
_REWAKE_DUE_SQL = f"""
WITH due AS MATERIALIZED ({_DUE_SQL}),
marked AS (
    INSERT INTO eec_run_rewake AS w (run_id, rewoken_at)
    SELECT run_id, now() FROM due
    ON CONFLICT (run_id) DO UPDATE SET rewoken_at = now() WHERE w.rewoken_at < now()
    RETURNING w.run_id
)
SELECT due.run_id, due.tier FROM due JOIN marked ON marked.run_id = due.run_id
"""
_MARK_SQL = """
INSERT INTO eec_run_rewake AS w (run_id, rewoken_at)
SELECT jsonb_array_elements_text(%s::jsonb), now()
ON CONFLICT (run_id) DO UPDATE SET rewoken_at = now() WHERE w.rewoken_at < now()
RETURNING w.run_id
"""
_STUCK_SQL = f"""
SELECT r.run_id, r.last_transition_seq FROM eec_workflow_run r
 WHERE r.status IN ('pending', 'running')
   AND r.last_transition_at < now() - make_interval(secs => %(stuck_s)s)
   AND (r.next_wakeup_at IS NULL
        OR r.next_wakeup_at < now() - make_interval(secs => %(stuck_s)s))
   AND r.shard %% %(modulus)s = ANY(%(shards)s)
   AND NOT {quarantined("r")}
   AND coalesce((
       SELECT w.rewoken_at < now() - make_interval(secs => %(grace_s)s)
         FROM eec_run_rewake w WHERE w.run_id = r.run_id), true)
 ORDER BY r.last_transition_at LIMIT %(limit)s
"""


def rewake_due(
    conn: psycopg.Connection[Any], modulus: int, shards: Sequence[int], grace_s: float, limit: int
) -> list[RunRef]:
    """Live runs of the given shards whose next wakeup is overdue by more than the grace and
    that were not re-woken lately, marked re-woken now; each with its tier (quarantined runs
    are left out: re-waking them would only dead-letter the wakeup). Nothing here writes a
    run's row, so no row, however bad, can make this fail, and no row lock is taken or
    waited for: a commit and a sweep never hold each other."""
    params = {"grace_s": grace_s, "modulus": modulus, "shards": list(shards), "limit": limit}
    return [(r[0], r[1]) for r in conn.execute(_REWAKE_DUE_SQL, params).fetchall()]


def mark_rewoken(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> set[str]:
    """Mark runs re-woken now (the runs the stuck sweep wakes), in one statement; the ones
    marked (a run another sweep marked since this one began is left to it)."""
    if not run_ids:
        return set()
    rows = conn.execute(_MARK_SQL, (orjson.dumps(list(run_ids)).decode(),)).fetchall()
    return {r[0] for r in rows}


def sweep_stuck(
    conn: psycopg.Connection[Any],
    modulus: int,
    shards: Sequence[int],
    stuck_s: float,
    grace_s: float,
    limit: int,
) -> list[RunAtSeq]:
    """Live runs of the given shards that made no transition for longer than ``stuck_s`` and
    are not legitimately waiting: no deadline or retry time is ahead of them, the last one
    passed more than ``stuck_s`` ago, and they were not woken lately. Each with the seq it was
    selected at, so that a force-fail never lands on a run that moved since."""
    params = {
        "stuck_s": stuck_s,
        "grace_s": grace_s,
        "modulus": modulus,
        "shards": list(shards),
        "limit": limit,
    }
    return [(r[0], r[1]) for r in conn.execute(_STUCK_SQL, params).fetchall()]
