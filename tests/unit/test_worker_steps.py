"""Step functions run by the worker: outputs, failures, outputs that cannot be stored, and the
data a step is given."""

from __future__ import annotations

import asyncio
from types import MappingProxyType
from typing import Any

import pytest

from processor.core.bounds import MAX_DEPTH
from processor.core.model import StepOutcome
from processor.core.step_task import StepData, StepTask
from processor.worker.handles import StepHandle
from processor.worker.samples import sample_registry
from processor.worker.steps import (
    MAX_STEP_OUTPUT_BYTES,
    AttemptResult,
    NonRetryable,
    RegistrationError,
    StepContext,
    StepFailed,
    StepRegistry,
    execute_async_step,
    execute_step,
)

NO_DATA = StepData({})


def _task(step_type: str, attempt: int = 1) -> StepTask:
    return StepTask("run-1", "node", attempt, step_type, deadline_ms=2**40)


def test_a_step_output_is_the_attempts_result() -> None:
    assert execute_step(sample_registry(), _task("fast"), NO_DATA) == AttemptResult(
        StepOutcome.SUCCEEDED, {"node": "node", "attempt": 1}
    )


def test_a_flaky_step_fails_its_first_attempts_then_succeeds() -> None:
    registry = sample_registry(flaky_failures=2)
    assert execute_step(registry, _task("flaky", 2), NO_DATA)[0] is StepOutcome.FAILED
    assert execute_step(registry, _task("flaky", 3), NO_DATA)[0] is StepOutcome.SUCCEEDED


def test_an_unknown_step_type_fails_the_attempt() -> None:
    outcome, _, error, *_ = execute_step(StepRegistry(), _task("nope"), NO_DATA)
    assert outcome is StepOutcome.FAILED and error is not None and "nope" in error


def test_an_output_that_cannot_be_stored_fails_the_attempt_instead_of_the_worker() -> None:
    registry = StepRegistry()

    @registry.step("sets")
    def sets(ctx: StepContext) -> object:
        return {1, 2}

    @registry.step("raises")
    def raises(ctx: StepContext) -> object:
        raise StepFailed("boom")

    outcome, output, error, *_ = execute_step(registry, _task("sets"), NO_DATA)
    assert outcome is StepOutcome.FAILED and output is None and error is not None
    raised = execute_step(registry, _task("raises"), NO_DATA)
    assert raised._replace(traceback=None) == AttemptResult(
        StepOutcome.FAILED, None, "StepFailed: boom", retryable=True, error_type="StepFailed"
    )


def _nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):  # a list inside, objects and lists in turn
        value = {"x": value} if level % 2 else [value]
    return value


@pytest.mark.parametrize(
    ("output", "says"),
    [
        ({"deep": _nested(64)}, "the output at $.deep.x[0].x[0].x[0].x…[0].x[0].x is nested"),
        (_nested(300), "is nested deeper than 64 levels"),  # past what orjson writes
        ({"a": ["x\x00"]}, "the output at $.a[0] holds a NUL character"),
        ({"n": 2**64}, "the output at $.n is the integer 18446744073709551616, beyond"),
        ({"s": "\ud800"}, "the output at $.s holds a lone surrogate"),
        ({1: "x"}, "the output has a key that is not a string (int)"),
    ],
)
def test_an_output_beyond_the_bounds_fails_the_attempt_for_good_naming_the_path(
    output: Any, says: str
) -> None:
    registry = StepRegistry()

    @registry.step("hostile")
    def hostile(ctx: StepContext) -> Any:
        return output

    for run in (execute_step, lambda *a: asyncio.run(_async(registry, output))):
        outcome, stored, error, retryable, *_ = run(registry, _task("hostile"), NO_DATA)
        assert outcome is StepOutcome.FAILED and stored is None and retryable is False
        assert error is not None and error.startswith("OutOfBounds: ") and says in error


async def _async(registry: StepRegistry, output: Any) -> AttemptResult:
    @registry.step("hostile_async")
    async def hostile_async(ctx: StepContext) -> Any:
        return output

    return await execute_async_step(registry, _task("hostile_async"), NO_DATA)


def test_a_failure_message_is_text_postgres_can_store() -> None:
    registry = StepRegistry()

    @registry.step("says")
    def says(ctx: StepContext) -> Any:
        raise StepFailed("bad \x00 and \ud800 but é kept")

    _, _, error, *_ = execute_step(registry, _task("says"), NO_DATA)
    assert error == "StepFailed: bad \ufffd and \\ud800 but é kept"
    assert error is not None and error.encode()  # Postgres text: UTF-8, no NUL


def test_a_run_input_beyond_the_bounds_fails_the_attempt_before_the_step_runs() -> None:
    """A child run's input is an aggregate Postgres copied (a map step's list of outputs):
    it may be one level deeper than any one output. Its steps refuse it, for good."""
    ran: list[str] = []
    registry = StepRegistry()

    @registry.step("reads")
    def reads(ctx: StepContext) -> Any:
        ran.append(ctx.run_id)
        return None

    items = [_nested(MAX_DEPTH - 1), _nested(MAX_DEPTH)]  # each within bounds, the list not
    outcome, _, error, retryable, *_ = execute_step(registry, _task("reads"), StepData(items))
    assert outcome is StepOutcome.FAILED and retryable is False and ran == []
    assert error is not None and "the run input at $[1].x[0].x" in error and "than 64" in error
    assert execute_step(registry, _task("reads"), StepData(items[:1]))[0] is StepOutcome.SUCCEEDED


def test_a_step_is_given_the_run_input_and_its_dependencies_outputs() -> None:
    data = StepData({"order": 7}, {"fetch": {"rows": 3}, "enrich": None})
    outcome, output, *_ = execute_step(sample_registry(), _task("echo"), data)
    assert outcome is StepOutcome.SUCCEEDED
    assert output == {
        "node": "node",
        "input": {"order": 7},
        "deps": {"fetch": {"rows": 3}, "enrich": None},
    }


def test_a_step_cannot_change_the_outputs_it_is_given() -> None:
    registry = StepRegistry()

    @registry.step("writes")
    def writes(ctx: StepContext) -> Any:
        ctx.deps["fetch"] = 1  # type: ignore[index]
        return None

    outcome, _, error, *_ = execute_step(
        registry, _task("writes"), StepData({}, MappingProxyType({"fetch": 0}))
    )
    assert outcome is StepOutcome.FAILED and error is not None and error.startswith("TypeError")


def test_a_context_built_without_data_has_no_input_and_no_dependencies() -> None:
    ctx = StepContext("r", "n", 1, 5)  # the four fields steps were given before data flow
    assert ctx.input is None and dict(ctx.deps) == {}


@pytest.mark.parametrize(
    ("size", "succeeds"), [(MAX_STEP_OUTPUT_BYTES, True), (MAX_STEP_OUTPUT_BYTES + 1, False)]
)
def test_an_output_larger_than_the_bound_fails_the_attempt(size: int, succeeds: bool) -> None:
    registry = StepRegistry()

    @registry.step("big")
    def big(ctx: StepContext) -> Any:
        return "x" * (size - 2)  # a JSON string: its two quotes and the characters

    outcome, output, error, *_ = execute_step(registry, _task("big"), NO_DATA)
    assert (outcome is StepOutcome.SUCCEEDED) is succeeds
    if not succeeds:
        assert output is None and error is not None
        assert f"{size:,} bytes as JSON, more than the {MAX_STEP_OUTPUT_BYTES:,}" in error


def test_a_non_retryable_failure_says_so_and_any_other_exception_does_not() -> None:
    registry = StepRegistry()

    @registry.step("declined")
    def declined(ctx: StepContext) -> object:
        raise NonRetryable("card declined")

    @registry.step("broken")
    def broken(ctx: StepContext) -> object:
        raise KeyError("x")

    final = execute_step(registry, _task("declined"), NO_DATA)
    assert final._replace(traceback=None) == AttemptResult(
        StepOutcome.FAILED, None, "NonRetryable: card declined", False, "NonRetryable"
    )
    assert execute_step(registry, _task("broken"), NO_DATA).retryable is True


def test_two_functions_for_one_step_type_are_refused_at_registration() -> None:
    registry = StepRegistry()

    @registry.step("charge")
    def charge(ctx: StepContext) -> object:
        return 1

    registry.step("charge")(charge)  # the same function again (a module imported twice): fine
    with pytest.raises(RegistrationError, match="'charge' is registered twice"):

        @registry.step("charge")
        def charge_again(ctx: StepContext) -> object:
            return 2

    assert registry.get("charge") is charge


def test_an_async_step_runs_on_an_event_loop_and_is_known_as_async() -> None:
    registry = StepRegistry()

    @registry.step("wait")
    async def wait(ctx: StepContext) -> object:
        await asyncio.sleep(0)
        return {"attempt": ctx.attempt}

    assert registry.is_async("wait") and not sample_registry().is_async("fast")
    outcome = asyncio.run(execute_async_step(registry, _task("wait", 2), NO_DATA))
    assert outcome == AttemptResult(StepOutcome.SUCCEEDED, {"attempt": 2})


def test_a_step_sees_its_heartbeats_counted_and_its_cancellation() -> None:
    registry = StepRegistry()
    seen: list[bool] = []

    @registry.step("long")
    def long(ctx: StepContext) -> object:
        ctx.heartbeat()
        ctx.heartbeat()
        seen.append(ctx.cancelled)
        return None

    handle = StepHandle(deadline_ms=2**42)
    execute_step(registry, _task("long"), NO_DATA, handle)
    handle.cancel()
    execute_step(registry, _task("long"), NO_DATA, handle)
    assert handle.beats == 4 and seen == [False, True]
    # A deadline in the past is a cancellation too, without anyone saying so.
    assert StepHandle(deadline_ms=1).cancelled
    assert StepContext("r", "n", 1, deadline_ms=1).cancelled


def test_heartbeat_details_are_kept_for_the_worker_and_bounded() -> None:
    """The last details given are the attempt's (JSON text, for the worker to record); a
    heartbeat without details keeps them; details beyond their bound are refused, in the
    step, as ValueError; an earlier execution's details are the step's
    ``last_heartbeat``."""
    registry = StepRegistry()
    seen: list[object] = []

    @registry.step("long")
    def long(ctx: StepContext) -> object:
        seen.append(ctx.last_heartbeat)
        ctx.heartbeat({"done": 1})
        ctx.heartbeat()
        with pytest.raises(ValueError, match="progress is 65,547 bytes as JSON"):
            ctx.heartbeat({"blob": "x" * (64 * 1024)})
        with pytest.raises(ValueError, match="NUL"):
            ctx.heartbeat({"bad": "\x00"})
        return None

    handle = StepHandle(deadline_ms=2**42, last_details={"done": 0})
    assert execute_step(registry, _task("long"), NO_DATA, handle).error is None
    assert handle.details == '{"done":1}' and handle.beats == 2
    assert seen == [{"done": 0}]
