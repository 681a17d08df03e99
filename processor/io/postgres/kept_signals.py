"""The signals kept in ``eec_kept_signal`` (migration 0012): signals read from
``ductor.requests`` before the run they name existed. The start that creates the run takes
them (``take_kept_signals``, in the statement's transaction); the watchdog's sweep, over the
shards its instance owns, adopts those whose run appeared another way or in a race with the
keeping transaction, and dead-letters those that waited longer than the time to live.

A kept signal lands on its run only as any signal does (core/landing.py): one whose name no
wait step of the run's workflow waits for, or (adopted by a sweep) whose run has ended, is not
applied but marked refused with the reason (migration 0034), and the sweep of its shard's
owner dead-letters it at once (``unknown_signal``, ``run_ended``), as it does an expired one.

A cancel has no time to live: it is kept until a start for its run id comes, however late,
and that run then ends cancelled before any step runs (were it dead-lettered, a late start
would run as if never cancelled). ``ductor gc`` deletes the cancels kept longer than the
finished runs it keeps (``delete_old_kept_cancels``): past that, a run id is forgotten anyway.

A kept signal is applied or dead-lettered, never both: once a sweep claims one for its dead
letter (``dead_letter_sent_at``, ``dead_letter_by``), no start takes it; it is deleted once
the broker has the dead letter (at a shutdown too), and sent again by another instance's sweep
only once the claiming instance is gone before that (io/postgres/instances.py).
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from processor.core.landing import LandingRefusal, landing_problem
from processor.core.model import SignalKind, UnknownWorkflow
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Headers, Inbound
from processor.core.run_state import RunStatus
from processor.core.shapes import RunRef
from processor.core.workflow_def import WorkflowDef
from processor.io.postgres.instances import alive
from processor.io.postgres.outbox import OutboxRelay
from processor.io.postgres.store import Definitions

log = logging.getLogger("ductor.watchdog")

# The kept signals of runs just created, locked until their verdict is written.
_KEPT_FOR = """
SELECT run_id, signal_id, kind FROM eec_kept_signal
 WHERE run_id = ANY(%s::text[]) AND dead_letter_sent_at IS NULL AND refused_reason IS NULL
   FOR UPDATE
"""

# The kept signals of the owned shards whose run exists, with the run as it stands (its
# workflow, status and tier), for their verdicts. Rows another transaction holds are left for
# the next sweep.
_ADOPTABLE = """
SELECT k.run_id, k.signal_id, k.kind, r.workflow_name, r.workflow_version, r.status, r.tier
  FROM eec_kept_signal k JOIN eec_workflow_run r ON r.run_id = k.run_id
 WHERE k.dead_letter_sent_at IS NULL AND k.refused_reason IS NULL
   AND k.shard %% %(modulus)s = ANY(%(shards)s)
 LIMIT %(limit)s
   FOR UPDATE OF k SKIP LOCKED
"""

# The verdicts on kept signals whose run exists: those that land are applied (into
# eec_run_signal; one recorded already by another path is left as it is) and deleted, the
# others marked refused with why, for their dead letters.
_SETTLE = """
WITH taken AS (
    DELETE FROM eec_kept_signal k
     USING unnest(%(runs)s::text[], %(ids)s::text[]) AS t(run_id, signal_id)
     WHERE k.run_id = t.run_id AND k.signal_id = t.signal_id
    RETURNING k.run_id, k.signal_id, k.kind, k.payload
), recorded AS (
    INSERT INTO eec_run_signal (run_id, signal_id, kind, payload)
    SELECT run_id, signal_id, kind, payload FROM taken
    ON CONFLICT DO NOTHING
)
UPDATE eec_kept_signal k SET refused_reason = x.reason, refused_detail = x.detail
  FROM unnest(%(refused_runs)s::text[], %(refused_ids)s::text[], %(reasons)s::text[],
              %(details)s::text[]) AS x(run_id, signal_id, reason, detail)
 WHERE k.run_id = x.run_id AND k.signal_id = x.signal_id
"""

# Expired kept signals of the owned shards whose run does not exist, refused ones, and those
# claimed before by an instance that is gone (it died before the broker had their dead
# letters), claimed now. A cancel never expires (module docstring): the first part reads the
# partial index that holds only the signals that may (migration 0022), so cancels kept long
# cost the sweep nothing; the second the one of the refused (migration 0034).
_CLAIM_EXPIRED = f"""
WITH expired AS (
    SELECT s.run_id, s.signal_id, s.received_at FROM eec_kept_signal s
     WHERE s.dead_letter_sent_at IS NULL AND s.kind <> '{SignalKind.CANCEL.value}'
       AND s.received_at < now() - make_interval(secs => %(ttl_s)s)
       AND s.refused_reason IS NULL AND s.shard %% %(modulus)s = ANY(%(shards)s)
       AND NOT EXISTS (SELECT 1 FROM eec_workflow_run r WHERE r.run_id = s.run_id)
     ORDER BY s.received_at LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), refused AS (
    SELECT s.run_id, s.signal_id, s.received_at FROM eec_kept_signal s
     WHERE s.refused_reason IS NOT NULL AND s.dead_letter_sent_at IS NULL
       AND s.shard %% %(modulus)s = ANY(%(shards)s)
     ORDER BY s.received_at LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), orphaned AS (
    SELECT s.run_id, s.signal_id, s.received_at FROM eec_kept_signal s
     WHERE %(judge)s AND s.dead_letter_sent_at IS NOT NULL
       AND s.shard %% %(modulus)s = ANY(%(shards)s) AND NOT {alive("s.dead_letter_by")}
     ORDER BY s.received_at LIMIT %(limit)s
       FOR UPDATE SKIP LOCKED
), due AS (
    SELECT * FROM expired UNION ALL SELECT * FROM refused UNION ALL SELECT * FROM orphaned
     ORDER BY received_at LIMIT %(limit)s
)
UPDATE eec_kept_signal k SET dead_letter_sent_at = now(), dead_letter_by = %(me)s
  FROM due
 WHERE k.run_id = due.run_id AND k.signal_id = due.signal_id
RETURNING k.run_id, k.signal_id, k.record_key, k.record_value, k.record_headers,
          k.source_topic, k.source_partition, k.source_offset,
          extract(epoch FROM now() - k.received_at), k.refused_reason, k.refused_detail
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
class KeptDeadLetter:
    """A kept signal to dead-letter: its run never came (``unknown_run``), or came and
    cannot take it (core/landing.py's reasons); its record as it was read, and why."""

    key: KeptKey
    record: Inbound
    reason: DeadLetterReason
    detail: str


def take_kept_signals(
    conn: psycopg.Connection[Any], wf: WorkflowDef, run_ids: Sequence[str]
) -> None:
    """Apply the signals kept for runs of ``wf`` just created, those that can land there; mark
    the others refused (in the caller's transaction, or one of its own)."""
    if not run_ids:
        return
    with conn.transaction():
        rows = conn.execute(_KEPT_FOR, (list(run_ids),)).fetchall()
        if rows:
            verdicts = [
                ((run_id, signal_id), landing_problem(run_id, wf, RunStatus.PENDING, kind))
                for run_id, signal_id, kind in rows
            ]
            _settle(conn, verdicts)


def adopt_kept_signals(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    modulus: int,
    shards: Sequence[int],
    limit: int,
) -> list[RunRef]:
    """Apply the kept signals of the given shards whose run exists, those that can land there
    (the others are marked refused, for their dead letters); the runs given one, with their
    tiers, to wake."""
    params = {"modulus": modulus, "shards": list(shards), "limit": limit}
    with conn.transaction():
        rows = conn.execute(_ADOPTABLE, params).fetchall()
        verdicts: list[tuple[KeptKey, LandingRefusal | None]] = []
        woken: dict[str, str] = {}
        for run_id, signal_id, kind, name, version, status, tier in rows:
            try:
                wf = definitions.get(conn, (name, version))
            except UnknownWorkflow as exc:
                refusal: LandingRefusal | None = LandingRefusal(
                    DeadLetterReason.UNKNOWN_WORKFLOW, str(exc)
                )
            else:
                refusal = landing_problem(run_id, wf, RunStatus(status), kind)
            verdicts.append(((run_id, signal_id), refusal))
            if refusal is None:
                woken[run_id] = tier
        if verdicts:
            _settle(conn, verdicts)
    return sorted(woken.items())


def _settle(
    conn: psycopg.Connection[Any], verdicts: Sequence[tuple[KeptKey, LandingRefusal | None]]
) -> None:
    taken = [key for key, refusal in verdicts if refusal is None]
    refused = [(key, refusal) for key, refusal in verdicts if refusal is not None]
    conn.execute(
        _SETTLE,
        {
            "runs": [k[0] for k in taken],
            "ids": [k[1] for k in taken],
            "refused_runs": [k[0] for k, _ in refused],
            "refused_ids": [k[1] for k, _ in refused],
            "reasons": [r.reason.value for _, r in refused],
            "details": [r.detail for _, r in refused],
        },
    )


def claim_kept_dead_letters(
    conn: psycopg.Connection[Any],
    modulus: int,
    shards: Sequence[int],
    ttl_s: float,
    claimer: OutboxRelay,
    limit: int,
) -> list[KeptDeadLetter]:
    """Claim for ``claimer`` the dead letters of the kept signals of the given shards older
    than ``ttl_s`` whose run does not exist, of those refused by their run, and of those
    claimed by an instance that is gone (as outbox rows are relayed: io/postgres/store.py's
    ``claim_outbox``)."""
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
    claimed = []
    for run_id, signal_id, key, value, headers, topic, partition, offset, *why in rows:
        kept_s, refused_reason, refused_detail = why
        record = Inbound(
            tp=(topic, partition),
            offset=offset,
            key=None if key is None else bytes(key),
            value=bytes(value),
            headers=_kept_headers(run_id, headers),
            tier="requests",
        )
        if refused_reason is None:
            reason = DeadLetterReason.UNKNOWN_RUN
            detail = f"no run {run_id!r} was started within {float(kept_s):.0f} s of this signal"
        else:
            reason, detail = _refused(run_id, refused_reason, refused_detail)
        claimed.append(KeptDeadLetter((run_id, signal_id), record, reason, detail))
    return claimed


def _refused(run_id: str, reason: str, detail: str | None) -> tuple[DeadLetterReason, str]:
    """The refusal as written; a reason this version does not know (a row written by hand, or
    by a newer version) is dead-lettered as unexpected, its text kept in the detail."""
    try:
        return DeadLetterReason(reason), detail or ""
    except ValueError:
        return (
            DeadLetterReason.UNEXPECTED_ERROR,
            f"the kept signal of run {run_id!r} was refused as {reason!r}: {detail or ''}",
        )


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
