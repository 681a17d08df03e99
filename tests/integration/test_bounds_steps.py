"""Bounds where Ductor's own code meets values (core/bounds.py), on the real services: a step
returning what cannot be stored fails its attempt once, for good, naming the path, and the
worker goes on; a child whose input Postgres aggregated beyond the bounds (a map step's list
of outputs each within them) fails at its first step, and its parent's step fails with the
reason; a map whose list is beyond the bounds never starts; a step's error that is not text
Postgres can store (a NUL, a lone surrogate) is stored made storable, and the worker goes on.
No run is left hanging."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest

from processor import NonRetryable, StepContext, StepRegistry
from processor.client import start_run
from processor.core.bounds import MAX_DEPTH
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from .instances import WorkerThread
from .runs import count_terminal, run_statuses, step_attempts
from .waiting import wait_for

pytestmark = pytest.mark.integration


def nest(depth: int, leaf: Any = 1) -> Any:
    for level in range(depth):
        leaf = [leaf] if level % 2 else {"x": leaf}
    return leaf


def _cycle() -> list[Any]:
    cycle: list[Any] = []
    cycle.append(cycle)
    return cycle


# What the hostile step returns, by its run's input, and what the run's failure then says.
OUTPUTS: dict[str, tuple[Any, str]] = {
    "deep65": (nest(MAX_DEPTH + 1), "the output at $.x[0].x[0].x[0].x[0]…"),
    "deep300": (nest(300), "is nested deeper than 64 levels"),
    "nul": ({"a": ["x\x00"]}, "the output at $.a[0] holds a NUL character"),
    "bigint": ({"n": 2**64}, "the output at $.n is the integer 18446744073709551616"),
    "surrogate": ({"s": "\ud800"}, "the output at $.s holds a lone surrogate"),
    "key": ({"k": {1: "x"}}, "the output at $.k has a key that is not a string (int)"),
    "set": ({"s": {1, 2}}, "the output at $.s is a set, which is not JSON"),
    "cycle": (None, "is nested deeper than 64 levels"),
}


def _registry() -> StepRegistry:
    registry = StepRegistry()

    @registry.step("hostile")
    def hostile(ctx: StepContext) -> Any:
        kind = ctx.input["kind"]
        if kind == "fine":
            return {"ok": nest(MAX_DEPTH - 1)}  # as deep as may be
        if kind == "says":  # an error Postgres cannot store as it is
            raise NonRetryable("no \x00 nor \ud800 here")
        return _cycle() if kind == "cycle" else OUTPUTS[kind][0]

    @registry.step("items")
    def items(ctx: StepContext) -> list[int]:
        return [1, 2]

    @registry.step("deep_item")
    def deep_item(ctx: StepContext) -> Any:
        return nest(MAX_DEPTH)  # within the bounds; the map's list of them is not

    @registry.step("deep_list")
    def deep_list(ctx: StepContext) -> Any:
        return [nest(MAX_DEPTH), 1]  # one level too deep as a whole

    @registry.step("book")
    def book(ctx: StepContext) -> dict[str, Any]:
        return {"booked": len(ctx.input)}

    return registry


def _register(pg: psycopg.Connection[Any]) -> dict[str, str]:
    tag = uuid.uuid4().hex[:6]
    names = {k: f"{k}-{tag}" for k in ("hostile", "child", "parent", "mapped")}
    once = {"max_attempts": 1}
    for raw in (
        {
            "name": names["hostile"],
            "version": 1,
            # Three attempts, were the failure retryable: it is not.
            "steps": [{"name": "h", "type": "hostile", "retry": {"max_attempts": 3}}],
        },
        {"name": names["child"], "version": 1, "steps": [{"name": "b", "type": "book"}]},
        {
            "name": names["parent"],
            "version": 1,
            "steps": [
                {"name": "list", "type": "items"},
                {
                    "name": "deepen",
                    "kind": "map",
                    "type": "deep_item",
                    "items_from": "list",
                    "depends_on": ["list"],
                },
                # A step between: a child started by the commit that ends the map would not
                # see the map's output yet (that commit writes it).
                {"name": "pause", "type": "items", "depends_on": ["deepen"]},
                {
                    "name": "ship",
                    "kind": "workflow",
                    "workflow": names["child"],
                    "input_from": "deepen",
                    "depends_on": ["deepen", "pause"],
                    "retry": once,
                },
            ],
        },
        {
            "name": names["mapped"],
            "version": 1,
            "steps": [
                {"name": "list", "type": "deep_list", "retry": once},
                {
                    "name": "each",
                    "kind": "map",
                    "type": "book",
                    "items_from": "list",
                    "depends_on": ["list"],
                },
            ],
        },
    ):
        register_workflow(pg, parse_workflow(raw))
    return names


def test_values_beyond_the_bounds_fail_their_step_once_naming_the_path(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    names = _register(pg)
    processor = processor_thread(settings)
    worker = WorkerThread(settings, _registry())
    hostile = [f"out-{kind}" for kind in (*OUTPUTS, "fine", "says")]
    runs = [*hostile, "parent-1", "mapped-1"]
    try:
        for run_id in hostile:
            start_run(settings, names["hostile"], run_id, {"kind": run_id.removeprefix("out-")})
        start_run(settings, names["parent"], "parent-1")
        start_run(settings, names["mapped"], "mapped-1")
        wait_for(lambda: count_terminal(pg, runs) == len(runs), 90, "every run to end")
        assert worker.alive and worker.error is None and processor.alive
    finally:
        worker.stop()
    statuses = run_statuses(pg, [*runs, "parent-1/ship#1"])
    assert statuses.pop("out-fine") == "succeeded"
    assert statuses.pop("out-says") == "failed"
    assert set(statuses.values()) == {"failed"}
    reasons = dict(
        pg.execute(
            "SELECT run_id, failure_reason FROM eec_workflow_run WHERE run_id = ANY(%s)",
            (runs,),
        ).fetchall()
    )
    for kind, (_, says) in OUTPUTS.items():
        run_id = f"out-{kind}"
        assert reasons[run_id].startswith("step 'h' failed after 1 attempt(s): OutOfBounds: ")
        assert says in reasons[run_id]
        assert step_attempts(pg, run_id) == {"h": [(1, "failed")]}, "the failure is final"
    assert reasons["out-says"] == (
        "step 'h' failed after 1 attempt(s): NonRetryable: no \ufffd nor \\ud800 here"
    )
    # The child's input is the map's list of two outputs, each 64 levels deep: 65 levels.
    assert reasons["parent-1"].startswith(
        "step 'ship' failed after 1 attempt(s): child run parent-1/ship#1 failed: step 'b'"
        " failed after 1 attempt(s): OutOfBounds: the run input at $[0][0].x[0].x"
    )
    assert "is nested deeper than 64 levels" in reasons["parent-1"]
    assert reasons["mapped-1"].startswith(
        "step 'list' failed after 1 attempt(s): OutOfBounds: the output at $[0][0].x[0]"
    )
    assert "each" not in step_attempts(pg, "mapped-1"), "a map over a list beyond the bounds"
