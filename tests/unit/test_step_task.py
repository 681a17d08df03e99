"""The step task sent to the workers (processor/step_task.py)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.model import ValidationError
from processor.core.step_task import STEP_TASK_VERSION, StepTask, decode_step_task

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
)


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


def test_tier_defaults_to_t1() -> None:
    assert decode_step_task(orjson.dumps(_body(tier=...))).tier == "t1"
    assert StepTask("r", "n", 1, "t", 5).tier == "t1"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (None, "has no value"),
        (b"{nope", "is not JSON"),
        (b"[]", "task_version 1"),
        (orjson.dumps(_body(task_version=2)), "task_version 1"),
        (orjson.dumps(_body(task_version=...)), "task_version 1"),
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
        st.sampled_from(["run_id", "node", "attempt", "step_type", "deadline_ms", "tier", "x"]),
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
