"""A step's three timeouts on the real services (core/tick.py, rule 4; docs/usage.md,
"Timeouts"): ``timeout_ms`` counts from the moment a worker starts an attempt, so time in a
queue (a worker restarted under its supervisor, a backlog behind a slow worker) fails no
attempt; ``schedule_to_start_ms`` is what bounds that time, and fails the steps that wait
longer, with its reason. Steps of the tests' own module (counted_steps.py) count each
execution."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.core.routing import TIERS
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from . import counted_steps
from .children import Spawned
from .runs import count_terminal, run_statuses, step_attempts
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"


def _one_step(name: str, timeout_ms: int, attempts: int = 1, **bounds: int) -> WorkflowDef:
    step = {
        "name": "only",
        "type": "counted",
        "timeout_ms": timeout_ms,
        "retry": {"max_attempts": attempts, "backoff_ms": 50},
        **bounds,
    }
    return parse_workflow({"name": name, "version": 1, "steps": [step]})


def _ids(prefix: str, count: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"{prefix}-{tag}-{i}" for i in range(count)]


def _worker(spawn: Any, settings: Settings, name: str, *flags: str) -> Spawned:
    """A worker alone in its group, once it owns every steps partition of every tier."""
    worker: Spawned = spawn(["worker", "--app", APP, *flags], settings, name)
    every = len(TIERS) * settings.step_partitions
    wait_for(lambda: worker.owned_partitions() >= every, 60, f"{name} to own step partitions")
    return worker


def _queued_longer_than(pg: psycopg.Connection[Any], run_ids: list[str], ms: int) -> int:
    """How many of the runs' first attempts a worker claimed more than ``ms`` after the run
    was started (their time in the queue)."""
    row = pg.execute(
        "SELECT count(*) FROM eec_step_attempt a JOIN eec_workflow_run r USING (run_id)"
        " WHERE a.run_id = ANY(%s) AND a.attempt = 1"
        " AND a.started_at > r.created_at + make_interval(secs => %s)",
        (run_ids, ms / 1000),
    ).fetchone()
    return int(row[0]) if row else 0


def _ran_once_and_succeeded(pg: psycopg.Connection[Any], run_ids: list[str]) -> None:
    statuses = run_statuses(pg, run_ids)
    failed = {r: s for r, s in statuses.items() if s != "succeeded"}
    if failed:
        example = next(iter(failed))
        why = pg.execute(
            "SELECT failure_reason FROM eec_workflow_run WHERE run_id = %s", (example,)
        ).fetchone()
        pytest.fail(f"{len(failed)} runs not succeeded, e.g. {example}: {why}")
    counts = counted_steps.executions(pg)
    assert all(counts[(r, "only", 1)] == 1 for r in run_ids)
    assert all(step_attempts(pg, r) == {"only": [(1, "succeeded")]} for r in run_ids[:50])


def test_steps_queued_while_their_worker_restarts_all_succeed(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    """A step kills its worker (SIGKILL, as os._exit or the OOM killer would); 200 runs of a
    5 ms step with a 1 s timeout and one attempt are started while no worker serves, and
    their deadlines as dispatched pass by seconds (the coordinator looks at them meanwhile);
    the supervisor starts the worker again. Every one of them succeeds, its code run once:
    their timeout counts from their start, not from their dispatch (before, all 200 failed
    with "attempt 1 timed out after 1000 ms" without one execution)."""
    settings = replace(settings, instance_timeout_s=3.0)
    counted_steps.install(pg)
    register_workflow(pg, _one_step("crashes-its-worker", timeout_ms=120_000, attempts=3))
    register_workflow(pg, _one_step("queued-1s", timeout_ms=1_000))
    spawn(["process"], settings, "process")
    worker = _worker(spawn, settings, "worker-0")
    (crasher,) = _ids("crash", 1)
    queued = _ids("queued", 200)
    start_runs(settings, "crashes-its-worker", [crasher], {"crash_on": [1]})
    wait_for(lambda: worker.proc.poll() is not None, 60, "the step to kill its worker")
    assert worker.proc.returncode == -signal.SIGKILL
    start_runs(settings, "queued-1s", queued, {"sleep_ms": 5})
    # The supervisor is slow to start it again: every deadline as dispatched has passed, by
    # two seconds, and the coordinator's sweeps have looked at these runs since.
    wait_for(
        lambda: _overdue(pg, queued, seconds=2) == len(queued),
        60,
        "every queued run's first deadline to pass by 2 s",
    )
    again = spawn(["worker", "--app", APP], settings, "worker-1")
    wait_for(
        lambda: again.running() and count_terminal(pg, [crasher, *queued]) == len(queued) + 1,
        120,
        "every run to end",
        0.2,
    )
    _ran_once_and_succeeded(pg, queued)
    assert _queued_longer_than(pg, queued, 2_000) == len(queued)  # forced: each waited > 2 s
    assert run_statuses(pg, [crasher]) == {crasher: "succeeded"}
    assert again.terminate() == 0


def _overdue(pg: psycopg.Connection[Any], run_ids: list[str], seconds: float) -> int:
    """How many of the runs are dispatched and past their next wakeup by ``seconds``."""
    row = pg.execute(
        "SELECT count(*) FROM eec_workflow_run WHERE run_id = ANY(%s) AND status = 'running'"
        " AND next_wakeup_at < now() - make_interval(secs => %s)",
        (run_ids, seconds),
    ).fetchone()
    return int(row[0]) if row else 0


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_backlog_behind_a_slow_worker_fails_no_step_for_its_time_in_the_queue(
    settings: Settings,
    pg: psycopg.Connection[Any],
    spawn: Callable[..., Spawned],
    concurrency: int,
) -> None:
    """5,000 runs of a tiny step with a 1 s timeout, started at once, behind one worker of
    1 or 4 slots: most wait in the queue for seconds, far longer than their timeout, and every
    one succeeds, its code run once."""
    counted_steps.install(pg)
    register_workflow(pg, _one_step("backlog-1s", timeout_ms=1_000))
    spawn(["process"], settings, "process")
    _worker(spawn, settings, "worker", "--concurrency", str(concurrency))
    run_ids = _ids(f"backlog{concurrency}", 5_000)
    start_runs(settings, "backlog-1s", run_ids, {"sleep_ms": 1})
    wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 240, "every run to end", 0.5)
    _ran_once_and_succeeded(pg, run_ids)
    waited = _queued_longer_than(pg, run_ids, 1_000)
    assert waited > len(run_ids) // 4, f"only {waited} runs waited longer than their timeout"
    print(f"{waited} of {len(run_ids)} runs waited in the queue longer than their 1 s timeout")


def test_schedule_to_start_fails_the_steps_that_wait_longer_with_its_reason(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    """The same backlog, its steps declaring ``schedule_to_start_ms`` 2 s: a step started
    within 2 s of its dispatch succeeds (its code run once); one that waited longer fails,
    not retried, with the bound's reason, its code never run (the worker does not take it
    once its bound passed)."""
    counted_steps.install(pg)
    register_workflow(
        pg, _one_step("backlog-s2s", timeout_ms=1_000, attempts=3, schedule_to_start_ms=2_000)
    )
    spawn(["process"], settings, "process")
    _worker(spawn, settings, "worker", "--concurrency", "1")
    run_ids = _ids("s2s", 3_000)
    start_runs(settings, "backlog-s2s", run_ids, {"sleep_ms": 2})
    wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 240, "every run to end", 0.5)
    rows = pg.execute(
        "SELECT run_id, status, failure_reason FROM eec_workflow_run WHERE run_id = ANY(%s)",
        (run_ids,),
    ).fetchall()
    counts = counted_steps.executions(pg)
    reason = (
        "step 'only' failed after 1 attempt(s): attempt 1 was not started within 2000 ms of"
        " its dispatch (schedule_to_start_ms)"
    )
    succeeded = [r for r, status, _ in rows if status == "succeeded"]
    failed = [(r, why) for r, status, why in rows if status != "succeeded"]
    assert succeeded and failed, f"{len(succeeded)} succeeded, {len(failed)} failed"
    assert all(why == reason for _, why in failed), failed[:3]
    assert all(counts[(r, "only", 1)] == 1 for r in succeeded)
    assert not any(counts[(r, "only", 1)] for r, _ in failed), "a step ran past its bound"
    print(f"{len(succeeded)} started within 2 s and succeeded, {len(failed)} failed for it")
