"""The wakeup envelope: the JSON record on the wakeup and delay topics (schemas/wakeup.schema.json).

Decoding never raises for bad input from the wire: it returns a ``Rejected`` value with a
dead-letter reason, because a malformed record is an expected outcome the consumer handles
(dead-letter it and go on), not a failure of the processor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from processor.core.outcomes import DeadLetterReason

ENVELOPE_VERSION = 1
MAX_RUN_ID_LENGTH = 200
# Every number is bounded where it is decoded, so that nothing downstream (a bigint column, an
# encoder, the delay ladder) meets a value it cannot hold.
MAX_REQUEUE_COUNT = 1_000_000
MAX_ATTEMPT = 2**31 - 1
MAX_SEQ = 2**63 - 1
MAX_EPOCH_MS = 253_402_300_799_999  # the end of the year 9999
REASONS = frozenset({"start", "step_result", "signal", "timer", "requeue", "sweep", "replay"})


class Wakeup(NamedTuple):
    """A decoded envelope. A NamedTuple: one is made for every record consumed, and a frozen
    dataclass's __init__ sets its eight fields one object.__setattr__ at a time."""

    run_id: str
    reason: str
    requeue_count: int = 0  # non-progressing requeues so far; rides here, never on the row
    requeue_seq: int = 0  # which requeue this is (key run_id:requeue_seq; JSON "attempt")
    due_at: int | None = None  # epoch ms before which the record must not be processed
    target_at: int | None = None  # a timer's real due time when it hops over several rungs
    observed_seq: int | None = None  # the run's seq when requeued: a later seq means progress
    produced_at: int | None = None  # epoch ms, for end-to-end latency

    def key(self) -> bytes:
        return f"{self.run_id}:{self.requeue_seq}".encode()

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "envelope_version": ENVELOPE_VERSION,
            "run_id": self.run_id,
            "reason": self.reason,
            "requeue_count": self.requeue_count,
            "attempt": self.requeue_seq,
        }
        for name in OPTIONAL_FIELDS:
            value = getattr(self, name)
            if value is not None:
                body[name] = value
        return orjson.dumps(body)


# The envelope's fields, owned by the class above: what decoding accepts, and the ones
# written only when set (those that default to None). A field's JSON name is its own but
# where the wire kept an older one.
WIRE_NAMES = {"requeue_seq": "attempt"}
FIELDS = frozenset({"envelope_version", *(WIRE_NAMES.get(name, name) for name in Wakeup._fields)})
OPTIONAL_FIELDS = tuple(
    name
    for name in Wakeup._fields
    if name in Wakeup._field_defaults and Wakeup._field_defaults[name] is None
)


@dataclass(frozen=True)
class Rejected:
    """Why a record cannot be processed; ``reason`` is the dead-letter reason code."""

    reason: DeadLetterReason
    detail: str


def decode_versioned_object(
    value: bytes | None, max_bytes: int, version_field: str, version: int
) -> dict[str, Any] | Rejected:
    """A record's value as a JSON object whose ``version_field`` is ``version``, or why it is
    not one: what every record format of ours checks first (wakeups, requests)."""
    if value is None:
        return Rejected(DeadLetterReason.WRONG_SCHEMA, "record has no value (tombstone)")
    if len(value) > max_bytes:
        return Rejected(
            DeadLetterReason.OVERSIZE,
            f"record of {len(value)} bytes exceeds the limit of {max_bytes}",
        )
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return Rejected(DeadLetterReason.NOT_JSON, f"value is not JSON: {exc}")
    if not isinstance(raw, dict):
        return Rejected(
            DeadLetterReason.WRONG_SCHEMA, f"expected a JSON object, got {type(raw).__name__}"
        )
    found = raw.get(version_field)
    is_number = isinstance(found, int | float) and not isinstance(found, bool)
    if not is_number or found != version:  # 1.0 is 1, as in the JSON schemas
        if is_number:
            return Rejected(
                DeadLetterReason.UNKNOWN_ENVELOPE_VERSION,
                f"{version_field} {found} is not supported",
            )
        return Rejected(
            DeadLetterReason.WRONG_SCHEMA, f"{version_field} must be the integer {version}"
        )
    return raw


def decode_wakeup(value: bytes | None, max_bytes: int) -> Wakeup | Rejected:
    raw = decode_versioned_object(value, max_bytes, "envelope_version", ENVELOPE_VERSION)
    if isinstance(raw, Rejected):
        return raw
    if not plainly_valid(raw):
        # The slow path names the first problem: a schema problem before a bound.
        problem = _schema_problem(raw)
        if problem is not None:
            return Rejected(DeadLetterReason.WRONG_SCHEMA, problem)
        problem = _bounds_problem(raw)
        if problem is not None:
            return Rejected(DeadLetterReason.OUT_OF_BOUNDS, problem)
    get = raw.get
    # tuple.__new__ in field order: Wakeup(**fields) runs the NamedTuple's __new__ in Python.
    return _NEW_TUPLE(
        Wakeup,
        (
            raw["run_id"],
            raw["reason"],
            get("requeue_count", 0),
            get("attempt", 0),
            get("due_at"),
            get("target_at"),
            get("observed_seq"),
            get("produced_at"),
        ),
    )


_NEW_TUPLE = tuple.__new__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _schema_problem(raw: dict[str, Any]) -> str | None:
    if not FIELDS.issuperset(raw):
        return f"unknown field(s): {', '.join(sorted(set(raw) - FIELDS))}"
    run_id = raw.get("run_id")
    if not isinstance(run_id, str) or not 1 <= len(run_id) <= MAX_RUN_ID_LENGTH:
        return f"run_id must be a string of 1 to {MAX_RUN_ID_LENGTH} characters"
    reason = raw.get("reason")
    if not isinstance(reason, str) or reason not in REASONS:
        return f"reason must be one of {', '.join(sorted(REASONS))}"
    for name in ("requeue_count", "attempt"):
        if name in raw and not (_is_int(raw[name]) and raw[name] >= 0):
            return f"{name} must be a non-negative integer"
    for name in OPTIONAL_FIELDS:
        value = raw.get(name)
        if value is not None and not (_is_int(value) and value >= 0):
            return f"{name} must be a non-negative integer or absent"
    return None


_BOUNDS = {
    "requeue_count": MAX_REQUEUE_COUNT,
    "attempt": MAX_ATTEMPT,
    "observed_seq": MAX_SEQ,
    "due_at": MAX_EPOCH_MS,
    "target_at": MAX_EPOCH_MS,
    "produced_at": MAX_EPOCH_MS,
}


# Each integer field with its bound and its value when absent (0: the field is optional but
# never null; None: null or absent).
_INTEGERS = tuple(
    (name, bound, 0 if name in ("requeue_count", "attempt") else None)
    for name, bound in _BOUNDS.items()
)


def plainly_valid(raw: dict[str, Any]) -> bool:
    """The schema and bounds checks in one pass, for the record that passes them all (every
    record but a hostile one); False sends it to the checks that say what is wrong. Exact
    ``int`` types only: orjson decodes integers as ``int``, and a bool is not one."""
    if not FIELDS.issuperset(raw):
        return False
    run_id, reason = raw.get("run_id"), raw.get("reason")
    if type(run_id) is not str or not 1 <= len(run_id) <= MAX_RUN_ID_LENGTH or "\x00" in run_id:
        return False
    if type(reason) is not str or reason not in REASONS:
        return False
    for name, bound, absent in _INTEGERS:
        value = raw.get(name, absent)
        if value is None:
            if absent is not None:
                return False  # null where only a number may stand
        elif type(value) is not int or not 0 <= value <= bound:
            return False
    return True


def _bounds_problem(raw: dict[str, Any]) -> str | None:
    """Well-typed values the processor could not store or honour (checked after the schema)."""
    if "\x00" in raw["run_id"]:
        return "run_id contains a NUL character, which Postgres cannot store"
    for name, bound in _BOUNDS.items():
        value = raw.get(name)
        if value is not None and value > bound:
            return f"{name} {value} is beyond its bound {bound}"
    return None
