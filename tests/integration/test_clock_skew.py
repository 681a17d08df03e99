"""A processor whose clock runs 8 s ahead takes over runs another processor dispatched: it
judges their deadlines and holds their retry timers by Postgres's clock, not its own, so no
attempt times out early and no retry comes early (io/postgres/db_clock.py). The clock is moved in
the process (``DUCTOR_TEST_CLOCK_AHEAD_MS``, io/runtime/faults.py says why not with libfaketime)."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from . import counted_steps
from .children import Spawned
from .runs import count_terminal, run_statuses, step_attempts
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"
RUNS = 40
BACKOFF_MS = 3000
AHEAD_MS = 8000


def _joined(child: Spawned) -> None:
    wait_for(lambda: child.owned_partitions() > 0, 60, f"{child.log_path.stem} to join")


def test_a_processor_8_s_ahead_times_out_no_attempt_early(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    """Each run has a fast step (1.5 s) and a slow one (6 s) side by side, deadlines 9 s,
    one attempt each. Two processors, one of them 8 s ahead, share the runs; the other one
    stops right after dispatching its share, and the one ahead takes its partitions over and
    ticks the fast steps' results while the slow steps still run: by its own clock their
    deadlines have passed; by Postgres's they have seconds to go. A third step fails its first
    attempt and is retried after a 3 s backoff, its timer held by the processor ahead. Every
    run succeeds, the fast and slow steps on their first attempt, none timed out, and no
    retry came before its backoff."""
    counted_steps.install(pg)
    wf = parse_workflow(
        {
            "name": "skewed",
            "version": 1,
            "steps": [
                {"name": "fast", "type": "counted", "timeout_ms": 9000},
                {"name": "slow", "type": "counted", "timeout_ms": 9000},
                {
                    "name": "flaky",
                    "type": "counted",
                    "timeout_ms": 9000,
                    "depends_on": ["fast"],
                    "retry": {"max_attempts": 2, "backoff_ms": BACKOFF_MS},
                },
            ],
        }
    )
    register_workflow(pg, wf)
    run_ids = [f"skew-{uuid.uuid4().hex[:6]}-{i}" for i in range(RUNS)]
    on_time = spawn(["process"], settings, "process")
    ahead = spawn(["process"], replace(settings, test_clock_ahead_ms=AHEAD_MS), "process-ahead")
    # A slot for every step at once: no step waits for one past its deadline.
    worker = spawn(["worker", "--app", APP, "--concurrency", str(3 * RUNS)], settings, "worker")
    for child in (on_time, ahead, worker):
        _joined(child)
    by_node = {
        "fast": {"sleep_ms": 1500},
        "slow": {"sleep_ms": 6000},
        "flaky": {"fail_on": [1]},
    }
    start_runs(settings, wf.name, run_ids, {"by_node": by_node})
    wait_for(
        lambda: set(run_statuses(pg, run_ids).values()) == {"running"},
        30,
        "both steps of every run to be dispatched",
    )
    assert on_time.terminate() == 0  # its share of the runs goes to the processor ahead
    wait_for(lambda: count_terminal(pg, run_ids) == RUNS, 90, "every run to end")
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    for run_id in run_ids:
        attempts = step_attempts(pg, run_id)
        assert attempts["fast"] == [(1, "succeeded")] and attempts["slow"] == [(1, "succeeded")]
        assert attempts["flaky"] == [(1, "failed"), (2, "succeeded")], run_id
    counts = counted_steps.executions(pg, "skew-")
    assert counted_steps.extra_executions(counts) == 0
    # The retry timers were held for their backoff by Postgres's clock, not released 8 s early.
    gaps = pg.execute(
        "SELECT min(b.started_at - a.started_at) FROM test_step_execution a"
        " JOIN test_step_execution b ON b.run_id = a.run_id AND b.node = a.node"
        " WHERE a.node = 'flaky' AND a.attempt = 1 AND b.attempt = 2 AND a.run_id = ANY(%s)",
        (run_ids,),
    ).fetchone()
    assert gaps is not None and gaps[0].total_seconds() * 1000 >= BACKOFF_MS
