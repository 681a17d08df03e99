"""Heartbeats that carry progress, judged by the coordinator too (core/tick.py, rule 4), on the
real services: a step beats with its progress (``ctx.heartbeat(details)``), its worker is
SIGKILLed in the middle of it, and its attempt fails for its heartbeat within seconds (its
heartbeat timeout is 2 s, its timeout a minute: before, the attempt waited the whole minute,
as nothing was left to notice its silence); `ductor inspect` shows the last details it
recorded, and the retry, run by the next worker, reads them as ``ctx.last_heartbeat``."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from processor.client import inspect_run, start_runs
from processor.core.routing import TIERS
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from . import counted_steps
from .children import Spawned
from .runs import count_terminal, run_statuses, step_attempts
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"


def _worker(spawn: Any, settings: Settings, name: str, alone: bool = True) -> Spawned:
    worker: Spawned = spawn(["worker", "--app", APP], settings, name)
    every = len(TIERS) * settings.step_partitions if alone else 1
    wait_for(lambda: worker.owned_partitions() >= every, 60, f"{name} to own step partitions")
    return worker


def _recorded_details(pg: psycopg.Connection[Any], run_id: str) -> Any:
    row = pg.execute(
        "SELECT beat_details FROM eec_step_attempt WHERE run_id = %s AND attempt = 1", (run_id,)
    ).fetchone()
    return None if row is None else row[0]


def _first_error(audit: psycopg.Connection[Any], run_id: str) -> str | None:
    """Why the step's first attempt failed, as the write that ended it said (the audit
    trail: the run's state holds it only until the retry is dispatched)."""
    row = audit.execute(
        "SELECT new_nodes -> 'only' ->> 'error' FROM test_run_audit WHERE run_id = %s"
        " AND old_nodes -> 'only' ->> 'status' = 'dispatched'"
        " AND (old_nodes -> 'only' ->> 'attempt')::int = 1"
        " AND new_nodes -> 'only' ->> 'status' IN ('retry_wait', 'failed') ORDER BY id LIMIT 1",
        (run_id,),
    ).fetchone()
    return None if row is None else row[0]


def test_a_worker_killed_mid_step_fails_the_attempt_for_its_heartbeat_and_the_retry_goes_on(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    pg = audit
    counted_steps.install(pg)
    name = f"beats-{uuid.uuid4().hex[:6]}"
    step = {
        "name": "only",
        "type": "counted",
        "timeout_ms": 60_000,
        "heartbeat_timeout_ms": 2_000,
        "retry": {"max_attempts": 3, "backoff_ms": 50},
    }
    register_workflow(pg, parse_workflow({"name": name, "version": 1, "steps": [step]}))
    spawn(["process"], settings, "process")
    first = _worker(spawn, settings, "worker-0")
    run_id = f"{name}-run"
    # Its first attempt works for 30 s, beating every 200 ms with how far it got.
    start_runs(settings, name, [run_id], {"sleep_on": {"1": 30_000}, "beat_every_ms": 200})
    wait_for(
        lambda: first.running() and (_recorded_details(pg, run_id) or {}).get("beats", 0) >= 3,
        30,
        "the step's heartbeats to be recorded with their details",
    )
    first.kill()
    killed = time.monotonic()
    # No other worker: only the coordinator can notice the silence.
    wait_for(
        lambda: "heartbeat" in (_first_error(pg, run_id) or ""),
        30,
        "the attempt to fail for its heartbeat",
    )
    took_s = time.monotonic() - killed
    assert _first_error(pg, run_id) == (
        "attempt 1 recorded no heartbeat for 2000 ms (heartbeat_timeout_ms)"
    )
    last = _recorded_details(pg, run_id)
    shown = next(a for a in inspect_run(settings, run_id)["attempts"] if a["attempt"] == 1)
    assert shown["heartbeat"]["details"] == last and last["beats"] >= 3
    # The next worker runs the retry, which goes on from the last details recorded.
    second = _worker(spawn, settings, "worker-1")
    wait_for(lambda: second.running() and count_terminal(pg, [run_id]) == 1, 60, "the run to end")
    assert run_statuses(pg, [run_id]) == {run_id: "succeeded"}
    assert step_attempts(pg, run_id) == {"only": [(2, "succeeded")]}
    row = pg.execute(
        "SELECT output FROM eec_step_result WHERE run_id = %s AND attempt = 2", (run_id,)
    ).fetchone()
    assert row is not None and row[0]["attempt"] == 2 and row[0]["last_heartbeat"] == last
    assert counted_steps.executions(pg, run_id) == {(run_id, "only", 1): 1, (run_id, "only", 2): 1}
    print(f"the attempt failed for its heartbeat {took_s:.1f} s after its worker was killed")
    assert second.terminate() == 0
