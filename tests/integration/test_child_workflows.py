"""Child workflows on the real services: a step of kind workflow starts a child run with the
output of the step before it, and ends with the child's output, which the next step reads; a
child that fails fails its step (its retry policy starts another child); cancelling the parent
cancels the child in flight; `ductor inspect` shows the links both ways; nothing is applied
twice."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import psycopg
import pytest

from processor import StepContext, StepRegistry
from processor.client import send_signal
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from .audit import assert_transitions_applied_once
from .children import run_ductor
from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _registry() -> StepRegistry:
    registry = StepRegistry()

    @registry.step("price_it")
    def price_it(ctx: StepContext) -> dict[str, Any]:
        return {"weight_kg": ctx.input.get("weight_kg", 2), "fail": ctx.input.get("fail", 0)}

    @registry.step("book_carrier")
    def book_carrier(ctx: StepContext) -> dict[str, Any]:
        # The child's input is the parent's price output. The children of the parent's first
        # ``fail`` attempts fail (a child run is o-2/ship#N: its parent's attempt N).
        if int(ctx.run_id.rsplit("#", 1)[1]) <= ctx.input["fail"]:
            raise RuntimeError("the carrier is busy")
        return {"carrier": "dhl", "kg": ctx.input["weight_kg"]}

    @registry.step("notify")
    def notify(ctx: StepContext) -> dict[str, Any]:
        return {"sent": f"shipped with {ctx.deps['ship']['carrier']}"}

    return registry


def _register(pg: psycopg.Connection[Any]) -> tuple[str, str, str]:
    """The child workflow (one step booking a carrier), a parent that starts it between two
    steps of its own, and a parent whose child waits for a signal that never comes."""
    tag = uuid.uuid4().hex[:6]
    child, parent, waiting = f"shipping-{tag}", f"order-{tag}", f"waiting-{tag}"
    book = {"name": "book", "type": "book_carrier", "retry": {"max_attempts": 1}}
    ship = {
        "name": "ship",
        "kind": "workflow",
        "workflow": child,
        "input_from": "price",
        "depends_on": ["price"],
        "retry": {"max_attempts": 2, "backoff_ms": 100},
    }
    for raw in (
        {"name": child, "version": 1, "steps": [book], "output": "book"},
        {
            "name": parent,
            "version": 1,
            "steps": [
                {"name": "price", "type": "price_it"},
                ship,
                {"name": "notify", "type": "notify", "depends_on": ["ship"]},
            ],
            "output": "notify",
        },
        {
            "name": f"{child}-w",
            "version": 1,
            "steps": [{"name": "w", "kind": "wait", "signal": "no"}],
        },
        {
            "name": waiting,
            "version": 1,
            "steps": [{"name": "hold", "kind": "workflow", "workflow": f"{child}-w"}],
        },
    ):
        register_workflow(pg, parse_workflow(raw))
    return child, parent, waiting


def test_a_child_runs_for_its_step_and_its_end_comes_back_once(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    child, parent, waiting = _register(pg)
    processor_thread(settings)
    worker = WorkerThread(settings, _registry())
    try:
        for run_id, workflow, run_input in (
            ("o-1", parent, {"weight_kg": 3}),
            ("o-2", parent, {"weight_kg": 5, "fail": 1}),  # the first child fails
            ("o-3", parent, {"weight_kg": 1, "fail": 2}),  # both children fail
            ("o-4", waiting, {}),
        ):
            started = run_ductor(
                settings,
                "start",
                workflow,
                "--run-id",
                run_id,
                "--input",
                orjson.dumps(run_input).decode(),
            )
            assert started.returncode == 0, started.stderr
        wait_for(
            lambda: count_terminal(pg, ["o-1", "o-2", "o-3"]) == 3, 60, "the three orders to end"
        )
        wait_for(
            lambda: run_statuses(pg, ["o-4/hold#1"]).get("o-4/hold#1") == "running",
            60,
            "o-4's child to wait",
        )
        send_signal(settings, "o-4")  # cancel the parent
        wait_for(
            lambda: count_terminal(pg, ["o-4", "o-4/hold#1"]) == 2, 60, "o-4 and its child to end"
        )
    finally:
        worker.stop()
    statuses = run_statuses(
        pg,
        [
            "o-1",
            "o-2",
            "o-3",
            "o-4",
            "o-1/ship#1",
            "o-2/ship#1",
            "o-2/ship#2",
            "o-3/ship#1",
            "o-3/ship#2",
            "o-4/hold#1",
        ],
    )
    assert statuses == {
        "o-1": "succeeded",
        "o-1/ship#1": "succeeded",
        "o-2": "succeeded",
        "o-2/ship#1": "failed",
        "o-2/ship#2": "succeeded",
        "o-3": "failed",
        "o-3/ship#1": "failed",
        "o-3/ship#2": "failed",
        "o-4": "cancelled",
        "o-4/hold#1": "cancelled",
    }
    shown = run_ductor(settings, "result", "o-1")
    assert orjson.loads(shown.stdout) == {"sent": "shipped with dhl"}
    child_output = run_ductor(settings, "result", "o-2/ship#2")
    assert orjson.loads(child_output.stdout) == {"carrier": "dhl", "kg": 5}
    failed = run_ductor(settings, "result", "o-3")
    assert "step 'ship' failed after 2 attempt(s): child run o-3/ship#2 failed" in failed.stderr
    parent_view = run_ductor(settings, "inspect", "o-2").stdout
    assert "ship                 succeeded   attempt 2  child: o-2/ship#2" in parent_view
    child_view = run_ductor(settings, "inspect", "o-2/ship#2").stdout
    assert "parent     o-2 (step ship, attempt 2)" in child_view
    # Each child's end came back once, as its parent's step result.
    rows = pg.execute(
        "SELECT run_id, attempt, outcome FROM eec_step_result WHERE node_id = 'ship'"
        " ORDER BY run_id, attempt"
    ).fetchall()
    assert rows == [
        ("o-1", 1, "succeeded"),
        ("o-2", 1, "failed"),
        ("o-2", 2, "succeeded"),
        ("o-3", 1, "failed"),
        ("o-3", 2, "failed"),
    ]
    assert_transitions_applied_once(pg)
    orphan = {"name": "orphan", "kind": "workflow", "workflow": f"{child}-nowhere"}
    with pytest.raises(ValueError, match="which is not registered: register it first"):
        register_workflow(
            pg, parse_workflow({"name": f"{parent}-x", "version": 1, "steps": [orphan]})
        )


def test_a_child_takes_the_output_of_a_step_that_ends_in_the_commit_that_starts_it(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """A wait step's signal or a map's last item ends that step in the very commit that starts
    the child reading its output: the child's input is that output, not null (the statement
    that writes the step's result and the one that starts the child cannot see each other)."""
    tag = uuid.uuid4().hex[:6]
    echo, after_wait, after_map = f"echo-{tag}", f"after-wait-{tag}", f"after-map-{tag}"
    child = {"name": "child", "kind": "workflow", "workflow": echo}
    for raw in (
        {"name": echo, "version": 1, "steps": [{"name": "echo", "type": "echo"}], "output": "echo"},
        {
            "name": after_wait,
            "version": 1,
            "steps": [
                {"name": "go", "kind": "wait", "signal": "go"},
                {**child, "input_from": "go", "depends_on": ["go"]},
            ],
            "output": "child",
        },
        {
            "name": after_map,
            "version": 1,
            "steps": [
                {"name": "double", "kind": "map", "type": "double", "parallelism": 3},
                {**child, "input_from": "double", "depends_on": ["double"]},
            ],
            "output": "child",
        },
    ):
        register_workflow(pg, parse_workflow(raw))
    registry = StepRegistry()

    @registry.step("echo")
    def echo_step(ctx: StepContext) -> Any:
        return {"got": ctx.input}

    @registry.step("double")
    def double(ctx: StepContext) -> Any:
        return ctx.item * 2

    processor_thread(settings)
    worker = WorkerThread(settings, registry)
    try:
        for run_id, workflow, run_input in (
            ("w-1", after_wait, {}),
            ("m-1", after_map, [1, 2, 3, 4]),
        ):
            started = run_ductor(
                settings,
                "start",
                workflow,
                "--run-id",
                run_id,
                "--input",
                orjson.dumps(run_input).decode(),
            )
            assert started.returncode == 0, started.stderr
        wait_for(
            lambda: run_statuses(pg, ["w-1"]).get("w-1") == "running", 30, "w-1 to wait for go"
        )
        send_signal(settings, "w-1", "go", payload={"order": 17})
        wait_for(lambda: count_terminal(pg, ["w-1", "m-1"]) == 2, 60, "both runs to end")
    finally:
        worker.stop()
    assert run_statuses(pg, ["w-1", "m-1"]) == {"w-1": "succeeded", "m-1": "succeeded"}
    assert orjson.loads(run_ductor(settings, "result", "w-1").stdout) == {"got": {"order": 17}}
    assert orjson.loads(run_ductor(settings, "result", "m-1").stdout) == {"got": [2, 4, 6, 8]}
