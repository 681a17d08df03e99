"""Graceful shutdown of a busy `ductor process`: SIGTERM with hundreds of runs in flight ends
it with exit 0 within DUCTOR_SHUTDOWN_TIMEOUT_S, and nothing is lost or applied twice: a second
instance started afterwards finishes every run."""

from __future__ import annotations

import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from processor.cli.common import STOP_OVERRUN_S
from processor.client import start_runs
from processor.io.config.settings import Settings

from .audit import assert_results_applied, assert_transitions_applied_once
from .instances import WorkerThread
from .proxy import TcpProxy
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

RUNS = 800
BOUND_S = 10.0


def test_sigterm_while_busy_exits_cleanly_in_bound_and_loses_nothing(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    settings = replace(settings, shutdown_timeout_s=BOUND_S)
    run_ids = [f"term-{i}" for i in range(RUNS)]
    first = spawn(["process"], settings, "first")
    wait_for(lambda: first.owned_partitions() > 0, 60, "the first instance to own partitions")
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


def test_sigterm_with_the_database_hung_still_exits_within_the_bound(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    """The bound holds when Postgres stops answering mid-batch: the batch in flight is
    abandoned (its records are redelivered), the process exits 0 in time, and a second
    instance finishes every run with nothing applied twice."""
    pg = audit
    proxy = TcpProxy.for_dsn(settings.pg_dsn)
    dsn = proxy.dsn(settings.pg_dsn)
    settings = replace(settings, shutdown_timeout_s=BOUND_S)
    run_ids = [f"hung-{i}" for i in range(RUNS)]
    worker = WorkerThread(settings)  # the worker's own database path is not frozen
    try:
        child = spawn(["process"], replace(settings, pg_dsn=dsn), "hung")
        wait_for(lambda: child.owned_partitions() > 0, 60, "the instance to own partitions")
        start_runs(settings, "sample", run_ids)
        wait_for(lambda: count_terminal(pg, run_ids) >= 50, 120, "some runs to end", 0.02)
        proxy.freeze()
        wait_for(lambda: proxy.held > 0, 30, "a query to hang on the frozen database")
        started = time.monotonic()
        code = child.terminate(timeout=BOUND_S + 10)
        elapsed = time.monotonic() - started
        proxy.close()  # the hung connections drop; Postgres rolls back what they held
        assert code == 0, f"exit code {code} after {elapsed:.1f} s; log in {child.log_path}"
        assert elapsed < BOUND_S + 5, f"shutdown took {elapsed:.1f} s (bound {BOUND_S:.0f} s)"

        second = spawn(["process"], settings, "second")
        wait_for(lambda: count_terminal(pg, run_ids) == RUNS, 180, f"all {RUNS} runs to end", 0.5)
        assert second.terminate() == 0
    finally:
        proxy.close()
        worker.stop()
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_transitions_applied_once(pg)


def test_sigterm_while_starting_is_a_clean_stop(settings: Settings, spawn: Any) -> None:
    """A SIGTERM that arrives while `ductor process` builds its clients (forced at that point
    by the `starting=term` fault) stops it as one that arrives later does: exit 0, its stop
    logged, never the default action's death by signal."""
    starting = spawn(["process"], replace(settings, test_faults="starting=term"), "starting")
    wait_for(lambda: starting.proc.poll() is not None, 60, "the instance to stop")
    assert starting.terminate() == 0, f"log in {starting.log_path}"
    messages = [line.get("msg") for line in starting.log_lines()]
    assert "processor stopped" in messages


@pytest.mark.parametrize("entry", ["python -m processor", "ductor script"])
@pytest.mark.parametrize("command", [["process"], ["worker"]])
def test_sigterm_while_the_modules_load_is_a_clean_stop(
    settings: Settings, spawn: Any, command: list[str], entry: str, tmp_path: Path
) -> None:
    """A SIGTERM that arrives while `python -m processor`, or the installed `ductor` script,
    still loads its modules (forced by the `loading=term` fault, before any of them loaded; a
    supervisor's stop that came a second after the start, in the chaos run) stops the service
    cleanly: exit 0, never the death by signal (-15) that a missing handler means."""
    cwd = tmp_path if entry == "ductor script" else None
    loading = spawn(command, replace(settings, test_faults="loading=term"), "loading", cwd=cwd)
    wait_for(lambda: loading.proc.poll() is not None, 60, "the service to stop")
    assert loading.terminate() == 0, f"log in {loading.log_path}"


@pytest.mark.parametrize("command", [["process"], ["worker"]])
def test_a_stop_that_hangs_is_ended_past_its_bound_and_says_where(
    settings: Settings, spawn: Any, command: list[str]
) -> None:
    """A service whose stop never ends (forced by `stopped=hang`: the teardown after a clean
    shutdown blocks, as a client's destructor that waits for a broker that is gone) is ended
    STOP_OVERRUN_S past its shutdown bound: its threads' stacks in its log, the hung frame
    among them, then SIGALRM (exit 142 in a shell). A supervisor's rolling deploy is never
    held by one process."""
    bound_s = 2.0
    settings = replace(settings, shutdown_timeout_s=bound_s, test_faults="stopped=hang")
    child = spawn(command, settings, "hang")
    wait_for(lambda: child.owned_partitions() > 0, 60, "the service to own partitions")
    started = time.monotonic()
    child.proc.send_signal(signal.SIGTERM)
    # Its native stacks (what a test takes of a child that does not stop) name the hung frame
    # too, once it hangs (within its bound; its watchdog ends it STOP_OVERRUN_S later).
    dumps: list[str] = []

    def hung() -> bool:
        dumps.append(child.native_stacks())
        return "faults.py" in dumps[-1]

    wait_for(hung, bound_s + STOP_OVERRUN_S - 2, "its native stacks to show the hung frame")
    code = child.terminate(timeout=bound_s + STOP_OVERRUN_S + 20)
    elapsed = time.monotonic() - started
    assert code == -signal.SIGALRM, f"exit code {code}; log in {child.log_path}"
    assert elapsed >= bound_s + STOP_OVERRUN_S - 0.5, elapsed
    log = child.log_path.read_text()
    assert 'stopped"' in log  # its shutdown ran to its end; the teardown hung
    stacks = child.stacks()
    assert "Timeout (0:00:10)!" in log, log[-2000:]
    assert "faults.py" in stacks and "in __call__" in stacks, stacks  # the hung frame, named
