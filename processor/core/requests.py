"""Requests from upstream producers: the JSON records on ``ductor.requests``
(schemas/request.schema.json) that start a run or signal one, written by any Kafka client.

A start names the run it creates (``run_id``): the same start twice is one run. A signal
names itself (``signal_id``): the same signal twice is applied once. Decoding never raises for
bad input from the wire: it returns a ``Rejected`` value with a dead-letter reason, as for
wakeups (core/envelope.py).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import orjson

from processor.core.bounds import json_problem, literal_problem, text_problem
from processor.core.envelope import MAX_RUN_ID_LENGTH, Rejected, decode_versioned_object
from processor.core.outcomes import DeadLetterReason
from processor.core.routing import TIERS
from processor.core.run_ids import reserved_problem
from processor.core.workflow_def import SIGNAL_NAME

REQUEST_VERSION = 1
MAX_NAME_LENGTH = 200  # workflow names and signal ids: text columns, bounded like run ids
MAX_WORKFLOW_VERSION = 2**31 - 1


class StartRequest(NamedTuple):
    """Start run ``run_id`` of ``workflow`` (its latest version unless ``workflow_version``)."""

    run_id: str
    workflow: str
    workflow_version: int | None = None
    input: Any = None  # JSON; {} when absent
    tier: str = "t1"

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "request_version": REQUEST_VERSION,
            "kind": "start",
            "run_id": self.run_id,
            "workflow": self.workflow,
            "tier": self.tier,
        }
        if self.workflow_version is not None:
            body["workflow_version"] = self.workflow_version
        if self.input is not None:
            body["input"] = self.input
        return orjson.dumps(body)


class SignalRequest(NamedTuple):
    """Signal ``name`` (with ``payload``) to run ``run_id``, once per ``signal_id``."""

    run_id: str
    name: str
    signal_id: str
    payload: Any = None  # JSON; {} when absent

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "request_version": REQUEST_VERSION,
            "kind": "signal",
            "run_id": self.run_id,
            "name": self.name,
            "signal_id": self.signal_id,
        }
        if self.payload is not None:
            body["payload"] = self.payload
        return orjson.dumps(body)


Request = StartRequest | SignalRequest

# The fields each kind accepts (what decoding checks against; the JSON schema says the same).
START_FIELDS = frozenset(
    {"request_version", "kind", "run_id", "workflow", "workflow_version", "input", "tier"}
)
SIGNAL_FIELDS = frozenset({"request_version", "kind", "run_id", "name", "signal_id", "payload"})


def request_key(request: Request) -> bytes:
    """The Kafka key a request is written with: its run id, so that the requests of one run
    keep their order on one partition, as its wakeups do."""
    return request.run_id.encode()


def decode_request(value: bytes | None, max_bytes: int) -> Request | Rejected:
    """A start or signal request, or why it is refused (its dead-letter reason and detail)."""
    raw = decode_versioned_object(value, max_bytes, "request_version", REQUEST_VERSION)
    if isinstance(raw, Rejected):
        return raw
    kind = raw.get("kind")
    if kind == "start":
        return _start(raw, value)
    if kind == "signal":
        return _signal(raw, value)
    return Rejected(DeadLetterReason.WRONG_SCHEMA, "kind must be start or signal")


def _start(raw: dict[str, Any], value: bytes | None) -> StartRequest | Rejected:
    problem = (
        _unknown_fields(raw, START_FIELDS)
        or _text(raw, "run_id", MAX_RUN_ID_LENGTH)
        or _text(raw, "workflow", MAX_NAME_LENGTH)
    )
    if problem:
        return problem
    version = _workflow_version(raw)
    if isinstance(version, Rejected):
        return version
    tier = raw.get("tier", "t1")
    if tier not in TIERS:
        return _wrong(f"tier must be one of {', '.join(TIERS)}")
    problem = _json_field(raw, "input", value)
    if problem:
        return problem
    reserved = reserved_problem(raw["run_id"])
    if reserved is not None:
        return Rejected(DeadLetterReason.RESERVED_RUN_ID, reserved)
    return StartRequest(raw["run_id"], raw["workflow"], version, raw.get("input"), tier)


def _signal(raw: dict[str, Any], value: bytes | None) -> SignalRequest | Rejected:
    problem = (
        _unknown_fields(raw, SIGNAL_FIELDS)
        or _text(raw, "run_id", MAX_RUN_ID_LENGTH)
        or _text(raw, "signal_id", MAX_NAME_LENGTH)
    )
    if problem:
        return problem
    name = raw.get("name")
    if not isinstance(name, str) or not SIGNAL_NAME.fullmatch(name):
        return _wrong(
            "name must be 'cancel' or the signal a wait step waits for: 1 to 100 letters,"
            " digits, '_', '.', ':' or '-', starting with a letter or digit"
        )
    problem = _json_field(raw, "payload", value)
    if problem:
        return problem
    return SignalRequest(raw["run_id"], name, raw["signal_id"], raw.get("payload"))


def _json_field(raw: dict[str, Any], name: str, value: bytes | None) -> Rejected | None:
    """The field's JSON value beyond the bounds of a stored value (core/bounds.py), as read
    and as written (an integer literal too long for 64 bits, which orjson read as a float)."""
    found = raw.get(name)
    problem = json_problem(found)
    if problem is None and value is not None and found is not None:
        problem = literal_problem(value, lambda document: document[name])
    if problem is None:
        return None
    return Rejected(DeadLetterReason.OUT_OF_BOUNDS, problem.describe(name))


def _workflow_version(raw: dict[str, Any]) -> int | Rejected | None:
    """The version asked for: None (the latest) when absent. An explicit null is refused and
    2.0 is 2, as the schema says."""
    if "workflow_version" not in raw:
        return None
    version = raw["workflow_version"]
    if type(version) is float and version.is_integer():
        version = int(version)
    if type(version) is not int or not 1 <= version <= MAX_WORKFLOW_VERSION:
        return _wrong(f"workflow_version must be an integer from 1 to {MAX_WORKFLOW_VERSION}")
    return version


def _wrong(detail: str) -> Rejected:
    return Rejected(DeadLetterReason.WRONG_SCHEMA, detail)


def _unknown_fields(raw: dict[str, Any], allowed: frozenset[str]) -> Rejected | None:
    if allowed.issuperset(raw):
        return None
    return _wrong(f"unknown field(s) for a {raw['kind']}: {', '.join(sorted(set(raw) - allowed))}")


def _text(raw: dict[str, Any], name: str, most: int) -> Rejected | None:
    value = raw.get(name)
    if type(value) is not str or not 1 <= len(value) <= most:
        return _wrong(f"{name} must be a string of 1 to {most} characters")
    problem = text_problem(value, most)
    if problem is not None:
        return Rejected(DeadLetterReason.OUT_OF_BOUNDS, f"{name} {problem}")
    return None
