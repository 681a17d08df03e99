"""The bounds of stored JSON (core/bounds.py) and the run ids no start may take
(core/run_ids.py): what each refuses and where it says the problem is, that the bounds
function never raises and agrees with what orjson can write, and that the wire doors (a
request, a trigger's record) decode hostile bytes without raising, never letting a value past
that a later write would refuse."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from processor.core.bounds import (
    MAX_DEPTH,
    MAX_INTEGER,
    MIN_INTEGER,
    BoundsProblem,
    encoded_problem,
    json_problem,
    literal_problem,
    render_path,
    text_problem,
)
from processor.core.children import child_run_id
from processor.core.envelope import Rejected
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Inbound
from processor.core.requests import SignalRequest, StartRequest, decode_request
from processor.core.run_ids import reserved_problem, reserved_shape
from processor.core.schedules import fire_run_id, manual_run_id
from processor.core.triggers import Filtered, RunIdFrom, Trigger, map_record, parse_path

from .strategies import (
    FAST,
    hostile_json_bytes,
    hostile_request,
    hostile_values,
    json_values,
    nest,
)


def depth_of(value: Any) -> int:
    """How many containers deep ``value`` is (iterative: values here nest past Python's
    recursion limit)."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, above = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, above + 1)
            stack += [(v, above + 1) for v in (item.values() if isinstance(item, dict) else item)]
    return deepest


def strings_of(value: Any) -> list[str]:
    found, stack = [], [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found.append(item)
        elif isinstance(item, dict):
            found += list(item)
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    return found


@pytest.mark.parametrize(
    ("value", "path", "says"),
    [
        (
            nest(1, MAX_DEPTH + 1, "list"),
            "$[0][0][0][0][0][0][0][0]…[0][0][0][0]",
            "deeper than 64",
        ),
        (nest(1, 300, "dict"), "$.k.k.k.k.k.k.k.k….k.k.k.k", "deeper than 64"),
        ({"a": [1, {"b": "x\x00y"}]}, "$.a[1].b", "NUL"),
        ({"a": {"b\x00": 1}}, "$.a", 'key ("b\\u0000")'),
        ({"s": ["ok", "\ud800"]}, "$.s[1]", "lone surrogate"),
        ({"\udc00": 1}, "$", "lone surrogate"),
        ({"n": 2**64}, "$.n", "integer 18446744073709551616"),
        ([-(2**63) - 1], "$[0]", "integer -9223372036854775809"),
        ({"n": 10**400}, "$.n", "integer of 1329 bits"),
        ({"a b": {1: "x"}}, '$["a b"]', "key that is not a string (int)"),
        ({"tags": {"x", "y"}}, "$.tags", "a set, which is not JSON"),
        ("x" * (1024 * 1024), "$", "1,048,578 bytes as JSON, more than the 1,048,576"),
    ],
)
def test_each_bound_is_refused_with_its_path(value: Any, path: str, says: str) -> None:
    problem = json_problem(value)
    assert problem is not None and problem.path == path, problem
    assert says in problem.problem


@pytest.mark.parametrize(
    "value",
    [
        None,
        {"order": 7, "items": [{"sku": "a", "qty": 2}] * 100},
        nest("x", MAX_DEPTH, "mixed"),
        [MIN_INTEGER, MAX_INTEGER, 1.5e308, -0.0],
        float("nan"),  # written as null, as JSON has no NaN
        {"text": "\\u0000 is six characters here, not a NUL", "brackets": "[[[[{{{{" * 20},
        "x" * (1024 * 1024 - 2),  # exactly the bound
        (1, "tuple"),  # written as a list
    ],
)
def test_what_is_within_the_bounds_passes(value: Any) -> None:
    assert json_problem(value) is None


def test_a_problem_reads_as_one_sentence_naming_the_value_and_the_path() -> None:
    problem = json_problem({"x": nest(1, 70, "list")})
    assert problem is not None
    assert problem.describe("the input") == (
        "the input at $.x[0][0][0][0][0][0][0]…[0][0][0][0] is nested deeper than 64 levels"
    )
    assert BoundsProblem("$", "is too big").describe("the payload") == "the payload is too big"


def test_a_cycle_is_a_value_too_deep_not_a_crash() -> None:
    cycle: dict[str, Any] = {}
    cycle["self"] = cycle
    problem = json_problem(cycle)
    assert problem is not None and "deeper than 64" in problem.problem


def test_a_path_is_short_and_safe_to_print() -> None:
    assert render_path(["a", 0, "b c", 'q"u\\o']) == '$.a[0]["b c"]["q\\"u\\\\o"]'
    assert render_path(["x" * 100]) == "$." + "x" * 40 + "…"
    assert render_path(["\x00\ud800"]) == '$["\\u0000\\ud800"]'
    assert len(render_path([0] * 10_000)) < 60


@FAST
@given(hostile_values())
def test_the_bounds_never_raise_and_agree_with_what_orjson_can_write(value: Any) -> None:
    problem = json_problem(value)
    try:
        encoded = orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError too
        assert problem is not None  # whatever orjson refuses is refused, with a reason
        return
    if problem is None:
        stored = orjson.loads(encoded)
        assert len(encoded) <= 1024 * 1024
        assert depth_of(stored) <= MAX_DEPTH
        assert not any("\x00" in s for s in strings_of(stored))


@FAST
@given(hostile_values())
def test_a_problem_path_leads_to_the_value_at_fault(value: Any) -> None:
    problem = json_problem(value)
    if problem is None or "…" in problem.path or "\\" in problem.path:
        return  # a shortened path, or a key parse_path does not read: nothing to follow
    steps = parse_path(problem.path).steps
    try:
        at = _follow(orjson.loads(orjson.dumps(value)), steps)
    except TypeError:
        at = _follow(value, steps)  # orjson refused it: the value as given
    if "deeper" in problem.problem:
        assert isinstance(at, dict | list | tuple)
    elif "NUL" in problem.problem and "key" not in problem.problem:
        assert isinstance(at, str) and "\x00" in at


def _follow(value: Any, steps: tuple[str | int, ...]) -> Any:
    for step in steps:
        value = value[step]
    return value


@FAST
@given(json_values(), st.integers(0, 130), st.sampled_from(["list", "dict", "mixed"]))
@example({"s": "]]]]" * 40}, 64, "list")  # brackets in strings only look deep
@example({"s": "[[[[" * 40}, 3, "dict")
def test_the_fast_path_decides_the_depth_as_the_walk_does(
    leaf: Any, depth: int, shape: str
) -> None:
    value = nest(leaf, depth, shape)
    too_deep = depth_of(value) > MAX_DEPTH
    problem = encoded_problem(orjson.dumps(value))
    assert (problem is not None) is too_deep


def test_an_integer_literal_beyond_64_bits_on_the_wire_is_named_with_its_path() -> None:
    raw = b'{"input": {"a": [1, 123456789012345678901234]}, "id": "12345678901234567890"}'
    problem = literal_problem(raw, lambda document: document["input"])
    assert problem == BoundsProblem(
        "$.a[1]",
        "is the integer 123456789012345678901234, beyond the 64-bit range JSON is stored in",
    )
    for fine in (b'{"input": 18446744073709551615}', b'{"input": 1.1234567890123456789012}'):
        assert literal_problem(fine, lambda document: document["input"]) is None
    # Digits in a string, a number outside the part that is checked: nothing to refuse.
    assert literal_problem(raw, lambda document: document["id"]) is None


@FAST
@given(hostile_json_bytes())
def test_a_literal_is_refused_exactly_when_orjson_would_read_another_number(raw: bytes) -> None:
    try:
        read = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return  # not JSON: refused before any bound
    problem = literal_problem(raw, lambda document: document)
    if depth_of(read) > 990:
        return  # deeper than the stdlib reads: refused as too deep by json_problem first
    exact = json.loads(raw)
    assert (problem is None) == (not _has_big_integer(exact))
    if problem is None:
        assert exact == read  # orjson read every number as written


def _has_big_integer(value: Any) -> bool:
    stack = [value]
    while stack:
        item = stack.pop()
        if type(item) is int and not MIN_INTEGER <= item <= MAX_INTEGER:
            return True
        if isinstance(item, dict):
            stack += list(item.values())
        elif isinstance(item, list):
            stack += item
    return False


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("order-1", None),
        ("", "must be a string of 1 to 200 characters"),
        ("x" * 201, "must be a string of 1 to 200 characters"),
        ("a\x00b", "holds a NUL character, which Postgres cannot store"),
        ("a\udcffb", "holds a lone surrogate: it is not Unicode text"),
        ("ünï💥", None),
    ],
)
def test_an_id_is_text_postgres_can_store(text: str, problem: str | None) -> None:
    assert text_problem(text, 200) == problem


# -- reserved run ids -------------------------------------------------------------------------

_SCHEDULE_NAMES = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}", fullmatch=True)
_TIMES = st.integers(0, 253_402_300_799_999)


@FAST
@given(st.text(min_size=1, max_size=250), st.text(min_size=1, max_size=60), st.integers(1, 10**6))
def test_every_child_run_id_is_reserved(parent: str, node: str, attempt: int) -> None:
    assert reserved_shape(child_run_id(parent, node, attempt)) == "a child run (PARENT/STEP#N)"


@FAST
@given(_SCHEDULE_NAMES, _TIMES)
def test_every_schedule_run_id_is_reserved(name: str, at_ms: int) -> None:
    assert reserved_shape(fire_run_id(name, at_ms)) == "a schedule's run (NAME@TIME)"
    assert reserved_shape(manual_run_id(name, at_ms)) == "a schedule's run (NAME@TIME)"


@pytest.mark.parametrize(
    "run_id",
    [
        "ada@example.com",
        "orders/2026/1001",
        "ticket#12",
        "a/b#0",  # no attempt 0
        "a/b#01",
        "a/b#1x",
        "nightly@2026-12-04T02:00:00",  # no Z: not a time the schedules write
        "night ly@2026-12-04T02:00:00Z",  # not a schedule's name
        "nightly@2026-12-04",
        "x" * 182 + "~0123456789ABCDEF",
        "order-1001",
    ],
)
def test_at_slash_and_hash_stay_free_outside_the_derived_shapes(run_id: str) -> None:
    assert reserved_shape(run_id) is None and reserved_problem(run_id) is None


def test_a_reserved_run_id_is_refused_with_a_sentence_saying_why() -> None:
    problem = reserved_problem("nightly@2026-12-04T02:00:00Z")
    assert problem is not None and "a schedule's run (NAME@TIME)" in problem
    assert "start it under another id" in problem


# -- the wire doors ---------------------------------------------------------------------------


def _within(value: Any) -> bool:
    return json_problem(value) is None


@FAST
@given(hostile_json_bytes(), st.sampled_from(["start", "signal"]))
def test_a_request_of_hostile_json_is_decoded_or_refused_never_raising(
    field: bytes, kind: str
) -> None:
    raw = hostile_request(kind, field)
    decoded = decode_request(raw, 1_000_000)
    if isinstance(decoded, Rejected):
        assert decoded.reason in {
            DeadLetterReason.NOT_JSON,
            DeadLetterReason.OUT_OF_BOUNDS,
            DeadLetterReason.OVERSIZE,
        }
        return
    value = decoded.input if isinstance(decoded, StartRequest) else decoded.payload
    assert _within(value)
    decoded.encode()  # written again whole: a request's wrapper adds a level
    assert json.loads(raw)["input" if kind == "start" else "payload"] == value  # as written


@pytest.mark.parametrize(
    ("field", "detail"),
    [
        (b"[" * 300 + b"1" + b"]" * 300, "deeper than 64 levels"),
        (b'{"k":' * 65 + b"1" + b"}" * 65, "deeper than 64 levels"),
        (b'{"a":"x\\u0000"}', "at $.a holds a NUL character"),
        (b'{"n":123456789012345678901234567890}', "at $.n is the integer 1234567890123456789"),
        (b'{"n":-9223372036854775809}', "at $.n is the integer -9223372036854775809"),
    ],
)
@pytest.mark.parametrize("kind", ["start", "signal"])
def test_a_request_beyond_the_bounds_is_out_of_bounds(kind: str, field: bytes, detail: str) -> None:
    decoded = decode_request(hostile_request(kind, field), 1_000_000)
    assert isinstance(decoded, Rejected) and decoded.reason is DeadLetterReason.OUT_OF_BOUNDS
    assert detail in decoded.detail
    assert decoded.detail.startswith("input" if kind == "start" else "payload")


def test_a_key_given_twice_counts_once_with_its_last_value() -> None:
    decoded = decode_request(hostile_request("start", b'{"a":1,"a":2}'), 1_000_000)
    assert isinstance(decoded, StartRequest) and decoded.input == {"a": 2}


@pytest.mark.parametrize(
    "run_id", ["order-1/ship#1", "nightly@2026-12-04T02:00:00Z", "n@manual-2026-12-04T02:00:00.5Z"]
)
def test_a_start_of_a_derived_run_id_is_refused_and_a_signal_to_it_is_not(run_id: str) -> None:
    start = decode_request(hostile_request("start", b"{}", run_id), 1_000_000)
    if run_id.endswith(".5Z"):  # not a time the schedules write (milliseconds: three digits)
        assert isinstance(start, StartRequest)
        return
    assert isinstance(start, Rejected) and start.reason is DeadLetterReason.RESERVED_RUN_ID
    assert run_id in start.detail
    signal = decode_request(hostile_request("signal", b"{}", run_id), 1_000_000)
    assert isinstance(signal, SignalRequest) and signal.run_id == run_id


def _record(value: bytes, key: bytes = b"k") -> Inbound:
    return Inbound(("team.orders", 0), 5, key, value, [], "trigger")


_START_TRIGGER = Trigger("orders-in", "team.orders", "start", RunIdFrom("key"), workflow="w")
_SIGNAL_TRIGGER = Trigger(
    "cancels-in", "team.cancels", "signal", RunIdFrom("key"), input=parse_path("$.detail")
)


@FAST
@given(hostile_json_bytes(), st.sampled_from([_START_TRIGGER, _SIGNAL_TRIGGER]))
def test_a_trigger_record_of_hostile_json_is_mapped_or_refused_never_raising(
    field: bytes, trigger: Trigger
) -> None:
    raw = b'{"detail":' + field + b"}" if trigger is _SIGNAL_TRIGGER else field
    mapped = map_record(trigger, _record(raw), 1_000_000)
    assert not isinstance(mapped, Filtered)
    if isinstance(mapped, Rejected):
        assert mapped.reason in {
            DeadLetterReason.NOT_JSON,
            DeadLetterReason.OUT_OF_BOUNDS,
            DeadLetterReason.WRONG_SCHEMA,  # a signal's value that is not an object
        }
        return
    value = mapped.input if isinstance(mapped, StartRequest) else mapped.payload
    assert _within(value)
    assert trigger.input.pick(json.loads(raw)) == value  # integers as written


def test_a_trigger_refuses_a_start_of_a_derived_run_id() -> None:
    mapped = map_record(_START_TRIGGER, _record(b"{}", key=b"p/s#1"), 1_000_000)
    assert isinstance(mapped, Rejected) and mapped.reason is DeadLetterReason.RESERVED_RUN_ID
    prefixed = Trigger("o", "t", "start", RunIdFrom("key"), workflow="w", run_id_prefix="o-")
    assert isinstance(map_record(prefixed, _record(b"{}", key=b"7"), 1_000_000), StartRequest)
