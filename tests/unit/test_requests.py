"""Requests from upstream producers (processor/core/requests.py): round trips, every reason a
record is refused, and the decoder agreeing with schemas/request.schema.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from processor.core.envelope import Rejected
from processor.core.outcomes import DeadLetterReason
from processor.core.requests import (
    SIGNAL_FIELDS,
    START_FIELDS,
    SignalRequest,
    StartRequest,
    decode_request,
    request_key,
)

from .strategies import FAST, QUICK

LIMIT = 65_536
SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "request.schema.json").read_text()
)
Draft202012Validator.check_schema(SCHEMA)
VALIDATOR = Draft202012Validator(SCHEMA)


def _decode(body: Any) -> StartRequest | SignalRequest | Rejected:
    return decode_request(orjson.dumps(body), LIMIT)


def _start(**extra: Any) -> dict[str, Any]:
    return {"request_version": 1, "kind": "start", "run_id": "r-1", "workflow": "w", **extra}


def _signal(**extra: Any) -> dict[str, Any]:
    body = {"request_version": 1, "kind": "signal", "run_id": "r-1", "name": "cancel"}
    return {**body, "signal_id": "s-1", **extra}


def test_a_start_with_every_field_round_trips() -> None:
    start = StartRequest("r-1", "checkout", 3, {"order": [1, 2]}, "t0")
    assert decode_request(start.encode(), LIMIT) == start
    assert VALIDATOR.is_valid(orjson.loads(start.encode()))
    assert request_key(start) == b"r-1"


def test_a_minimal_start_takes_the_defaults() -> None:
    assert _decode(_start()) == StartRequest("r-1", "w", None, None, "t1")


def test_an_integral_float_version_is_that_version_as_in_the_schema() -> None:
    assert _decode(_start(workflow_version=2.0)) == StartRequest("r-1", "w", 2, None, "t1")


def test_a_signal_round_trips() -> None:
    signal = SignalRequest("r-1", "cancel", "s-1", {"why": "customer asked"})
    assert decode_request(signal.encode(), LIMIT) == signal
    assert VALIDATOR.is_valid(orjson.loads(signal.encode()))
    assert _decode(_signal()) == SignalRequest("r-1", "cancel", "s-1", None)


_OOB = DeadLetterReason.OUT_OF_BOUNDS


@pytest.mark.parametrize(
    ("value", "reason", "detail"),
    [
        (None, DeadLetterReason.WRONG_SCHEMA, "tombstone"),
        (b"x" * (LIMIT + 1), DeadLetterReason.OVERSIZE, "exceeds"),
        (b"{not json", DeadLetterReason.NOT_JSON, "not JSON"),
        (b"[1]", DeadLetterReason.WRONG_SCHEMA, "JSON object"),
        (orjson.dumps(_start(request_version=2)), DeadLetterReason.UNKNOWN_ENVELOPE_VERSION, "2"),
        (orjson.dumps(_start(request_version=True)), DeadLetterReason.WRONG_SCHEMA, "integer"),
        (orjson.dumps(_start(kind="stop")), DeadLetterReason.WRONG_SCHEMA, "kind"),
        (orjson.dumps(_start(owner="me")), DeadLetterReason.WRONG_SCHEMA, "owner"),
        (orjson.dumps(_start(run_id="")), DeadLetterReason.WRONG_SCHEMA, "run_id"),
        (orjson.dumps(_start(run_id="x" * 201)), DeadLetterReason.WRONG_SCHEMA, "run_id"),
        (orjson.dumps(_start(run_id="a\x00b")), DeadLetterReason.OUT_OF_BOUNDS, "NUL"),
        (orjson.dumps(_start(workflow=7)), DeadLetterReason.WRONG_SCHEMA, "workflow"),
        (orjson.dumps(_start(workflow_version=0)), DeadLetterReason.WRONG_SCHEMA, "version"),
        (orjson.dumps(_start(workflow_version=2**31)), DeadLetterReason.WRONG_SCHEMA, "version"),
        (orjson.dumps(_start(workflow_version=None)), DeadLetterReason.WRONG_SCHEMA, "version"),
        (orjson.dumps(_start(tier="t9")), DeadLetterReason.WRONG_SCHEMA, "tier"),
        (orjson.dumps(_start(input={"k\x00": 1})), DeadLetterReason.OUT_OF_BOUNDS, "NUL"),
        (orjson.dumps(_signal(name="no pause")), DeadLetterReason.WRONG_SCHEMA, "name"),
        (orjson.dumps(_signal(name=7)), DeadLetterReason.WRONG_SCHEMA, "name"),
        (orjson.dumps(_signal(signal_id=None)), DeadLetterReason.WRONG_SCHEMA, "signal_id"),
        (orjson.dumps(_signal(workflow="w")), DeadLetterReason.WRONG_SCHEMA, "workflow"),
        (orjson.dumps(_signal(payload=["\x00"])), DeadLetterReason.OUT_OF_BOUNDS, "NUL"),
        (orjson.dumps(_start())[:-1] + b',"input":' + b"[" * 70 + b"]" * 70 + b"}", _OOB, "$[0]"),
        (orjson.dumps(_start(run_id="o/s#1")), DeadLetterReason.RESERVED_RUN_ID, "child run"),
    ],
)
def test_every_bad_request_is_refused_saying_why(
    value: bytes | None, reason: DeadLetterReason, detail: str
) -> None:
    refused = decode_request(value, LIMIT)
    assert isinstance(refused, Rejected)
    assert refused.reason is reason and detail in refused.detail


@FAST
@given(st.binary(max_size=200))
def test_any_bytes_decode_to_a_request_or_a_reason(value: bytes) -> None:
    assert isinstance(decode_request(value, LIMIT), StartRequest | SignalRequest | Rejected)


_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(0, 2**32),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=3),
    st.sampled_from(["start", "signal", "cancel", "t0", "t2", "w", "\x00"]),
    st.sampled_from(["o-1/ship#1", "o-1/ship#0", "nightly@2026-12-04T02:00:00Z", "a@b.c"]),
    st.lists(st.text(max_size=2), max_size=2),
    st.dictionaries(st.text(max_size=2), st.text(max_size=2), max_size=2),
)
_fields = st.sampled_from(sorted(START_FIELDS | SIGNAL_FIELDS | {"extra"}))


@st.composite
def request_like(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = dict(draw(st.sampled_from([_start(), _signal()])))
    for _ in range(draw(st.integers(0, 3))):
        body[draw(_fields)] = draw(_values)
    for _ in range(draw(st.integers(0, 1))):
        del body[draw(st.sampled_from(sorted(body)))]
    return body


def _nul_free(value: Any) -> bool:
    return "\x00" not in orjson.dumps(value).decode("unicode_escape", "replace")


@QUICK
@given(request_like())
def test_the_decoder_accepts_exactly_what_the_schema_does(body: dict[str, Any]) -> None:
    decoded = _decode(body)
    if isinstance(decoded, Rejected):
        # The schema cannot say "no NUL inside any string of the input": that bound is ours.
        assert not VALIDATOR.is_valid(body) or not _nul_free(body), body
    else:
        assert VALIDATOR.is_valid(body), f"decoder accepted a schema-invalid request: {body}"
