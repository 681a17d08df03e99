"""Signals that carry data and steps that wait for them, on the real services: a run waits at
its approval step until `ductor signal RUN approved --payload JSON` comes (through the
database, or through Kafka), the step after it reads the payload as the approval's output,
and the run's declared output holds it; a signal sent before the run reached its wait ends it
at once; a wait that is the last step ends the run with the payload as its output; a wait
nobody answers times out and fails the run; the same signal twice is applied once."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import psycopg
import pytest

from processor import StepContext, StepRegistry
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
        return {"total": 4634}

    @registry.step("confirm_it")
    def confirm_it(ctx: StepContext) -> dict[str, Any]:
        return {"confirmed_by": ctx.deps["approve"]["by"], "total": ctx.deps["price"]["total"]}

    return registry


def _workflows(pg: psycopg.Connection[Any]) -> tuple[str, str, str]:
    tag = uuid.uuid4().hex[:6]
    approval, last, lapsing = f"approval-{tag}", f"last-{tag}", f"lapsing-{tag}"
    steps = [
        {"name": "price", "type": "price_it"},
        {"name": "approve", "kind": "wait", "signal": "approved", "depends_on": ["price"]},
        {"name": "confirm", "type": "confirm_it", "depends_on": ["approve", "price"]},
    ]
    output = {"approval": "approve", "confirmation": "confirm"}
    for raw in (
        {"name": approval, "version": 1, "steps": steps, "output": output},
        {
            "name": last,
            "version": 1,
            "steps": [{"name": "go", "kind": "wait", "signal": "go"}],
            "output": "go",
        },
        {
            "name": lapsing,
            "version": 1,
            "steps": [{"name": "w", "kind": "wait", "signal": "never", "timeout_ms": 1500}],
        },
    ):
        register_workflow(pg, parse_workflow(raw))
    return approval, last, lapsing


def _node(pg: psycopg.Connection[Any], run_id: str, node: str) -> str | None:
    row = pg.execute(
        "SELECT node_states -> %s ->> 'status' FROM eec_workflow_run WHERE run_id = %s",
        (node, run_id),
    ).fetchone()
    return None if row is None else row[0]


def _output(settings: Settings, run_id: str) -> Any:
    shown = run_ductor(settings, "result", run_id, "--wait", "60")
    assert shown.returncode == 0, shown.stderr
    return orjson.loads(shown.stdout)


def test_a_run_waits_for_its_signal_and_the_payload_flows_on(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    approval, last, lapsing = _workflows(pg)
    processor_thread(settings)
    worker = WorkerThread(settings, _registry())
    try:
        for run_id, workflow in (
            ("order-a", approval),
            ("order-b", approval),
            ("order-k", approval),
            ("ends", last),
            ("lapses", lapsing),
        ):
            started = run_ductor(settings, "start", workflow, "--run-id", run_id)
            assert started.returncode == 0, started.stderr
        # order-b is approved at once: before it reached its wait (or just as it did).
        early = run_ductor(
            settings, "signal", "order-b", "approved", "--payload", '{"by": "grace"}'
        )
        assert early.returncode == 0 and early.stdout.startswith("signal approved sent")
        wait_for(lambda: _node(pg, "order-a", "approve") == "dispatched", 60, "order-a waiting")
        assert run_statuses(pg, ["order-a"]) == {"order-a": "running"}
        # Another signal changes nothing; the one it waits for, sent twice, is applied once.
        run_ductor(settings, "signal", "order-a", "rejected", "--payload", '{"by": "eve"}')
        for _ in range(2):
            sent = run_ductor(
                settings,
                "signal",
                "order-a",
                "approved",
                "--payload",
                '{"by": "ada"}',
                "--signal-id",
                "approval-1",
            )
            assert sent.returncode == 0, sent.stderr
        assert "was already recorded" in sent.stdout
        # Through Kafka alone, as an upstream producer would.
        wait_for(lambda: _node(pg, "order-k", "approve") == "dispatched", 60, "order-k waiting")
        via = run_ductor(
            settings,
            "signal",
            "order-k",
            "approved",
            "--payload",
            '{"by": "kafka"}',
            "--via",
            "kafka",
        )
        assert via.returncode == 0, via.stderr
        run_ductor(settings, "signal", "ends", "go", "--payload", '{"went": true}')
        ended = ["order-a", "order-b", "order-k", "ends", "lapses"]
        wait_for(lambda: count_terminal(pg, ended) == len(ended), 60, "every run to end")
    finally:
        worker.stop()
    for run_id, by in (("order-a", "ada"), ("order-b", "grace"), ("order-k", "kafka")):
        assert _output(settings, run_id) == {
            "approval": {"by": by},
            "confirmation": {"confirmed_by": by, "total": 4634},
        }
    assert _output(settings, "ends") == {"went": True}
    statuses = run_statuses(pg, ended)
    assert statuses.pop("lapses") == "failed"
    assert set(statuses.values()) == {"succeeded"}
    failed = run_ductor(settings, "result", "lapses")
    assert "step 'w' failed after 1 attempt(s): attempt 1 timed out" in failed.stderr
    # Each wait's end is recorded once, as its step's result.
    rows = pg.execute(
        "SELECT run_id, attempt, output FROM eec_step_result WHERE node_id IN ('approve', 'go')"
        " ORDER BY run_id"
    ).fetchall()
    assert [(r[0], r[1]) for r in rows] == [
        ("ends", 1),
        ("order-a", 1),
        ("order-b", 1),
        ("order-k", 1),
    ]
    assert_transitions_applied_once(pg)
    refused = run_ductor(settings, "signal", "order-a", "no way")
    assert refused.returncode == 2 and "signal name 'no way'" in refused.stderr
