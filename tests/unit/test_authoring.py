"""Workflows written in Python (processor/authoring.py): durations, the decorator's forms and
options, what it refuses, and that a definition built in code is the one parsed from its JSON
(a property over generated workflows, which also match the JSON schema)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import Retry, StepContext, StepRegistry, Workflow
from processor.authoring import duration_ms
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import RetryPolicy, StepDef, ValidationError
from processor.io.shipped.workflow_schema import workflow_validator
from processor.worker.steps import RegistrationError

SCHEMA = workflow_validator()  # the schema the package ships, as `workflows register` checks it


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (250, 250),
        ("500ms", 500),
        ("15s", 15_000),
        ("1.5s", 1_500),
        (" 10m ", 600_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        (timedelta(seconds=3), 3_000),
        (0, 0),
    ],
)
def test_a_duration_is_milliseconds(value: Any, ms: int) -> None:
    assert duration_ms(value) == ms


@pytest.mark.parametrize("value", ["15", "15 sec", "-1s", "s", -5, True, 1.5, None, "1e3ms"])
def test_what_is_not_a_duration_is_refused_with_what_to_write(value: Any) -> None:
    with pytest.raises(ValidationError, match="timeout"):
        duration_ms(value, "timeout")


def _checkout() -> Workflow:
    checkout = Workflow("checkout", version=2, output="confirm")

    @checkout.step
    def validate(ctx: StepContext) -> dict[str, Any]:
        return {"ok": True}

    @checkout.step(
        timeout="15s", retry=Retry(3, backoff="500ms"), after=[validate], queue="payments"
    )
    def charge(ctx: StepContext) -> dict[str, Any]:
        return {"charged": ctx.run_id}

    @checkout.step(name="confirm", type="confirm_order", after=[charge, "validate"])
    async def confirm(ctx: StepContext) -> dict[str, Any]:
        return {"confirmed": True}

    return checkout


def test_a_workflow_in_code_is_the_definition_its_json_says() -> None:
    written = {
        "name": "checkout",
        "version": 2,
        "steps": [
            {"name": "validate", "type": "validate"},
            {
                "name": "charge",
                "type": "charge",
                "depends_on": ["validate"],
                "timeout_ms": 15_000,
                "queue": "payments",
                "retry": {"max_attempts": 3, "backoff_ms": 500},
            },
            {
                "name": "confirm",
                "type": "confirm_order",
                "depends_on": ["charge", "validate"],
            },
        ],
        "output": "confirm",
    }
    checkout = _checkout()
    assert checkout.definition() == parse_workflow(written)
    assert list(SCHEMA.iter_errors(checkout.to_json())) == []
    charge = checkout.definition().step("charge")
    assert charge == StepDef(
        "charge",
        "charge",
        ("validate",),
        RetryPolicy(3, 500, 2.0, 60_000),
        15_000,
        "payments",
    )


def test_the_steps_functions_are_in_its_registry_by_type() -> None:
    checkout = _checkout()
    assert checkout.registry.types() == ["charge", "confirm_order", "validate"]
    assert checkout.registry.is_async("confirm_order")
    assert not checkout.registry.is_async("charge")


def test_workflows_may_share_one_registry() -> None:
    shared = StepRegistry()
    one, two = Workflow("one", registry=shared), Workflow("two", registry=shared)

    @one.step
    def first(ctx: StepContext) -> None:
        return None

    @two.step
    def second(ctx: StepContext) -> None:
        return None

    assert shared.types() == ["first", "second"]
    assert one.registry is two.registry is shared


def test_the_decorated_function_is_returned_unchanged() -> None:
    wf = Workflow("plain")

    def step(ctx: StepContext) -> int:
        return 7

    assert wf.step(step) is step
    assert wf.step(name="again", type="again")(step) is step


def test_a_step_added_twice_is_refused() -> None:
    wf = Workflow("twice")

    @wf.step
    def once(ctx: StepContext) -> None:
        return None

    with pytest.raises(ValidationError, match="step 'once' is added twice"):
        wf.step(name="once", type="other")(lambda ctx: None)


def test_two_functions_for_one_type_are_refused_as_a_registry_refuses_them() -> None:
    wf = Workflow("types")
    wf.step(name="a", type="same")(lambda ctx: 1)
    with pytest.raises(RegistrationError, match="registered twice"):
        wf.step(name="b", type="same")(lambda ctx: 2)


def test_after_a_function_that_is_not_a_step_of_the_workflow_is_refused() -> None:
    wf = Workflow("after")

    def elsewhere(ctx: StepContext) -> None:
        return None

    with pytest.raises(ValidationError, match="after 'elsewhere', which is not a step"):
        wf.step(after=[elsewhere])(lambda ctx: None)


def test_what_the_definition_refuses_is_said_when_it_is_asked_for() -> None:
    wf = Workflow("graph", output="nowhere")
    wf.step(name="a", type="a", after=["b"])(lambda ctx: None)
    with pytest.raises(ValidationError, match="depends on unknown step 'b'"):
        wf.definition()
    wf = Workflow("bad-timeout")
    with pytest.raises(ValidationError, match="step 'x': timeout"):
        wf.step(name="x", timeout="soon")(lambda ctx: None)
    wf = Workflow("bad-heartbeat")
    wf.step(name="x", type="x", timeout="1s", heartbeat_timeout="2s")(lambda ctx: None)
    with pytest.raises(ValidationError, match="heartbeat_timeout_ms"):
        wf.definition()


_NAMES = st.text("abcdefgh", min_size=1, max_size=6)
_DURATIONS = st.one_of(
    st.integers(1, 10_000_000),
    st.integers(1, 600).map(lambda s: f"{s}s"),
    st.integers(1, 600_000).map(lambda ms: f"{ms}ms"),
)


@st.composite
def _workflows(draw: st.DrawFn) -> Workflow:
    wf = Workflow(draw(_NAMES), version=draw(st.integers(1, 50)))
    names = draw(st.lists(_NAMES, min_size=1, max_size=6, unique=True))
    for i, name in enumerate(names):
        retry = draw(
            st.none()
            | st.builds(
                Retry,
                st.integers(1, 100),
                st.integers(0, 100_000),
                st.floats(1, 10, allow_nan=False),
                st.integers(0, 600_000),
            )
        )
        wf.step(
            name=name,
            type=f"t-{name}",
            after=draw(st.lists(st.sampled_from(names[:i]), unique=True)) if i else [],
            timeout=draw(_DURATIONS),
            retry=retry,
            queue=draw(st.sampled_from(["default", "fast", "slow-1"])),
            compensate=draw(st.none() | st.sampled_from(["refund", "undo-x"])),
        )(lambda ctx: None)
    return wf


@settings(max_examples=200, deadline=None)
@given(_workflows())
def test_any_workflow_in_code_is_its_json_parsed_and_matches_the_schema(wf: Workflow) -> None:
    raw = wf.to_json()
    assert list(SCHEMA.iter_errors(raw)) == []
    assert wf.definition() == parse_workflow(raw)
    assert wf.definition() == parse_workflow(json.loads(json.dumps(raw)))
