"""A steps module of the tests' own that tags its runs (`ductor worker --app
tests.integration.tagging_steps:registry`, also run in process isolation, where its tags cross
the pipe to the worker).

One step type, ``tagging``: the run's input says, by step name, which tags each attempt sets
(``{"by_node": {"a": {"1": {"customer": "c-42"}, "2": {...}}}}``: by attempt, ``"*"`` for
every attempt) and which attempts raise after setting them (``{"fail_on": {"a": [1]}}``).
"""

from __future__ import annotations

from typing import Any

from processor.worker import StepContext, StepFailed, StepRegistry

registry = StepRegistry()


@registry.step("tagging")
def tagging(ctx: StepContext) -> Any:
    mine = (ctx.input.get("by_node") or {}).get(ctx.node) or {}
    tags = mine.get(str(ctx.attempt), mine.get("*", {}))
    for key, value in tags.items():
        ctx.tag(key, value)
    if ctx.attempt in (ctx.input.get("fail_on") or {}).get(ctx.node, []):
        raise StepFailed(f"attempt {ctx.attempt} fails after tagging")
    return {"tagged": sorted(tags)}
