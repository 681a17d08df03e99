"""The sample step functions: used by the demo, the benchmark, the chaos run and the tests,
and run by ``ductor worker`` when no ``--app`` is given."""

from __future__ import annotations

import time
from typing import Any

from processor.worker.steps import StepContext, StepFailed, StepRegistry


def sample_registry(flaky_failures: int = 2) -> StepRegistry:
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
