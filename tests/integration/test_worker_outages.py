"""The step worker rides through outages of its dependencies instead of exiting: Postgres
restarted in immediate mode, the broker down for longer than a flush would wait. Every run
still succeeds, no step result is lost, and each outage is logged once when it starts and once
when it ends. Run against the services infra/local.py runs (they are restarted)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka.admin import AdminClient

from infra.local import StopMode
from processor.client import start_runs
from processor.core.workflow import WorkflowDef, parse_workflow
from processor.io.config import Settings
from processor.io.runs_admin import register_workflow
from processor.worker import StepContext, StepRegistry, sample_registry

from .audit import assert_results_applied, assert_transitions_applied_once, timed_out_attempts
from .conftest import SAMPLE, WorkerThread, count_terminal, run_statuses, wait_for
from .restarts import LocalInfra

pytestmark = pytest.mark.integration


def _outage_lines(lines: list[dict[str, Any]], dependency: str, phase: str) -> list[Any]:
    return [
        line
        for line in lines
        if line.get("dependency") == dependency and line.get("outage") == phase
    ]


def test_the_worker_and_the_processor_ride_through_an_immediate_postgres_restart(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any, local_infra: LocalInfra
) -> None:
    # Enough runs that both the processor and the worker still have most of their work ahead
    # when the restart comes (600 could all but end between two looks at them). The sample
    # workflow with deadlines no restart outlasts (a loaded restart in immediate mode replays
    # its WAL for seconds): an attempt that times out here lost its result.
    register_workflow(audit, _patient_sample())
    run_ids = [f"pg-restart-{i}" for i in range(3000)]
    processor = spawn(["process"], settings, "process")
    worker = spawn(["worker", "--threads", "8"], settings, "worker")
    start_runs(settings, "patient-sample", run_ids)
    wait_for(lambda: count_terminal(audit, run_ids) >= 30, 120, "30 runs to end first", 0.05)
    # The restart must come while runs are in flight (it comes right after the 30th ends).
    assert count_terminal(audit, run_ids) < len(run_ids) / 2, "the restart came too late"

    down_s = local_infra.restart_postgres(StopMode.IMMEDIATE)

    with psycopg.connect(settings.pg_dsn, autocommit=True) as pg:
        wait_for(
            lambda: (
                worker.running()
                and processor.running()
                and count_terminal(pg, run_ids) == len(run_ids)
            ),
            180,
            "every run to end after the restart",
            0.5,
        )
        assert worker.terminate() == 0
        assert processor.terminate() == 0
        assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
        assert_results_applied(pg, run_ids)
        assert_transitions_applied_once(pg)
        # An attempt failed by its deadline: a result recorded and then lost would show as one
        # (nothing else re-wakes a dispatched step), and the sample steps never outlive theirs.
        assert not timed_out_attempts(pg), "a step result was lost"

    lines = worker.log_lines()
    started = _outage_lines(lines, "postgres", "started")
    ended = _outage_lines(lines, "postgres", "ended")
    assert len(started) == 1 and len(ended) == 1, (started, ended)
    stopped = next(line for line in lines if line.get("msg") == "worker stopped")
    assert stopped["outages"] == {"postgres": 1, "kafka": 0}
    # The processor too: one line when it saw the outage start, one when it ended (never
    # one per batch or per sweep), and no error of any other kind.
    lines = processor.log_lines()
    seen = _outage_lines(lines, "postgres", "started")
    assert len(seen) <= 1 and len(_outage_lines(lines, "postgres", "ended")) == len(seen)
    others = [line for line in lines if line.get("level") == "ERROR" and "outage" not in line]
    assert not others, others[:3]
    print(
        f"postgres down {down_s:.1f} s (restart, immediate); the worker recorded results "
        f"again {ended[0]['outage_s']:.1f} s after its first failure, "
        f"{ended[0]['failures']} tries failed"
    )


def _patient_sample() -> WorkflowDef:
    raw = orjson.loads(SAMPLE.read_bytes())
    for step in raw["steps"]:
        step["timeout_ms"] = 120_000
    return parse_workflow({**raw, "name": "patient-sample"})


def _owners(settings: Settings) -> int:
    """Members of the workers' group that own partitions, as the broker describes the group."""
    group = settings.worker_group_id
    admin = AdminClient(settings.kafka_common())
    described = admin.describe_consumer_groups([group])[group].result(timeout=10)
    return sum(1 for m in described.members if m.assignment.topic_partitions)


def _gated_workflow() -> WorkflowDef:
    # Long deadlines: the outage must not time out attempts the worker holds meanwhile.
    return parse_workflow(
        {
            "name": "gated",
            "version": 1,
            "steps": [
                {"name": "held", "type": "gate", "timeout_ms": 300_000},
                {"name": "after", "type": "fast", "depends_on": ["held"], "timeout_ms": 300_000},
            ],
        }
    )


def _gated_registry(gate: threading.Event, entered: threading.Event) -> StepRegistry:
    """The sample steps and `gate`, which waits until the test opens the gate: so the test
    knows the worker holds tasks when it takes the broker away."""
    registry = sample_registry()

    @registry.step("gate")
    def gated(ctx: StepContext) -> Any:
        entered.set()
        if not gate.wait(120):
            raise TimeoutError("the test never opened the gate")
        return {"gated": ctx.attempt}

    return registry


def test_the_worker_rides_through_a_broker_outage_longer_than_a_flush(
    settings: Settings,
    audit: psycopg.Connection[Any],
    spawn: Any,
    local_infra: LocalInfra,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two workers hold tasks when the broker is killed; they record the results and wait for
    their wakeups to be acknowledged. One is stopped mid-outage (it stops promptly, and its
    tasks are redelivered); the other keeps waiting for longer than the 30 s flush after which
    the worker used to exit, and goes on when the broker is back on its data."""
    caplog.set_level(logging.INFO, logger="ductor.worker")
    register_workflow(audit, _gated_workflow())
    run_ids = [f"broker-{uuid.uuid4().hex[:6]}-{i}" for i in range(30)]
    gate = threading.Event()
    entered = [threading.Event(), threading.Event()]
    processor = spawn(["process"], settings, "process")
    rider, quitter = (WorkerThread(settings, _gated_registry(gate, e)) for e in entered)
    try:
        # A worker blocked in a gated batch cannot hand a partition over, so the group settles
        # first: then each worker gets tasks of its own.
        wait_for(lambda: _owners(settings) == 2, 60, "both workers to own step partitions")
        start_runs(settings, "gated", run_ids)
        wait_for(lambda: all(e.is_set() for e in entered), 60, "both workers to hold tasks")

        local_infra.kill_kafka()
        gate.set()
        wait_for(
            lambda: rider.worker.outages["kafka"].active and quitter.worker.outages["kafka"].active,
            60,
            "both workers to report the broker outage",
        )
        stop_s = quitter.stop()
        assert not quitter.alive and quitter.error is None
        wait_for(
            lambda: rider.alive and rider.worker.outages["kafka"].lasted_s > 35,
            60,
            "the rider to wait for acknowledgements longer than the old 30 s flush",
            0.5,
        )
        back_s = local_infra.start_kafka()
        back_at = time.monotonic()
        wait_for(lambda: not rider.worker.outages["kafka"].active, 120, "the rider to go on")
        recovered_s = time.monotonic() - back_at
        wait_for(
            lambda: rider.alive and count_terminal(audit, run_ids) == len(run_ids),
            180,
            "every run to end after the broker came back",
            0.5,
        )
        outage = rider.worker.outages["kafka"]
        assert rider.alive and rider.error is None and not outage.active
    finally:
        gate.set()
        rider.stop()
        quitter.stop()
    assert processor.running() and processor.terminate() == 0
    assert set(run_statuses(audit, run_ids).values()) == {"succeeded"}
    assert_results_applied(audit, run_ids)
    assert_transitions_applied_once(audit)
    assert not timed_out_attempts(audit)
    assert outage.count == 1
    lines = [r.__dict__ for r in caplog.records if r.name == "ductor.worker"]
    assert len(_outage_lines(lines, "kafka", "started")) == 2  # one per worker
    assert len(_outage_lines(lines, "kafka", "ended")) == 1  # the quitter stopped mid-outage
    assert not _outage_lines(lines, "postgres", "started")
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    print(
        f"a worker stopped mid-outage in {stop_s:.1f} s; the broker answered {back_s:.1f} s "
        f"after its start on the same data and the rider's wakeups were acknowledged "
        f"{recovered_s:.1f} s later; error lines: {errors}"
    )
