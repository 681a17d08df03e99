"""Step functions run by the worker: outputs, failures, and outputs that cannot be stored."""

from __future__ import annotations

from processor.core.model import StepOutcome
from processor.core.step_task import StepTask
from processor.engine.steps import (
    StepContext,
    StepFailed,
    StepRegistry,
    execute_step,
    sample_registry,
)


def _task(step_type: str, attempt: int = 1) -> StepTask:
    return StepTask("run-1", "node", attempt, step_type, deadline_ms=2**40)


def test_a_step_output_is_the_attempts_result() -> None:
    assert execute_step(sample_registry(), _task("fast")) == (
        StepOutcome.SUCCEEDED,
        {"node": "node", "attempt": 1},
        None,
    )


def test_a_flaky_step_fails_its_first_attempts_then_succeeds() -> None:
    registry = sample_registry(flaky_failures=2)
    assert execute_step(registry, _task("flaky", 2))[0] is StepOutcome.FAILED
    assert execute_step(registry, _task("flaky", 3))[0] is StepOutcome.SUCCEEDED


def test_an_unknown_step_type_fails_the_attempt() -> None:
    outcome, _, error = execute_step(StepRegistry(), _task("nope"))
    assert outcome is StepOutcome.FAILED and error is not None and "nope" in error


def test_an_output_that_cannot_be_stored_fails_the_attempt_instead_of_the_worker() -> None:
    registry = StepRegistry()

    @registry.step("sets")
    def sets(ctx: StepContext) -> object:
        return {1, 2}

    @registry.step("raises")
    def raises(ctx: StepContext) -> object:
        raise StepFailed("boom")

    outcome, output, error = execute_step(registry, _task("sets"))
    assert outcome is StepOutcome.FAILED and output is None and error is not None
    assert execute_step(registry, _task("raises")) == (StepOutcome.FAILED, None, "StepFailed: boom")
