"""The wakeup envelope (processor/envelope.py): round trip, keys, and every reject reason."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.effects import wakeup_send
from processor.core.envelope import (
    ENVELOPE_VERSION,
    MAX_ATTEMPT,
    MAX_EPOCH_MS,
    MAX_REQUEUE_COUNT,
    MAX_SEQ,
    REASONS,
    Rejected,
    Wakeup,
    _bounds_problem,
    _schema_problem,
    decode_wakeup,
    plainly_valid,
)

from .strategies import FAST

LIMIT = 65_536


def _encode(body: Any) -> bytes:
    return orjson.dumps(body)


def _valid(**extra: Any) -> dict[str, Any]:
    return {"envelope_version": 1, "run_id": "run-1", "reason": "timer", **extra}


def test_round_trip_with_every_field() -> None:
    w = Wakeup(
        run_id="run-7",
        reason="requeue",
        requeue_count=3,
        requeue_seq=9,
        due_at=1_700_000_000_100,
        target_at=1_700_000_005_000,
        observed_seq=12,
        produced_at=1_700_000_000_000,
    )
    assert decode_wakeup(w.encode(), LIMIT) == w
    assert w.key() == b"run-7:9"


def test_minimal_envelope_gets_defaults_and_encodes_only_set_fields() -> None:
    decoded = decode_wakeup(_encode(_valid()), LIMIT)
    assert decoded == Wakeup(run_id="run-1", reason="timer")
    assert orjson.loads(Wakeup("r", "start").encode()) == {
        "envelope_version": ENVELOPE_VERSION,
        "run_id": "r",
        "reason": "start",
        "requeue_count": 0,
        "attempt": 0,
    }
    explicit_nulls = _valid(due_at=None, target_at=None, observed_seq=None, produced_at=None)
    assert decode_wakeup(_encode(explicit_nulls), LIMIT) == Wakeup("run-1", "timer")


@FAST
@given(
    st.builds(
        Wakeup,
        run_id=st.text(
            st.characters(codec="utf-8", exclude_characters="\x00"),
            min_size=1,
            max_size=200,
        ),
        reason=st.sampled_from(sorted(REASONS)),
        requeue_count=st.integers(0, MAX_REQUEUE_COUNT),
        requeue_seq=st.integers(0, MAX_ATTEMPT),
        due_at=st.one_of(st.none(), st.integers(0, MAX_EPOCH_MS)),
        target_at=st.one_of(st.none(), st.integers(0, MAX_EPOCH_MS)),
        observed_seq=st.one_of(st.none(), st.integers(0, MAX_SEQ)),
        produced_at=st.one_of(st.none(), st.integers(0, MAX_EPOCH_MS)),
    )
)
def test_round_trip(wakeup: Wakeup) -> None:
    assert decode_wakeup(wakeup.encode(), LIMIT) == wakeup
    assert wakeup.key() == f"{wakeup.run_id}:{wakeup.requeue_seq}".encode()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        (b"", "not_json"),
        (b"{", "not_json"),
        (b"\xff\xfe", "not_json"),
        (b"run-1", "not_json"),
        (b"{'single': 'quotes'}", "not_json"),
        (None, "wrong_schema"),
        (b"[]", "wrong_schema"),
        (b'"run-1"', "wrong_schema"),
        (b"1", "wrong_schema"),
        (b"null", "wrong_schema"),
        (_encode({"run_id": "r", "reason": "start"}), "wrong_schema"),
        (_encode(_valid(envelope_version="1")), "wrong_schema"),
        (_encode(_valid(envelope_version=None)), "wrong_schema"),
        (_encode(_valid(envelope_version=False)), "wrong_schema"),
        (_encode(_valid(envelope_version=2)), "unknown_envelope_version"),
        (_encode(_valid(envelope_version=0)), "unknown_envelope_version"),
        (_encode(_valid(envelope_version=-1)), "unknown_envelope_version"),
        (_encode(_valid(extra=1)), "wrong_schema"),
        (_encode(_valid(run_id="")), "wrong_schema"),
        (_encode(_valid(run_id="x" * 201)), "wrong_schema"),
        (_encode(_valid(run_id=5)), "wrong_schema"),
        (_encode(_valid(reason="nap")), "wrong_schema"),
        (_encode(_valid(reason=None)), "wrong_schema"),
        (_encode(_valid(requeue_count=-1)), "wrong_schema"),
        (_encode(_valid(requeue_count=True)), "wrong_schema"),
        (_encode(_valid(attempt=1.5)), "wrong_schema"),
        (_encode(_valid(attempt=None)), "wrong_schema"),
        (_encode(_valid(due_at=-5)), "wrong_schema"),
        (_encode(_valid(target_at="soon")), "wrong_schema"),
        (_encode(_valid(observed_seq=False)), "wrong_schema"),
        (_encode(_valid(produced_at=1.0)), "wrong_schema"),
    ],
)
def test_reject_reasons(value: bytes | None, reason: str) -> None:
    decoded = decode_wakeup(value, LIMIT)
    assert isinstance(decoded, Rejected), decoded
    assert decoded.reason == reason
    assert decoded.detail


def test_oversize_is_checked_before_parsing() -> None:
    body = _encode(_valid(run_id="r" * 150))
    assert isinstance(decode_wakeup(body, len(body)), Wakeup)
    rejected = decode_wakeup(body, len(body) - 1)
    assert isinstance(rejected, Rejected)
    assert rejected.reason == "oversize"
    assert str(len(body)) in rejected.detail
    # Even garbage is reported as oversize first: the limit protects the parser.
    garbage = decode_wakeup(b"\x00" * 300, 256)
    assert isinstance(garbage, Rejected) and garbage.reason == "oversize"


def test_run_id_length_limit_is_in_characters() -> None:
    assert isinstance(decode_wakeup(_encode(_valid(run_id="é" * 200)), LIMIT), Wakeup)


@FAST
@given(st.binary(max_size=300), st.integers(0, 400))
def test_decode_never_raises_on_arbitrary_bytes(value: bytes, limit: int) -> None:
    assert isinstance(decode_wakeup(value, limit), Wakeup | Rejected)


@FAST
@given(st.binary(max_size=60))
def test_decode_never_raises_on_bytes_that_look_like_an_envelope(tail: bytes) -> None:
    value = b'{"envelope_version":1,"run_id":"r","reason":' + tail
    assert isinstance(decode_wakeup(value, LIMIT), Wakeup | Rejected)


json_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=False, allow_infinity=False),
        st.text(max_size=8),
    ),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


# Fails today: see the BUG note on test_a_reason_that_is_not_a_string_is_rejected.
@FAST
@given(
    st.dictionaries(
        st.sampled_from(["envelope_version", "run_id", "reason", "attempt", "due_at", "x"]),
        json_values,
    ),
    st.booleans(),
)
def test_decode_never_raises_on_arbitrary_json_objects(body: dict[str, Any], fill: bool) -> None:
    if fill:
        body = {**_valid(), **{k: v for k, v in body.items() if k != "envelope_version"}}
    assert isinstance(decode_wakeup(_encode(body), LIMIT), Wakeup | Rejected)


# Fixed (envelope.py _schema_problem): ``raw.get("reason") not in REASONS`` tests
# membership in a frozenset, which raises TypeError for an unhashable value. A record such as
# {"envelope_version": 1, "run_id": "r", "reason": []} (or "reason": {}) therefore makes
# decode_wakeup raise instead of returning Rejected("wrong_schema", ...), contradicting the
# module's "decoding never raises for bad input from the wire": one malformed record on a wakeup
# topic becomes an exception in the consumer instead of a dead-letter.
@pytest.mark.parametrize("reason", [[], {}, ["start"], {"start": 1}])
def test_a_reason_that_is_not_a_string_is_rejected(reason: Any) -> None:
    decoded = decode_wakeup(_encode(_valid(reason=reason)), LIMIT)
    assert isinstance(decoded, Rejected)
    assert decoded.reason == "wrong_schema"


_FIELD_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([MAX_ATTEMPT, MAX_ATTEMPT + 1, MAX_REQUEUE_COUNT + 1, MAX_SEQ + 1]),
    st.sampled_from([MAX_EPOCH_MS, MAX_EPOCH_MS + 1, 2**64]),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(sorted(REASONS)),
    st.text(max_size=3),
    st.sampled_from(["", "a\x00b", "r" * 200, "r" * 201]),
    st.lists(st.integers(), max_size=2),
)


@given(
    st.dictionaries(
        st.sampled_from(
            [
                "run_id",
                "reason",
                "requeue_count",
                "attempt",
                "due_at",
                "target_at",
                "observed_seq",
                "produced_at",
                "extra",
            ]
        ),
        _FIELD_VALUES,
    )
)
def test_the_one_pass_check_agrees_with_the_checks_that_name_the_problem(
    fields: dict[str, Any],
) -> None:
    """The fast path passes exactly the records the schema and bounds checks pass."""
    raw = _valid(**fields)
    slow_ok = _schema_problem(raw) is None and _bounds_problem(raw) is None
    assert plainly_valid(raw) == slow_ok, raw


def test_a_requeue_s_send_names_its_sequence_and_keeps_the_deprecated_attempt() -> None:
    """docs/telemetry.md: on a requeue, ``ductor.requeue_seq``; ``ductor.attempt`` still
    carries it (deprecated there: it will mean only the step attempt)."""
    send = wakeup_send("ductor.delay.100", Wakeup("r", "conflict", 2, 3))
    attributes = dict(send.attributes)
    assert attributes["ductor.requeue_seq"] == 3 and attributes["ductor.attempt"] == 3
    assert attributes["ductor.requeue_count"] == 2
    assert attributes["messaging.kafka.message.key"] == "r:3"
