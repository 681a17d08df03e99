"""The watchdog's queries (engine/watchdog.py): live runs whose next wakeup is overdue (to wake
again, spaced out), and live runs stuck without a transition, each over the shards (wakeup
partitions) this instance owns. Quarantined runs are left out of both.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import psycopg

from processor.io.db_errors import Fault, classify
from processor.io.logs import first_line

log = logging.getLogger("ductor.watchdog")

# A run is re-woken once it is overdue by more than the grace, and again only once it has
# been overdue since the previous re-wake for longer than it was then (a run in a backlog is
# re-woken after 2, 4, 8 ... times the grace, not on every sweep). The rows are taken without
# waiting for one another transaction holds (SKIP LOCKED), and marked in the same statement.
_DUE_SQL = """
SELECT run_id FROM eec_workflow_run
 WHERE status IN ('pending', 'running') AND quarantined_at IS NULL
   AND next_wakeup_at < now() - make_interval(secs => %(grace_s)s)
   AND (rewoken_at IS NULL
        OR now() - rewoken_at > greatest(make_interval(secs => %(grace_s)s),
                                         rewoken_at - next_wakeup_at))
   AND shard %% %(modulus)s = ANY(%(shards)s)
 ORDER BY next_wakeup_at LIMIT %(limit)s
   FOR NO KEY UPDATE SKIP LOCKED
"""
_REWAKE_DUE_SQL = f"""
UPDATE eec_workflow_run r SET rewoken_at = now()
  FROM ({_DUE_SQL}) due
 WHERE r.run_id = due.run_id
RETURNING r.run_id, r.tier
"""
_MARK_SQL = "UPDATE eec_workflow_run SET rewoken_at = now() WHERE run_id = %s RETURNING tier"


def rewake_due(
    conn: psycopg.Connection[Any], modulus: int, shards: Sequence[int], grace_s: float, limit: int
) -> list[tuple[str, str]]:
    """Live runs of the given shards whose next wakeup is overdue by more than the grace and
    that were not re-woken lately, marked re-woken now; each with its tier (quarantined runs
    are left out: re-waking them would only dead-letter the wakeup). Should one row make the
    marking fail (a row the commit path dead-letters as poison), the runs are marked one by
    one and that one is left out: one bad row never stops the sweep of the others."""
    params = {"grace_s": grace_s, "modulus": modulus, "shards": list(shards), "limit": limit}
    try:
        return [(r[0], r[1]) for r in conn.execute(_REWAKE_DUE_SQL, params).fetchall()]
    except psycopg.Error as exc:
        if classify(exc) is not Fault.ROW:
            raise
    due = [r[0] for r in conn.execute(_DUE_SQL, params).fetchall()]
    return [(run_id, tier) for run_id, tier in mark_rewoken(conn, due)]


def mark_rewoken(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> list[tuple[str, str]]:
    """Mark runs re-woken now, one by one (the stuck sweep's, and the overdue sweep's after a
    row refused its batch): each with its tier; a run whose row refuses it is left out."""
    marked: list[tuple[str, str]] = []
    for run_id in run_ids:
        try:
            row = conn.execute(_MARK_SQL, (run_id,)).fetchone()
        except psycopg.Error as exc:
            if classify(exc) is not Fault.ROW:
                raise
            log.warning(
                "run %s: not re-woken: %s", run_id, first_line(exc), extra={"run_id": run_id}
            )
            continue
        if row is not None:
            marked.append((run_id, row[0]))
    return marked


def sweep_stuck(
    conn: psycopg.Connection[Any],
    modulus: int,
    shards: Sequence[int],
    stuck_s: float,
    grace_s: float,
    limit: int,
) -> list[tuple[str, int]]:
    """Live runs of the given shards that made no transition for longer than ``stuck_s`` and
    are not legitimately waiting: no deadline or retry time is ahead of them, the last one
    passed more than ``stuck_s`` ago, and they were not woken lately. Each with the seq it was
    selected at, so that a force-fail never lands on a run that moved since."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT run_id, last_transition_seq FROM eec_workflow_run"
            " WHERE status IN ('pending', 'running') AND quarantined_at IS NULL"
            "   AND last_transition_at < now() - make_interval(secs => %(stuck_s)s)"
            "   AND (next_wakeup_at IS NULL"
            "        OR next_wakeup_at < now() - make_interval(secs => %(stuck_s)s))"
            "   AND (rewoken_at IS NULL"
            "        OR rewoken_at < now() - make_interval(secs => %(grace_s)s))"
            "   AND shard %% %(modulus)s = ANY(%(shards)s)"
            " ORDER BY last_transition_at LIMIT %(limit)s",
            {
                "stuck_s": stuck_s,
                "grace_s": grace_s,
                "modulus": modulus,
                "shards": list(shards),
                "limit": limit,
            },
        ).fetchall()
    ]
