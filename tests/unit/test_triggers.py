"""Triggers (core/triggers.py): the stored form, JSON paths, and what each record maps to;
a record built to be hostile never raises, it is a dead letter or skipped."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from confluent_kafka import OFFSET_BEGINNING
from confluent_kafka import TopicPartition as KafkaTopicPartition
from hypothesis import given
from hypothesis import strategies as st

from processor.core.envelope import Rejected
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Inbound
from processor.core.requests import SignalRequest, StartRequest
from processor.core.routing import TopicNames
from processor.core.stats import Stats
from processor.core.triggers import Filtered, map_record, parse_path, parse_trigger
from processor.engine.trigger_follow import TriggerFollower
from processor.io.postgres.trigger_store import TriggerSet

START = {
    "trigger_version": 1,
    "topic": "orders",
    "action": "start",
    "workflow": "checkout",
    "run_id": "$.order.id",
    "run_id_prefix": "order-",
    "input": "$.order",
    "filter": {"path": "$.type", "equals": "placed"},
}


def _record(value: Any, key: bytes | None = b"k", headers: Any = (), offset: int = 7) -> Inbound:
    raw = value if isinstance(value, bytes) or value is None else orjson.dumps(value)
    return Inbound(("orders", 2), offset, key, raw, list(headers), "trigger")


def test_a_start_trigger_maps_a_matching_record_to_a_start() -> None:
    trigger = parse_trigger("orders-in", START)
    record = _record({"type": "placed", "order": {"id": 1001, "cart": [1, 2]}})
    assert map_record(trigger, record, 65536) == StartRequest(
        "order-1001", "checkout", None, {"id": 1001, "cart": [1, 2]}, "t1"
    )


def test_a_record_the_filter_leaves_out_is_skipped() -> None:
    trigger = parse_trigger("orders-in", START)
    for value in ({"type": "shipped", "order": {"id": 1}}, {"order": {"id": 1}}):
        assert isinstance(map_record(trigger, _record(value), 65536), Filtered)


@pytest.mark.parametrize(
    ("value", "reason", "words"),
    [
        (None, DeadLetterReason.WRONG_SCHEMA, "tombstone"),
        (b"{nope", DeadLetterReason.NOT_JSON, "not JSON"),
        ({"type": "placed", "order": {}}, DeadLetterReason.WRONG_SCHEMA, "no run id at $.order.id"),
        ({"type": "placed", "order": {"id": True}}, DeadLetterReason.WRONG_SCHEMA, "no run id"),
        ({"type": "placed", "order": {"id": "x" * 300}}, DeadLetterReason.WRONG_SCHEMA, "longer"),
        ({"type": "placed", "order": {"id": "a\x00"}}, DeadLetterReason.OUT_OF_BOUNDS, "NUL"),
        (
            {"type": "placed", "order": {"id": 1, "n": "\x00"}},
            DeadLetterReason.OUT_OF_BOUNDS,
            "NUL",
        ),
        ({"type": "placed", "pad": "x" * 70000}, DeadLetterReason.OVERSIZE, "bytes"),
    ],
)
def test_a_record_that_cannot_be_mapped_is_rejected_with_why(
    value: Any, reason: DeadLetterReason, words: str
) -> None:
    found = map_record(parse_trigger("orders-in", START), _record(value), 65536)
    assert isinstance(found, Rejected)
    assert found.reason is reason and words in found.detail, found


def test_the_run_id_from_the_position_the_key_or_a_header() -> None:
    base = {"trigger_version": 1, "topic": "t", "action": "start", "workflow": "w"}
    by_position = parse_trigger("tr", base)
    assert map_record(by_position, _record({"a": 1}), 9999) == StartRequest(
        "tr:2:7", "w", None, {"a": 1}, "t1"
    )
    by_key = parse_trigger("tr", {**base, "run_id": "key"})
    assert map_record(by_key, _record({}, key=b"order-5"), 9999).run_id == "order-5"  # type: ignore[union-attr]
    assert isinstance(map_record(by_key, _record({}, key=None), 9999), Rejected)
    assert isinstance(map_record(by_key, _record({}, key=b"\xff"), 9999), Rejected)
    by_header = parse_trigger("tr", {**base, "run_id": "header:id"})
    headers = [("id", b"first"), ("id", b"last")]
    assert map_record(by_header, _record({}, headers=headers), 9999).run_id == "last"  # type: ignore[union-attr]
    assert isinstance(map_record(by_header, _record({}), 9999), Rejected)


def test_a_signal_trigger_signals_the_run_the_record_names_once_per_record() -> None:
    trigger = parse_trigger(
        "cancels",
        {
            "trigger_version": 1,
            "topic": "t",
            "action": "signal",
            "run_id": "$.run",
            "run_id_prefix": "order-",
        },
    )
    found = map_record(trigger, _record({"run": "1", "why": "customer"}, offset=40), 9999)
    assert found == SignalRequest(
        "order-1", "cancel", "cancels:2:40", {"run": "1", "why": "customer"}
    )


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("$", ()),
        ("$.a", ("a",)),
        ("$.a.b_c-d", ("a", "b_c-d")),
        ("$.items[0].sku", ("items", 0, "sku")),
        ('$["a b"]', ("a b",)),
    ],
)
def test_json_paths(text: str, steps: tuple[Any, ...]) -> None:
    assert parse_path(text).steps == steps


@pytest.mark.parametrize("text", ["a.b", "$a", "$.", "$[x]", "$.a[-1]", "$..a"])
def test_a_json_path_that_cannot_be_read_says_so(text: str) -> None:
    with pytest.raises(ValueError, match="JSON path"):
        parse_path(text)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"action": "stop"}, "action"),
        ({"workflow": None}, "workflow"),
        ({"tier": "t9"}, "tier"),
        ({"run_id": "value"}, "run id comes from"),
        ({"filter": {"path": "$.a"}}, "filter"),
        ({"colour": "red"}, "unknown trigger field"),
        ({"trigger_version": 2}, "trigger_version"),
        ({"workflow_version": 0}, "workflow_version"),
    ],
)
def test_a_trigger_that_cannot_work_is_refused_with_what_to_fix(
    change: dict[str, Any], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        parse_trigger("t", {**START, **change})


def test_a_signal_trigger_needs_a_run_id_from_the_record() -> None:
    raw = {
        "trigger_version": 1,
        "topic": "t",
        "action": "signal",
        "run_id": "position",
        "run_id_prefix": "order-",
    }
    with pytest.raises(ValueError, match="not its position"):
        parse_trigger("t", raw)


def test_the_stored_form_reads_back_as_the_same_trigger() -> None:
    trigger = parse_trigger("orders-in", START, ((0, 5), (1, 9)))
    again = parse_trigger(
        "orders-in", orjson.loads(orjson.dumps(trigger.to_json())), ((0, 5), (1, 9))
    )
    assert again == trigger
    assert trigger.start_offset(1) == 9 and trigger.start_offset(4) is None


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@given(
    value=st.one_of(st.binary(max_size=200), json_values.map(orjson.dumps), st.none()),
    key=st.none() | st.binary(max_size=20),
    headers=st.lists(st.tuples(st.text(max_size=5), st.binary(max_size=10)), max_size=3),
    run_id=st.sampled_from(["$.order.id", "$.a[0]", "key", "header:id", "position", "$"]),
)
def test_no_record_makes_mapping_raise(
    value: bytes | None, key: bytes | None, headers: list[tuple[str, bytes]], run_id: str
) -> None:
    trigger = parse_trigger("t", {**START, "run_id": run_id, "input": "$"})
    found = map_record(trigger, _record(value, key, headers), 1000)
    assert isinstance(found, (StartRequest, Filtered, Rejected))
    if isinstance(found, StartRequest):
        assert 1 <= len(found.run_id) <= 200 and "\x00" not in found.run_id


def test_the_follower_subscribes_again_only_when_the_topics_change_and_leaves_out_its_own() -> None:
    follower = TriggerFollower(TopicNames("ductor"), 65536, Stats())
    orders = parse_trigger("orders-in", START, ((0, 40),))
    assert follower.follow(TriggerSet({"orders": orders})) is True
    assert follower.follow(TriggerSet({"orders": orders})) is False
    own = parse_trigger("bad", {**START, "topic": "ductor.requests"})
    assert follower.follow(TriggerSet({"orders": orders, "ductor.requests": own})) is False
    assert set(follower.by_topic) == {"orders"}
    assert follower.is_source("orders") and not follower.is_source("ductor.wakeup.t1")
    # Where a partition the group never read starts: where the trigger was created.
    fresh = {("orders", 0), ("orders", 1)}
    assert follower.start_at(KafkaTopicPartition("orders", 0), fresh).offset == 40
    assert follower.start_at(KafkaTopicPartition("orders", 1), fresh).offset == OFFSET_BEGINNING
    kept = KafkaTopicPartition("orders", 0)
    assert follower.start_at(kept, set()) is kept  # the group's offset decides
    assert follower.start_at(kept, None) is kept  # not known: the group's reset decides
