"""Graceful shutdown of a busy `ductor process`: SIGTERM with hundreds of runs in flight ends
it with exit 0 within DUCTOR_SHUTDOWN_TIMEOUT_S, and nothing is lost or applied twice: a second
instance started afterwards finishes every run."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.cli import start_runs
from processor.config import Settings

from .audit import assert_results_applied, assert_transitions_applied_once
from .conftest import Spawned, WorkerThread, count_terminal, run_statuses, wait_for

pytestmark = pytest.mark.integration

RUNS = 800
BOUND_S = 10.0


def _owned_partitions(child: Spawned) -> int:
    owned = 0
    for line in child.log_lines():
        if line.get("msg") == "partitions assigned":
            owned += int(line["count"])
        elif line.get("msg") == "partitions released":
            owned -= int(line["count"])
    return owned


def test_sigterm_while_busy_exits_cleanly_in_bound_and_loses_nothing(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    settings = replace(settings, shutdown_timeout_s=BOUND_S)
    run_ids = [f"term-{i}" for i in range(RUNS)]
    first = spawn(["process"], settings, "first")
    wait_for(lambda: _owned_partitions(first) > 0, 60, "the first instance to own partitions")
    worker = WorkerThread(settings)
    try:
        start_runs(settings, "sample", run_ids)
        wait_for(lambda: count_terminal(pg, run_ids) >= 50, 120, "some runs to end", 0.02)
        in_flight = RUNS - count_terminal(pg, run_ids)
        started = time.monotonic()
        code = first.terminate(timeout=BOUND_S + 30)
        elapsed = time.monotonic() - started
        assert in_flight >= 200, f"only {in_flight} runs were in flight at SIGTERM"
        assert code == 0, f"exit code {code}; log in {first.log_path}"
        assert elapsed < BOUND_S + 5, f"shutdown took {elapsed:.1f} s (bound {BOUND_S:.0f} s)"
        messages = [line.get("msg") for line in first.log_lines()]
        assert "processor stopped" in messages  # the clean path ran to its end
        errors = [line for line in first.log_lines() if line.get("level") == "ERROR"]
        assert not errors, errors[:3]
        left = RUNS - count_terminal(pg, run_ids)
        assert left > 0, "every run ended before the shutdown: nothing was in flight"

        second = spawn(["process"], settings, "second")
        wait_for(lambda: count_terminal(pg, run_ids) == RUNS, 180, f"all {RUNS} runs to end", 0.5)
        assert second.terminate() == 0
    finally:
        worker.stop()
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert assert_transitions_applied_once(pg) >= RUNS * 5
    assert sum(second.final_stats()["errors"].values()) == 0
