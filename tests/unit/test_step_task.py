"""The step task sent to the workers (processor/core/step_task.py): its fields, the data it
carries inline up to the bound, and tasks from before data flow."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.step_task import (
    MAX_INLINE_DATA_BYTES,
    STEP_TASK_VERSION,
    StepData,
    StepTask,
    decode_step_task,
    step_data,
)
from processor.core.workflow_def import ValidationError

from .strategies import FAST

_STORABLE = st.characters(codec="utf-8", exclude_characters="\x00")
tasks = st.builds(
    StepTask,
    run_id=st.text(_STORABLE, min_size=1, max_size=50),
    node=st.text(_STORABLE, min_size=1, max_size=20),
    attempt=st.integers(1, 100),
    step_type=st.text(_STORABLE, min_size=1, max_size=20),
    deadline_ms=st.integers(0, 253_402_300_799_999),
    tier=st.sampled_from(["t0", "t1", "t2"]),
    timeout_ms=st.one_of(st.none(), st.integers(1, 10**9)),
)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(_STORABLE, max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
dep_attempts = st.lists(
    st.tuples(st.text(_STORABLE, min_size=1, max_size=8), st.integers(1, 2**31 - 1)),
    max_size=4,
    unique_by=lambda pair: pair[0],
).map(tuple)


@st.composite
def tasks_with_data(draw: st.DrawFn) -> StepTask:
    attempts = draw(dep_attempts)
    data = None
    if draw(st.booleans()):
        # Sometimes larger than the bound: a long string in the input.
        run_input = draw(
            json_values
            | st.text(min_size=MAX_INLINE_DATA_BYTES, max_size=MAX_INLINE_DATA_BYTES + 64)
        )
        data = StepData(run_input, {name: draw(json_values) for name, _ in attempts})
    return replace(draw(tasks), dep_attempts=attempts, data=data)


def _body(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "task_version": STEP_TASK_VERSION,
        "run_id": "r1",
        "node": "fetch",
        "attempt": 2,
        "step_type": "fast",
        "deadline_ms": 1_700_000_000_000,
        "tier": "t0",
    }
    for key, value in changes.items():
        if value is ...:
            del body[key]
        else:
            body[key] = value
    return body


@FAST
@given(tasks)
def test_round_trip(task: StepTask) -> None:
    assert decode_step_task(task.encode()) == task


def test_encoding_is_the_documented_object() -> None:
    task = StepTask("r1", "fetch", 2, "fast", 1_700_000_000_000, "t0")
    assert orjson.loads(task.encode()) == _body()


@FAST
@given(tasks_with_data())
def test_data_travels_inline_up_to_the_bound_and_is_fetched_above_it(task: StepTask) -> None:
    assert task.data is not None or task.dep_attempts is not None
    size = len(orjson.dumps(task.data.to_json())) if task.data is not None else None
    decoded = decode_step_task(task.encode())
    if size is not None and size <= MAX_INLINE_DATA_BYTES:
        assert decoded == task
    else:
        assert decoded == replace(task, data=None)  # the worker fetches it
    assert decoded.dep_attempts == task.dep_attempts


def _sized_data(size: int) -> StepData:
    """Data whose encoded JSON is exactly ``size`` bytes."""
    empty = len(orjson.dumps(StepData("").to_json()))
    return StepData("x" * (size - empty))


def test_the_bound_is_on_the_encoded_data() -> None:
    task = StepTask("r1", "fetch", 1, "fast", 5, dep_attempts=())
    at_bound, above = _sized_data(MAX_INLINE_DATA_BYTES), _sized_data(MAX_INLINE_DATA_BYTES + 1)
    assert len(orjson.dumps(at_bound.to_json())) == MAX_INLINE_DATA_BYTES
    assert orjson.loads(replace(task, data=at_bound).encode())["data"] == at_bound.to_json()
    assert orjson.loads(replace(task, data=above).encode())["data"] is None


def test_encoding_with_data_is_the_documented_object() -> None:
    data = StepData({"order": 7}, {"fetch": {"rows": 3}})
    task = StepTask("r1", "publish", 2, "fast", 1_700_000_000_000, "t0", (("fetch", 3),), data)
    inline = {
        "dep_attempts": {"fetch": 3},
        "data": {"input": {"order": 7}, "deps": {"fetch": {"rows": 3}}},
    }
    assert orjson.loads(task.encode()) == _body(node="publish", **inline)
    fetched = replace(task, data=None)  # not at hand, or too large: the worker fetches it
    assert orjson.loads(fetched.encode()) == _body(
        node="publish", dep_attempts={"fetch": 3}, data=None
    )


def test_a_task_from_before_data_flow_decodes_as_fetch_everything() -> None:
    task = decode_step_task(orjson.dumps(_body()))
    assert task.dep_attempts is None and task.data is None


def test_tier_defaults_to_t1() -> None:
    assert decode_step_task(orjson.dumps(_body(tier=...))).tier == "t1"
    assert StepTask("r", "n", 1, "t", 5).tier == "t1"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "has no value"),
        (b"{nope", "is not JSON"),
        (b"[]", "task_version 1, 2 or 3"),
        (orjson.dumps(_body(task_version=2)), "a map's item, and has none"),
        (orjson.dumps(_body(task_version=4)), "task_version 1, 2 or 3"),
        (orjson.dumps(_body(task_version=3)), "step_version must be 2 to 9999"),
        (orjson.dumps(_body(task_version=3, step_version=1)), "step_version must be 2 to"),
        (orjson.dumps(_body(step_version=2)), "step_version comes only with task_version 3"),
        (orjson.dumps(_body(task_version=...)), "task_version 1, 2 or 3"),
        (orjson.dumps(_body(run_id=...)), "missing 'run_id'"),
        (orjson.dumps(_body(deadline_ms=...)), "missing 'deadline_ms'"),
        (orjson.dumps(_body(node=3)), "must be strings"),
        (orjson.dumps(_body(tier=None)), "must be strings"),
        (orjson.dumps(_body(attempt="2")), "must be integers"),
        (orjson.dumps(_body(attempt=True)), "must be integers"),
        (orjson.dumps(_body(deadline_ms=1.5)), "must be integers"),
        # Bounded as wakeups are: a poison task must fail here, not in the worker's insert.
        (orjson.dumps(_body(tier="t9")), "tier must be one of"),
        (orjson.dumps(_body(node="a\x00b")), "NUL"),
        (orjson.dumps(_body(attempt=0)), "out of range"),
        (orjson.dumps(_body(attempt=2**40)), "out of range"),
        (orjson.dumps(_body(dep_attempts=["a"])), "dep_attempts must be an object"),
        (orjson.dumps(_body(dep_attempts={"a": 0})), "dep_attempts.a must be an attempt"),
        (orjson.dumps(_body(dep_attempts={"a": True})), "dep_attempts.a must be an attempt"),
        (orjson.dumps(_body(dep_attempts={"a": 2**31})), "dep_attempts.a must be an attempt"),
        (orjson.dumps(_body(dep_attempts={"a\x00": 1})), "NUL"),
        (orjson.dumps(_body(data=[])), "data must be an object with input and deps"),
        (orjson.dumps(_body(data={"input": 1})), "data must be an object with input and deps"),
        (orjson.dumps(_body(data={"input": 1, "deps": {}, "x": 2})), "with input and deps"),
        (orjson.dumps(_body(data={"input": 1, "deps": [1]})), "data.deps must be an object"),
    ],
)
def test_invalid_tasks_raise_validation_error(value: bytes | None, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        decode_step_task(value)


@FAST
@given(st.binary(max_size=200))
def test_arbitrary_bytes_give_a_task_or_a_validation_error(value: bytes) -> None:
    try:
        task = decode_step_task(value)
    except ValidationError:
        return
    assert isinstance(task, StepTask)


@FAST
@given(
    st.dictionaries(
        st.sampled_from([*_body(), "x", "dep_attempts", "data"]),
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**63), 2**64 - 1),
            st.text(max_size=4),
            st.lists(st.integers(0, 9), max_size=2),
        ),
    )
)
def test_arbitrary_objects_give_a_task_or_a_validation_error(changes: dict[str, Any]) -> None:
    try:
        task = decode_step_task(orjson.dumps({**_body(), **changes}))
    except ValidationError:
        return
    assert isinstance(task.attempt, int) and isinstance(task.run_id, str)


def test_step_data_makes_what_the_named_tuple_makes_with_read_only_deps() -> None:
    deps = {"s0": {"n": 1}}
    made = step_data({"x": 1}, deps)
    assert type(made) is StepData
    assert made == StepData({"x": 1}, deps)
    assert (made.input, dict(made.deps)) == ({"x": 1}, deps)
    with pytest.raises(TypeError):
        made.deps["s1"] = 2  # type: ignore[index]


def test_a_task_carries_its_timeouts_and_a_worker_counts_from_its_start() -> None:
    """``timeout_ms`` (start-to-close) always, the schedule-to bounds when the step has them;
    its deadline once started is its start plus its timeout, its close-by bound at most."""
    task = StepTask(
        "r1",
        "fetch",
        2,
        "fast",
        1_000,
        "t0",
        timeout_ms=1_000,
        start_by_ms=2_000,
        close_by_ms=9_000,
    )
    body = orjson.loads(task.encode())
    assert (body["timeout_ms"], body["start_by_ms"], body["close_by_ms"]) == (1_000, 2_000, 9_000)
    assert decode_step_task(task.encode()) == task
    assert task.taken_until_ms() == 2_000
    assert task.deadline_from(5_000) == 6_000
    assert task.deadline_from(8_500) == 9_000
    plain = StepTask("r1", "fetch", 2, "fast", 1_000, "t0", timeout_ms=1_000)
    assert plain.taken_until_ms() is None  # waits in its queue as long as it takes
    assert "start_by_ms" not in orjson.loads(plain.encode())


def test_a_task_from_before_start_to_close_keeps_its_deadline() -> None:
    old = decode_step_task(orjson.dumps(_body()))
    assert old.timeout_ms is None
    assert old.taken_until_ms() == old.deadline_ms == old.deadline_from(0)


def test_the_bounds_move_into_the_readers_clock_as_the_deadline() -> None:
    task = StepTask(
        "r", "n", 1, "t", 10_000, "t1", timeout_ms=500, start_by_ms=20_000, close_by_ms=30_000
    )
    decoded = decode_step_task(task.encode(), clock_offset_ms=100)
    assert (decoded.deadline_ms, decoded.start_by_ms, decoded.close_by_ms) == (
        9_900,
        19_900,
        29_900,
    )
    assert decoded.timeout_ms == 500  # a duration: in no clock


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"timeout_ms": 0}, "timeout_ms must be a positive integer"),
        ({"timeout_ms": "1s"}, "timeout_ms must be a positive integer"),
        ({"start_by_ms": -1}, "start_by_ms and close_by_ms must be epoch ms"),
        ({"close_by_ms": True}, "start_by_ms and close_by_ms must be epoch ms"),
    ],
)
def test_invalid_timeouts_are_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        decode_step_task(orjson.dumps(_body(**changes)))
