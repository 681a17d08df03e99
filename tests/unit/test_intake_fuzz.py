"""Hostile records through the real decode and validation path (core/intake.py ``admit`` and
the dead letter built from its verdict): whatever the bytes, the JSON or the headers, nothing
raises, every rejection names a reason and says why, and what is accepted is within bounds."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from processor.core.dead_letters import REASON
from processor.core.decide import hop, reject
from processor.core.envelope import (
    FIELDS,
    MAX_ATTEMPT,
    MAX_EPOCH_MS,
    MAX_REQUEUE_COUNT,
    MAX_SEQ,
    REASONS,
)
from processor.core.intake import Accepted, Hop, NotDue, Reject, admit
from processor.core.outcomes import DeadLetterReason
from processor.core.plans import Rules

from .fakes import MAX_BYTES, NAMES, NOW_MS, FakeMessage
from .strategies import FAST

TOPICS = [*NAMES.coordinator_topics()]
RULES = Rules(NAMES, livelock_requeues=8)
_numbers = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([0, NOW_MS, NOW_MS + 5_000, NOW_MS + 10**9, 2**63, 2**64 - 1]),
    st.floats(allow_nan=True, allow_infinity=True),
)
_scalars = st.one_of(st.none(), st.booleans(), _numbers, st.text(max_size=30))


def _containers(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)


_json = st.recursive(_scalars, _containers, max_leaves=8)


@st.composite
def envelopes(draw: st.DrawFn) -> bytes:
    """Mostly almost-valid envelopes: the shape a careless or hostile producer sends."""
    body: dict[str, Any] = {"envelope_version": draw(st.sampled_from([1, 1.0, 2, "1", None]))}
    body["run_id"] = draw(st.one_of(st.text(max_size=210), _scalars))
    body["reason"] = draw(st.one_of(st.sampled_from(sorted(REASONS)), st.text(max_size=8)))
    for name in draw(st.sets(st.sampled_from(sorted(FIELDS | {"extra"})), max_size=6)):
        body[name] = draw(st.one_of(_numbers, _json))
    try:
        return orjson.dumps(body, option=orjson.OPT_NON_STR_KEYS)
    except (orjson.JSONEncodeError, TypeError):  # floats orjson refuses, huge integers
        return repr(body).encode()


_values = st.one_of(st.none(), st.binary(max_size=200), envelopes())
_headers = st.lists(
    st.tuples(st.text(max_size=20), st.one_of(st.none(), st.binary(max_size=20), st.text())),
    max_size=4,
)


@FAST
@given(st.sampled_from(TOPICS), _values, _headers, st.binary(max_size=10) | st.none())
def test_no_record_escapes_a_verdict(
    topic: str, value: bytes | None, headers: list[tuple[str, Any]], key: bytes | None
) -> None:
    message = FakeMessage(topic, 7, value, key_=key, headers_=headers)
    verdict = admit(message, NAMES, MAX_BYTES, NOW_MS)
    if isinstance(verdict, Reject):
        assert isinstance(verdict.reason, DeadLetterReason) and verdict.detail
        (send,) = reject(verdict.record, verdict.reason, verdict.detail, RULES).sends
        assert [v for k, v in send.headers if k == REASON] == [verdict.reason.value.encode()]
        assert send.value == value  # the original bytes, untouched
        return
    wakeup = verdict.record.wakeup
    assert wakeup is not None
    assert "\x00" not in wakeup.run_id and 1 <= len(wakeup.run_id) <= 200
    assert 0 <= wakeup.requeue_count <= MAX_REQUEUE_COUNT and 0 <= wakeup.requeue_seq <= MAX_ATTEMPT
    assert wakeup.observed_seq is None or 0 <= wakeup.observed_seq <= MAX_SEQ
    for at in (wakeup.due_at, wakeup.target_at, wakeup.produced_at):
        assert at is None or 0 <= at <= MAX_EPOCH_MS
    if isinstance(verdict, NotDue):
        assert 0 < verdict.wait_ms <= NAMES.rung_of(topic) + 60_000
    if isinstance(verdict, Hop):  # its onward record encodes and stays on the ladder
        (send,) = hop(verdict.record, verdict.target_ms, NOW_MS, NAMES).sends
        assert send.topic in NAMES.delay_topics()
    if isinstance(verdict, Accepted):
        assert wakeup.encode()  # a requeue or a hop of it can always be encoded
