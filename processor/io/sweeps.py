"""The watchdog's queries (engine/watchdog.py): live runs whose next wakeup is overdue, and live
runs stuck without a transition, each over the shards (wakeup partitions) this instance owns.
Quarantined runs are left out of both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg


def sweep_due(
    conn: psycopg.Connection[Any], modulus: int, shards: Sequence[int], grace_s: float, limit: int
) -> list[tuple[str, str]]:
    """Live runs of the given shards whose next wakeup is overdue by more than the grace
    (quarantined runs are left out: re-waking them would only dead-letter the wakeup)."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT run_id, tier FROM eec_workflow_run"
            " WHERE status IN ('pending', 'running') AND quarantined_at IS NULL"
            "   AND next_wakeup_at < now() - make_interval(secs => %s)"
            "   AND shard %% %s = ANY(%s)"
            " ORDER BY next_wakeup_at LIMIT %s",
            (grace_s, modulus, list(shards), limit),
        ).fetchall()
    ]


def sweep_stuck(
    conn: psycopg.Connection[Any], modulus: int, shards: Sequence[int], stuck_s: float, limit: int
) -> list[tuple[str, int]]:
    """Live runs of the given shards that made no transition for longer than ``stuck_s`` and
    are not legitimately waiting: no deadline or retry time is ahead of them, and the last one
    passed more than ``stuck_s`` ago (re-waking it did not help). Each with the seq it was
    selected at, so that a force-fail never lands on a run that moved since."""
    return [
        (r[0], r[1])
        for r in conn.execute(
            "SELECT run_id, last_transition_seq FROM eec_workflow_run"
            " WHERE status IN ('pending', 'running') AND quarantined_at IS NULL"
            "   AND last_transition_at < now() - make_interval(secs => %s)"
            "   AND (next_wakeup_at IS NULL"
            "        OR next_wakeup_at < now() - make_interval(secs => %s))"
            "   AND shard %% %s = ANY(%s)"
            " ORDER BY last_transition_at LIMIT %s",
            (stuck_s, stuck_s, modulus, list(shards), limit),
        ).fetchall()
    ]
