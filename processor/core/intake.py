"""What to do with one consumed record, decided before anything else touches it.

Every record that reaches the processor gets exactly one of these verdicts:

- ``Accepted``: a decoded wakeup that is due: it joins its tier's queue, then its run's work.
- ``NotDue``: a delay-topic record whose due time has not come: its partition pauses at it and
  reads it again when due (the record is not taken: nothing is tracked for it).
- ``Hop``: a wakeup that must wait longer than where it is: a timer due on a rung before its
  real target, or a wakeup-tier record with a due time ahead (a tier is never paused for one
  record: it goes to the delay ladder instead).
- ``Requested``: a decoded request from ``ductor.requests`` (start a run, signal one,
  core/requests.py): it joins the next request statement (engine/request_desk.py).
- ``Reject``: a record that cannot be processed: dead-lettered with its reason.

A record of a trigger's source topic (core/triggers.py) is judged by ``admit_trigger``: it is
``Requested`` as if read from ``ductor.requests``, ``Skipped`` (its trigger's filter leaves it
out: taken and done at once), or a ``Reject``. A request from either door outside that door's
scope (core/scopes.py) is a ``Reject`` (``not_allowed``).

Due times have a horizon: a delay record is never due later than its rung, a wakeup-tier
record never later than the longest rung, a timer's target never later than the longest retry
wait a workflow may declare — each plus a tolerance for clocks that disagree. A time past its
horizon is out of bounds (it would hold a partition, or hop from rung to rung, for nothing).

Every verdict but ``NotDue`` takes the record: from then on its offset is held back until the
record is done (see offsets.py), whether it waits in a queue, a run's work or a dead letter.
"""

from __future__ import annotations

from dataclasses import dataclass

from processor.core.envelope import Rejected, Wakeup, decode_wakeup
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Inbound, KafkaMessage, normalise_headers
from processor.core.requests import Request, decode_request
from processor.core.routing import DELAY_RUNGS_MS, TopicNames
from processor.core.scopes import ANY_DOOR, Scope, scope_refusal
from processor.core.triggers import Filtered, Trigger, map_record, trigger_scope
from processor.core.workflow_def import MAX_BACKOFF_MS

CLOCK_TOLERANCE_MS = 60_000  # producers' clocks may be this far ahead of ours


@dataclass(frozen=True, slots=True)
class Accepted:
    record: Inbound

    # Written out: compiled in the compiled build (the decorator's is interpreted Python),
    # and one is built per record admitted.
    def __init__(self, record: Inbound) -> None:
        object.__setattr__(self, "record", record)


@dataclass(frozen=True, slots=True)
class NotDue:
    record: Inbound
    wait_ms: int


@dataclass(frozen=True, slots=True)
class Hop:
    record: Inbound
    target_ms: int  # when the wakeup is really due


@dataclass(frozen=True, slots=True)
class Requested:
    record: Inbound
    request: Request


@dataclass(frozen=True, slots=True)
class Reject:
    record: Inbound
    reason: DeadLetterReason
    detail: str


@dataclass(frozen=True, slots=True)
class Skipped:
    """A trigger's record its filter leaves out: done, nothing to do."""

    record: Inbound


RecordVerdict = Accepted | NotDue | Hop | Requested | Reject


def admit_trigger(
    message: KafkaMessage, trigger: Trigger, max_bytes: int
) -> Requested | Skipped | Reject:
    """The verdict on a record of a trigger's source topic; never raises on what it holds."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    record = Inbound((topic, partition), offset, message.key(), message.value(), [], "trigger")
    try:
        record.headers = normalise_headers(message)
        mapped = map_record(trigger, record, max_bytes)
    except Exception as exc:
        detail = f"undecodable record: {type(exc).__name__}: {exc}"
        return Reject(record, DeadLetterReason.WRONG_SCHEMA, detail)
    if isinstance(mapped, Rejected):
        return Reject(record, mapped.reason, f"trigger {trigger.name}: {mapped.detail}")
    if isinstance(mapped, Filtered):
        return Skipped(record)
    refused = scope_refusal(trigger_scope(trigger), mapped)
    if refused is not None:
        return Reject(record, refused.reason, refused.detail)
    return Requested(record, mapped)


def admit(
    message: KafkaMessage,
    names: TopicNames,
    max_bytes: int,
    now_ms: int,
    scope: Scope = ANY_DOOR,
) -> RecordVerdict:
    """The verdict on a record the consumer returned without an error; a request outside
    ``scope`` (the requests topic's: core/scopes.py) is refused. Never raises on what the
    record holds: a poison record must never stop the consumer."""
    topic, partition, offset = message.topic(), message.partition(), message.offset()
    assert topic is not None and partition is not None and offset is not None
    record = Inbound(
        tp=(topic, partition),
        offset=offset,
        key=message.key(),
        value=message.value(),
        headers=[],
        tier=names.tier_of(topic),
    )
    try:
        record.headers = normalise_headers(message)
        if record.tier == "requests":
            return _request(record, max_bytes, scope)
        decoded = decode_wakeup(record.value, max_bytes)
    except Exception as exc:
        detail = f"undecodable record: {type(exc).__name__}: {exc}"
        return Reject(record, DeadLetterReason.WRONG_SCHEMA, detail)
    if isinstance(decoded, Rejected):
        return Reject(record, decoded.reason, decoded.detail)
    record.wakeup = decoded
    return _timed(record, decoded, names, topic, now_ms)


def _request(record: Inbound, max_bytes: int, scope: Scope) -> RecordVerdict:
    """The verdict on a record of the requests topic, if it is within ``scope``."""
    request = decode_request(record.value, max_bytes)
    if isinstance(request, Rejected):
        return Reject(record, request.reason, request.detail)
    refused = scope_refusal(scope, request)
    if refused is not None:
        return Reject(record, refused.reason, refused.detail)
    return Requested(record, request)


def _timed(
    record: Inbound, decoded: Wakeup, names: TopicNames, topic: str, now_ms: int
) -> RecordVerdict:
    """The verdict on a wakeup by its times: out of bounds, not due yet, to hop to a delay
    topic, or accepted."""
    due_at, target_at = decoded.due_at, decoded.target_at
    # A target is bounded whatever the due time: a record due soon must not carry one past it.
    if target_at is not None and target_at > now_ms + MAX_BACKOFF_MS + CLOCK_TOLERANCE_MS:
        detail = f"target_at is {target_at - now_ms} ms ahead, past {MAX_BACKOFF_MS} ms"
        return Reject(record, DeadLetterReason.OUT_OF_BOUNDS, detail)
    if due_at is not None and due_at > now_ms:
        on_delay = record.tier == "delay"
        horizon = names.rung_of(topic) if on_delay else DELAY_RUNGS_MS[-1]
        if due_at > now_ms + horizon + CLOCK_TOLERANCE_MS:
            detail = f"due_at is {due_at - now_ms} ms ahead, past its horizon {horizon} ms"
            return Reject(record, DeadLetterReason.OUT_OF_BOUNDS, detail)
        if on_delay:
            return NotDue(record, due_at - now_ms)
        # Really due at the later of the two: the hop must not drop a target it carries.
        return Hop(record, max(due_at, target_at or 0))
    if target_at is not None and target_at > now_ms:
        return Hop(record, target_at)
    return Accepted(record)
