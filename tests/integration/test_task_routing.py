"""A task reaches a worker that has its function, on the real services: two workers with
different apps on one queue share its partitions, and a task that comes to the worker without
its function is handed to the one with it (worker/handback.py), so every run succeeds and no
attempt fails for "no step function"; `runs retry` of runs that failed for want of a worker
succeeds once one runs. `workflows register` and `start` warn (stderr, exit 0) about a step
type no live worker serves, and `ductor workers` lists what each serves."""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from processor.client import start_runs
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow
from processor.io.telemetry.setup import Telemetry
from processor.worker import StepContext, StepRegistry

from .children import run_ductor
from .instances import ProcessorThread, WorkerThread
from .runs import count_terminal, run_statuses
from .telemetry_capture import metric_values
from .waiting import wait_for

pytestmark = pytest.mark.integration

# Two apps, as two teams deploy them on the default queue.
ORDERS = StepRegistry()
INVOICES = StepRegistry()


@ORDERS.step("load")
def load(ctx: StepContext) -> Any:
    return {"order": ctx.run_id}


@ORDERS.step("price")
def price(ctx: StepContext) -> Any:
    return {"priced": ctx.deps["load"]["order"]}


@INVOICES.step("bill")
def bill(ctx: StepContext) -> Any:
    return {"billed": ctx.run_id}


def _orders_workflow() -> dict[str, Any]:
    once = {"max_attempts": 1}  # a failure for want of a worker ends the run at once
    return {
        "name": "routed_orders",
        "version": 1,
        "steps": [
            {"name": "load", "type": "load", "retry": once},
            {"name": "price", "type": "price", "depends_on": ["load"], "retry": once},
        ],
    }


INVOICES_WORKFLOW = {
    "name": "routed_invoices",
    "version": 1,
    "steps": [{"name": "bill", "type": "bill", "retry": {"max_attempts": 1}}],
}


def _failed_attempts(pg: psycopg.Connection[Any], prefix: str) -> list[str]:
    rows = pg.execute(
        "SELECT error FROM eec_step_result WHERE starts_with(run_id, %s) AND outcome = 'failed'",
        (prefix,),
    ).fetchall()
    return [r[0] for r in rows]


def test_two_apps_on_one_queue_every_run_succeeds(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="ductor.worker")
    register_workflow(pg, parse_workflow(_orders_workflow()))
    register_workflow(pg, parse_workflow(INVOICES_WORKFLOW))
    processor: ProcessorThread = processor_thread(settings)
    readers = {"orders": InMemoryMetricReader(), "invoices": InMemoryMetricReader()}
    telemetry = {
        app: Telemetry.build(None, [], [r], settings.group_id) for app, r in readers.items()
    }
    orders = WorkerThread(settings, ORDERS, threads=4, telemetry=telemetry["orders"])
    invoices = WorkerThread(settings, INVOICES, threads=4, telemetry=telemetry["invoices"])
    try:
        wait_for(
            lambda: orders.worker.assigned > 0 and invoices.worker.assigned > 0,
            60,
            "both workers to hold partitions of the queue",
        )
        prefix = f"routed-{uuid.uuid4().hex[:6]}-"
        order_ids = [f"{prefix}order-{i}" for i in range(10)]
        invoice_ids = [f"{prefix}invoice-{i}" for i in range(10)]
        start_runs(settings, "routed_orders", order_ids)
        start_runs(settings, "routed_invoices", invoice_ids)
        every = order_ids + invoice_ids
        wait_for(lambda: count_terminal(pg, every) == len(every), 90, "every run to end")
        assert set(run_statuses(pg, every).values()) == {"succeeded"}
        assert _failed_attempts(pg, prefix) == []  # not one attempt failed for "no function"
        handed = orders.worker.stats.handed_back + invoices.worker.stats.handed_back
        assert sum(handed.values()) > 0  # (30 tasks over two workers' partitions: some were)
        assert set(handed) <= {"load", "price", "bill"}
        # The metric counts them by step type (ductor_worker_handed_back_total).
        for app, worker in (("orders", orders), ("invoices", invoices)):
            counted = metric_values(readers[app], "ductor.worker.handed_back")
            expected = worker.worker.stats.handed_back
            assert counted == {(("ductor.step_type", t),): n for t, n in expected.items()}
        said = [r.getMessage() for r in caplog.records if "handed back" in r.getMessage()]
        assert said and all("step type '" in line for line in said)
        assert orders.worker.executed == 20 and invoices.worker.executed == 10
    finally:
        for worker in (orders, invoices):
            worker.stop()
    assert processor.alive


def test_retry_reaches_a_worker_with_the_function_and_the_commands_warn_until_one_runs(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    tmp_path: Path,
) -> None:
    register_workflow(pg, parse_workflow(INVOICES_WORKFLOW))
    processor_thread(settings)
    invoices = WorkerThread(settings, INVOICES, threads=4)
    orders: WorkerThread | None = None
    try:
        wait_for(lambda: invoices.worker.assigned > 0, 60, "the invoices worker's partitions")
        # Registered and started while only the invoices worker runs: both commands warn, and
        # their runs fail for want of a worker with the function.
        definition = tmp_path / "orders.json"
        definition.write_bytes(orjson.dumps(_orders_workflow()))
        registered = run_ductor(settings, "workflows", "register", str(definition))
        assert registered.returncode == 0, registered.stderr
        for step_type in ("load", "price"):
            assert (
                f"warning: workflow routed_orders v1: no live worker has step type"
                f" {step_type!r} on queue 'default'"
            ) in registered.stderr
        started = run_ductor(settings, "start", "routed_orders", "--run-id", "warned")
        assert started.returncode == 0, started.stderr
        assert "no live worker has step type 'load'" in started.stderr
        ids = [f"unserved-{i}" for i in range(6)]
        start_runs(settings, "routed_orders", ids)
        ids.append("warned")
        wait_for(lambda: count_terminal(pg, ids) == len(ids), 60, "the runs to fail")
        assert set(run_statuses(pg, ids).values()) == {"failed"}

        # A worker with the function runs: no warning, and the failed runs retried succeed.
        orders = WorkerThread(settings, ORDERS, threads=4)
        wait_for(lambda: orders is not None and orders.worker.assigned > 0, 60, "its partitions")
        wait_for(
            lambda: "no live worker" not in run_ductor(settings, "start", "routed_orders").stderr,
            10,
            "the registry to show the orders worker",
        )
        retried = run_ductor(settings, "runs", "retry", "--workflow", "routed_orders")
        assert retried.returncode == 0, retried.stderr + retried.stdout
        wait_for(
            lambda: set(run_statuses(pg, ids).values()) == {"succeeded"},
            60,
            "every retried run to succeed",
        )

        # `ductor workers`: both, with their queues, step types, concurrency and version.
        listed = run_ductor(settings, "workers", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        by_id = {w["instance_id"]: w for w in map(orjson.loads, listed.stdout.splitlines())}
        mine = {orders.worker.instance_id, invoices.worker.instance_id}
        assert mine <= set(by_id)
        order_row = by_id[orders.worker.instance_id]
        assert order_row["queues"] == ["default"]
        assert order_row["step_types"] == ["load", "price"]
        assert order_row["concurrency"] == 4
        assert order_row["version"]
        assert by_id[invoices.worker.instance_id]["step_types"] == ["bill"]
        assert sum(len(p) for w in mine for p in by_id[w]["partitions"].values()) == 9
        table = run_ductor(settings, "workers")
        assert table.returncode == 0, table.stderr
        header, *rows = table.stdout.splitlines()
        assert header.split()[:3] == ["INSTANCE", "NAME", "HOST:PID"]
        [row] = [r for r in rows if r.startswith(orders.worker.instance_id)]
        assert row.endswith("load, price") and " default " in row
    finally:
        invoices.stop()
        if orders is not None:
            orders.stop()
