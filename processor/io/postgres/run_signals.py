"""Signals recorded for runs that exist, as every door records them once core/landing.py let
them: the runs the signals name as they stand (their workflow, status and tier, and whether
each signal id is recorded already), then the signals recorded only for runs still live, in
the same statement that checks it, so that a run that ended since it was read gets no signal
(the caller reads again to say whether it ended or the signal was recorded meanwhile).

Both statements take batches (the request statement's signals: io/postgres/request_store.py); the
client records one at a time. Kept signals, for runs that do not exist yet, are in
io/postgres/kept_signals.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import psycopg

from processor.core.run_state import TERMINAL_STATUSES, RunStatus
from processor.core.shapes import WorkflowKey

# (run id, signal id): one signal of one run.
SignalKey = tuple[str, str]

_LIVE = [s.value for s in RunStatus if s not in TERMINAL_STATUSES]

# Each run looked up in the primary key (LATERAL ... LIMIT 1: a plain join with the unnested
# ids lets the planner read the whole run table), each signal id in the signals' primary key.
_TARGETS = """
SELECT g.run_id, g.signal_id, r.workflow_name, r.workflow_version, r.status, r.tier,
       EXISTS (SELECT 1 FROM eec_run_signal s
                WHERE s.run_id = g.run_id AND s.signal_id = g.signal_id)
  FROM unnest(%s::text[], %s::text[]) AS g(run_id, signal_id)
  LEFT JOIN LATERAL (
       SELECT x.workflow_name, x.workflow_version, x.status, x.tier
         FROM eec_workflow_run x WHERE x.run_id = g.run_id LIMIT 1
       ) r ON true
"""

_RECORD_LIVE = """
INSERT INTO eec_run_signal (run_id, signal_id, kind, payload)
SELECT g.run_id, g.signal_id, g.kind, g.payload
  FROM unnest(%(runs)s::text[], %(ids)s::text[], %(kinds)s::text[], %(payloads)s::jsonb[])
       AS g(run_id, signal_id, kind, payload)
 WHERE EXISTS (SELECT 1 FROM eec_workflow_run r
                WHERE r.run_id = g.run_id AND r.status = ANY(%(live)s::text[]))
ON CONFLICT DO NOTHING
RETURNING run_id, signal_id
"""


@dataclass(frozen=True)
class SignalTarget:
    """The run a signal names, as it stands: None fields when there is no such run."""

    workflow: WorkflowKey | None
    status: RunStatus | None
    tier: str | None
    recorded: bool  # a signal with this id is recorded for the run already


@dataclass(frozen=True)
class Signal:
    run_id: str
    signal_id: str
    name: str
    payload: Any = None  # JSON; {} when None

    @property
    def key(self) -> SignalKey:
        return (self.run_id, self.signal_id)


def signal_targets(
    conn: psycopg.Connection[Any], keys: Sequence[SignalKey]
) -> dict[SignalKey, SignalTarget]:
    """The run each signal names, as it stands now, in one statement."""
    if not keys:
        return {}
    rows = conn.execute(_TARGETS, ([k[0] for k in keys], [k[1] for k in keys])).fetchall()
    found: dict[SignalKey, SignalTarget] = {}
    for run_id, signal_id, name, version, status, tier, recorded in rows:
        workflow = None if name is None else (str(name), int(version))
        found[(run_id, signal_id)] = SignalTarget(
            workflow,
            None if status is None else RunStatus(status),
            None if tier is None else str(tier),
            bool(recorded),
        )
    return found


def record_live_signals(conn: psycopg.Connection[Any], signals: Sequence[Signal]) -> set[SignalKey]:
    """Record each signal whose run has not ended (once per signal id), in one statement;
    the signals this call recorded."""
    if not signals:
        return set()
    rows = conn.execute(
        _RECORD_LIVE,
        {
            "runs": [s.run_id for s in signals],
            "ids": [s.signal_id for s in signals],
            "kinds": [s.name for s in signals],
            "payloads": [_json(s.payload) for s in signals],
            "live": _LIVE,
        },
    ).fetchall()
    return {(r[0], r[1]) for r in rows}


def _json(value: Any) -> str:
    return orjson.dumps({} if value is None else value).decode()
