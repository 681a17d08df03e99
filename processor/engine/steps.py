"""Step functions: the registry a worker runs them from, the sample steps, and running one
attempt.

Register your own step function with ``@registry.step("my_type")``; it receives a
``StepContext`` (which attempt of which step, the run's input and the outputs of the step's
dependencies) and returns a JSON-serialisable output, or raises ``StepFailed`` (or any
exception) to fail the attempt. See docs/operations.md.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from processor.core.model import StepOutcome
from processor.core.step_task import NO_DEPS, StepData, StepTask

# The largest output a step may return (its encoded JSON). It is stored in Postgres, read by
# the steps that depend on it and may become part of the run's output; data larger than this
# belongs in object storage, with its key as the output. A larger output fails the attempt.
MAX_STEP_OUTPUT_BYTES = 1024 * 1024


class StepFailed(Exception):
    """Raised by a step function to fail its attempt with a message."""


@dataclass(frozen=True)
class StepContext:
    """What a step function is given: which attempt of which step it runs, by when, and its
    data: the run's input (``{}`` when the run was started without one) and the outputs of
    the steps it depends on, by step name (read-only; a step with no dependencies gets an
    empty mapping). The data is the same whether the task carried it or the worker fetched it.
    """

    run_id: str
    node: str
    attempt: int
    deadline_ms: int
    input: Any = None
    deps: Mapping[str, Any] = field(default_factory=lambda: NO_DEPS)


StepFn = Callable[[StepContext], Any]


class StepRegistry:
    def __init__(self) -> None:
        self._steps: dict[str, StepFn] = {}

    def step(self, step_type: str) -> Callable[[StepFn], StepFn]:
        def register(fn: StepFn) -> StepFn:
            self._steps[step_type] = fn
            return fn

        return register

    def get(self, step_type: str) -> StepFn | None:
        return self._steps.get(step_type)

    def types(self) -> list[str]:
        return sorted(self._steps)


def sample_registry(flaky_failures: int = 2) -> StepRegistry:
    """The sample steps used by the demo, the tests and the benchmark."""
    registry = StepRegistry()

    @registry.step("fast")
    def fast(ctx: StepContext) -> Any:
        return {"node": ctx.node, "attempt": ctx.attempt}

    @registry.step("slow")
    def slow(ctx: StepContext) -> Any:
        time.sleep(0.2)
        return {"slept_ms": 200}

    @registry.step("flaky")
    def flaky(ctx: StepContext) -> Any:
        if ctx.attempt <= flaky_failures:
            raise StepFailed(f"flaky step fails its first {flaky_failures} attempt(s)")
        return {"succeeded_on_attempt": ctx.attempt}

    @registry.step("hang")
    def hang(ctx: StepContext) -> Any:
        # Outlives its deadline on the first attempt: the coordinator times it out and retries.
        if ctx.attempt == 1:
            time.sleep(max(0.0, (ctx.deadline_ms - time.time() * 1000) / 1000) + 0.5)
        return {"attempt": ctx.attempt}

    @registry.step("fail")
    def fail(ctx: StepContext) -> Any:
        raise StepFailed("this step always fails")

    @registry.step("echo")
    def echo(ctx: StepContext) -> Any:
        # What the step was given, as its output: shows the data flowing between steps.
        return {"node": ctx.node, "input": ctx.input, "deps": dict(ctx.deps)}

    return registry


def execute_step(
    registry: StepRegistry, task: StepTask, data: StepData
) -> tuple[StepOutcome, Any, str | None]:
    """Run one attempt with its ``data`` (the task's own, or fetched): its output, or its
    failure as the attempt's result (never the worker's)."""
    fn = registry.get(task.step_type)
    if fn is None:
        return StepOutcome.FAILED, None, f"no step function registered for type {task.step_type!r}"
    ctx = StepContext(task.run_id, task.node, task.attempt, task.deadline_ms, data.input, data.deps)
    try:
        output = fn(ctx)
        # The result is stored as JSON: check it here, in the attempt.
        size = len(orjson.dumps(output))
        if size > MAX_STEP_OUTPUT_BYTES:
            raise ValueError(
                f"the output is {size} bytes as JSON, more than the {MAX_STEP_OUTPUT_BYTES}"
                " a step may return"
            )
        if _holds_nul(output):
            raise ValueError("the output holds a NUL character, which Postgres cannot store")
        return StepOutcome.SUCCEEDED, output, None
    except Exception as exc:  # a step's failure is the attempt's result, not the worker's
        return StepOutcome.FAILED, None, storable_text(f"{type(exc).__name__}: {exc}")


def storable_text(text: str) -> str:
    """``text`` with what Postgres cannot store in text (NUL) replaced."""
    return text.replace("\x00", "\ufffd")


def _holds_nul(value: Any) -> bool:
    """Whether a JSON-like value holds a NUL character in a string or a key (jsonb refuses)."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_nul(v) for v in value)
    return False
