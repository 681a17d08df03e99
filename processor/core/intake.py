"""What to do with one consumed record, decided before anything else touches it.

Every record that reaches the processor gets exactly one of these verdicts:

- ``Accepted``: a decoded wakeup that is due: it joins its tier's queue, then its run's work.
- ``NotDue``: a delay-topic record whose due time has not come: its partition pauses at it and
  reads it again when due (the record is not taken: nothing is tracked for it).
- ``Hop``: a timer that came due on a rung before its real target: sent on for the rest.
- ``Reject``: a record that cannot be processed: dead-lettered with its reason.

Every verdict but ``NotDue`` takes the record: from then on its offset is held back until the
record is done (see offsets.py), whether it waits in a queue, a run's work or a dead letter.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.core.envelope import Rejected, decode_wakeup
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Inbound, KafkaMessage, normalise_headers
from processor.core.routing import TopicNames


@dataclass(frozen=True, slots=True)
class Accepted:
    record: Inbound


@dataclass(frozen=True, slots=True)
class NotDue:
    record: Inbound
    wait_ms: int


@dataclass(frozen=True, slots=True)
class Hop:
    record: Inbound


@dataclass(frozen=True, slots=True)
class Reject:
    record: Inbound
    reason: DeadLetterReason
    detail: str


Verdict = Accepted | NotDue | Hop | Reject


def admit(message: KafkaMessage, names: TopicNames, max_bytes: int, now_ms: int) -> Verdict:
    """The verdict on a record the consumer returned without an error."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    record = Inbound(
        tp=(topic, partition),
        offset=offset,
        key=message.key(),
        value=message.value(),
        headers=normalise_headers(message),
        tier=names.tier_of(topic),
    )
    try:
        decoded = decode_wakeup(record.value, max_bytes)
    except Exception as exc:  # a poison record must never stop the consumer
        detail = f"undecodable record: {type(exc).__name__}: {exc}"
        return Reject(record, DeadLetterReason.WRONG_SCHEMA, detail)
    if isinstance(decoded, Rejected):
        return Reject(record, decoded.reason, decoded.detail)
    record.wakeup = decoded
    if decoded.due_at is not None and decoded.due_at > now_ms:
        return NotDue(record, decoded.due_at - now_ms)
    if decoded.target_at is not None and decoded.target_at > now_ms:
        return Hop(record)
    return Accepted(record)
