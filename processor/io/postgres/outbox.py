"""The outbox (``eec_outbox``): the records a committed transition produced, as the commit
statement writes them (io/postgres/commit_sql.py), deleted once the broker acknowledged them,
claimed by a relay when no live instance will send them, parked when the broker refuses one
for good and unparked by an operator."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import orjson
import psycopg

from processor.core.plans import Send
from processor.core.shapes import OutboxKey
from processor.io.postgres.instances import alive

DELETE_OUTBOX_SQL = """
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


def delete_outbox(conn: psycopg.Connection[Any], acknowledged: Sequence[OutboxKey]) -> None:
    """Delete the outbox rows whose records the broker acknowledged."""
    if acknowledged:
        conn.execute(DELETE_OUTBOX_SQL, {"acked": pairs(acknowledged)})


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
        (run_id, seq, tuple(send_of(record) for record in records)) for run_id, seq, records in rows
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


def outbox_record(send: Send) -> list[str | None]:
    """A record as the outbox keeps it: keys and values of the engine's records are UTF-8
    JSON text and run ids; headers are not kept (trace context is added when sent)."""
    key = None if send.key is None else send.key.decode()
    value = None if send.value is None else send.value.decode()
    return [send.topic, key, value, send.by_run]


def send_of(record: list[str | None]) -> Send:
    topic, key, value, by_run = record
    assert topic is not None
    return Send(
        topic,
        key=None if key is None else key.encode(),
        value=None if value is None else value.encode(),
        by_run=by_run,
    )


def pairs(acknowledged: Sequence[OutboxKey]) -> str:
    return orjson.dumps([{"run_id": r, "seq": s} for r, s in acknowledged]).decode()
