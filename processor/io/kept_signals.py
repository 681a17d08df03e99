"""The signals kept in ``eec_kept_signal`` (migration 0012): signals read from
``ductor.requests`` before the run they name existed. The start that creates the run takes
them (``take_kept_signals``, in the statement's transaction); the watchdog's sweep, over the
shards its instance owns, adopts those whose run appeared another way or in a race with the
keeping transaction, and dead-letters those that waited longer than the time to live.

A cancel has no time to live: it is kept until a start for its run id comes, however late,
and that run then ends cancelled before any step runs (were it dead-lettered, a late start
would run as if never cancelled). ``ductor gc`` deletes the cancels kept longer than the
finished runs it keeps (``delete_old_kept_cancels``): past that, a run id is forgotten anyway.

A kept signal is applied or dead-lettered, never both: once a sweep claims one for its dead
letter (``dead_letter_sent_at``, ``dead_letter_by``), no start takes it; it is deleted once
the broker has the dead letter (at a shutdown too), and sent again by another instance's sweep
only once the claiming instance is gone before that (io/instances.py).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from processor.core.model import SignalKind
from processor.core.records import Headers, Inbound
from processor.io.instances import alive
from processor.io.store import OutboxRelay

log = logging.getLogger("ductor.watchdog")

# Applied to a run that now exists: into eec_run_signal (a signal already recorded by another
# path is left as it is), the kept row deleted in the same statement.
_TAKE = """
WITH taken AS (
    DELETE FROM eec_kept_signal
     WHERE run_id = ANY(%s::text[]) AND dead_letter_sent_at IS NULL
    RETURNING run_id, signal_id, kind, payload
)
INSERT INTO eec_run_signal (run_id, signal_id, kind, payload)
SELECT run_id, signal_id, kind, payload FROM taken
ON CONFLICT DO NOTHING
"""

# The kept signals of the owned shards whose run exists, applied; each run with its tier, to
# wake it. Rows another transaction holds are left for the next sweep.
_ADOPT = """
WITH chosen AS (
    SELECT k.run_id, k.signal_id, r.tier
      FROM eec_kept_signal k JOIN eec_workflow_run r ON r.run_id = k.run_id
     WHERE k.dead_letter_sent_at IS NULL AND k.shard %% %(modulus)s = ANY(%(shards)s)
     LIMIT %(limit)s
       FOR UPDATE OF k SKIP LOCKED
), taken AS (
    DELETE FROM eec_kept_signal k USING chosen c
     WHERE k.run_id = c.run_id AND k.signal_id = c.signal_id
    RETURNING k.run_id, k.signal_id, k.kind, k.payload
), recorded AS (
    INSERT INTO eec_run_signal (run_id, signal_id, kind, payload)
    SELECT run_id, signal_id, kind, payload FROM taken
    ON CONFLICT DO NOTHING
)
SELECT DISTINCT c.run_id, c.tier FROM chosen c JOIN taken t USING (run_id, signal_id)
"""

# Expired kept signals of the owned shards whose run does not exist, and those claimed before
# by an instance that is gone (it died before the broker had their dead letters), claimed now.
# A cancel never expires (module docstring): the first half reads the partial index that holds
# only the signals that may (migration 0022), so cancels kept long cost the sweep nothing.
_CLAIM_EXPIRED = f"""
WITH expired AS (
    SELECT s.run_id, s.signal_id, s.received_at FROM eec_kept_signal s
     WHERE s.dead_letter_sent_at IS NULL AND s.kind <> '{SignalKind.CANCEL.value}'
       AND s.received_at < now() - make_interval(secs => %(ttl_s)s)
       AND s.shard %% %(modulus)s = ANY(%(shards)s)
       AND NOT EXISTS (SELECT 1 FROM eec_workflow_run r WHERE r.run_id = s.run_id)
     ORDER BY s.received_at LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), orphaned AS (
    SELECT s.run_id, s.signal_id, s.received_at FROM eec_kept_signal s
     WHERE %(judge)s AND s.dead_letter_sent_at IS NOT NULL
       AND s.shard %% %(modulus)s = ANY(%(shards)s) AND NOT {alive("s.dead_letter_by")}
     ORDER BY s.received_at LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), due AS (
    SELECT * FROM expired UNION ALL SELECT * FROM orphaned ORDER BY received_at LIMIT %(limit)s
)
UPDATE eec_kept_signal k SET dead_letter_sent_at = now(), dead_letter_by = %(me)s
  FROM due
 WHERE k.run_id = due.run_id AND k.signal_id = due.signal_id
RETURNING k.run_id, k.signal_id, k.record_key, k.record_value, k.record_headers,
          k.source_topic, k.source_partition, k.source_offset,
          extract(epoch FROM now() - k.received_at)
"""

# The cancels kept for runs that never started, received before a moment (``ductor gc``).
_OLD_CANCELS = f"""
  FROM eec_kept_signal
 WHERE kind = '{SignalKind.CANCEL.value}' AND dead_letter_sent_at IS NULL
   AND received_at < %(before)s
"""

_FORGET = """
DELETE FROM eec_kept_signal
 WHERE dead_letter_sent_at IS NOT NULL
   AND (run_id, signal_id) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
"""

# (run id, signal id): a kept signal.
KeptKey = tuple[str, str]


@dataclass(frozen=True)
class ExpiredSignal:
    """A kept signal whose run never came: its record as it was read, for its dead letter."""

    key: KeptKey
    record: Inbound
    kept_s: float  # how long it was kept


def take_kept_signals(conn: psycopg.Connection[Any], run_ids: Sequence[str]) -> None:
    """Apply the signals kept for runs just created (in the caller's transaction)."""
    if run_ids:
        conn.execute(_TAKE, (list(run_ids),))


def adopt_kept_signals(
    conn: psycopg.Connection[Any], modulus: int, shards: Sequence[int], limit: int
) -> list[tuple[str, str]]:
    """Apply the kept signals of the given shards whose run exists; the runs, with their
    tiers, to wake."""
    params = {"modulus": modulus, "shards": list(shards), "limit": limit}
    return [(r[0], r[1]) for r in conn.execute(_ADOPT, params).fetchall()]


def claim_expired_signals(
    conn: psycopg.Connection[Any],
    modulus: int,
    shards: Sequence[int],
    ttl_s: float,
    claimer: OutboxRelay,
    limit: int,
) -> list[ExpiredSignal]:
    """Claim for ``claimer`` the dead letters of the kept signals of the given shards older
    than ``ttl_s`` whose run does not exist, and of those claimed by an instance that is gone
    (as outbox rows are relayed: io/store.py's ``claim_outbox``)."""
    params = {
        "modulus": modulus,
        "shards": list(shards),
        "ttl_s": ttl_s,
        "limit": limit,
        "me": claimer.instance_id,
        "judge": claimer.may_judge,
        "gone_after_s": claimer.gone_after_s,
    }
    rows = conn.execute(_CLAIM_EXPIRED, params).fetchall()
    return [
        ExpiredSignal(
            (run_id, signal_id),
            Inbound(
                tp=(topic, partition),
                offset=offset,
                key=None if key is None else bytes(key),
                value=bytes(value),
                headers=_kept_headers(run_id, headers),
                tier="requests",
            ),
            float(kept_s),
        )
        for run_id, signal_id, key, value, headers, topic, partition, offset, kept_s in rows
    ]


def delete_old_kept_cancels(conn: psycopg.Connection[Any], before: datetime) -> int:
    """Delete the cancels kept for runs that never started, received before ``before``; how
    many (``ductor gc``: a run id is remembered as long as a finished run is kept)."""
    return conn.execute("DELETE" + _OLD_CANCELS, {"before": before}).rowcount


def count_old_kept_cancels(conn: psycopg.Connection[Any], before: datetime) -> int:
    """How many ``delete_old_kept_cancels`` would delete now."""
    row = conn.execute("SELECT count(*)" + _OLD_CANCELS, {"before": before}).fetchone()
    return int(row[0]) if row else 0


def forget_kept_signals(conn: psycopg.Connection[Any], keys: Sequence[KeptKey]) -> None:
    """Delete the kept signals whose dead letters the broker has."""
    if keys:
        conn.execute(_FORGET, ([k[0] for k in keys], [k[1] for k in keys]))


def encode_headers(headers: Headers) -> list[list[str]]:
    """Headers as JSON can keep them: each value base64 (any bytes)."""
    return [[name, base64.b64encode(value).decode()] for name, value in headers]


def decode_headers(kept: Sequence[Sequence[str]]) -> Headers:
    return [(str(name), base64.b64decode(value)) for name, value in kept]


def _kept_headers(run_id: str, kept: Any) -> Headers:
    """The record's headers as kept; none, said in the log, if they cannot be read (a row
    written by hand): its dead letter goes without them rather than stop the sweep."""
    try:
        return decode_headers(kept)
    except Exception as exc:
        log.error(
            "the kept signal of run %s has headers that cannot be read; its dead letter goes"
            " without them: %s",
            run_id,
            exc,
            extra={"run_id": run_id},
        )
        return []
