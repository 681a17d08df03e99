"""Run deadlines on the real services: a run whose step hangs (it would run a minute, its own
timeout two) is failed at its workflow's deadline with the reason, never before; its running
attempt is told to stop (the step sees ``ctx.cancelled``, and nothing it returns is applied)
and its child run (with a deadline of its own workflow's) is cancelled with it. A start's own
timeout, shorter than its workflow's, wins (given through ``ductor start --timeout``). A run
that ends in time succeeds as if it had no deadline.
"""

from __future__ import annotations

import functools
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest

from processor.client import retry_run, start_runs
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow
from processor.tools.waiting import eventually
from processor.worker import StepContext, StepRegistry

from .audit import assert_transitions_applied_once
from .children import run_ductor
from .counted_steps import work_for
from .instances import WorkerThread
from .runs import count_terminal, run_statuses, step_attempts
from .waiting import wait_for

pytestmark = pytest.mark.integration

# Long enough that a loaded machine's worker has the hanging steps running before they pass
# (with 3 and 2 s, a step claimed late never ran, and never saw its run end).
DEADLINE_MS = 8_000
OVERRIDE_MS = 6_000


class Hanging:
    """A step that would work for a minute unless its run no longer wants it: which runs it
    entered for, and which of them it saw cancelled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entered: set[str] = set()
        self.saw_cancel: set[str] = set()
        self.returned: set[str] = set()

    def registry(self) -> StepRegistry:
        registry = StepRegistry()

        @registry.step("deadline_hang")
        def hang(ctx: StepContext) -> Any:
            with self.lock:
                self.entered.add(ctx.run_id)
            until = time.monotonic() + 60
            while not ctx.cancelled and time.monotonic() < until:
                work_for(0.05)  # a unit of its work, then it looks again
            with self.lock:
                (self.saw_cancel if ctx.cancelled else self.returned).add(ctx.run_id)
            return {"done": True}

        @registry.step("deadline_first_hangs")
        def first_hangs(ctx: StepContext) -> Any:
            while ctx.attempt == 1 and not ctx.cancelled:
                work_for(0.05)
            return {"attempt": ctx.attempt}

        @registry.step("deadline_quick")
        def quick(ctx: StepContext) -> Any:
            return {"quick": ctx.run_id}

        return registry


def _register(pg: psycopg.Connection[Any], tag: str) -> dict[str, str]:
    names = {k: f"{k}-{tag}" for k in ("hold", "late", "long", "quick", "again")}
    # The child: a wait nobody answers (a week), what only a cancel ends.
    hold = {"name": "hold", "kind": "wait", "signal": "never", "timeout_ms": 600_000}
    hang = {"name": "work", "type": "deadline_hang", "timeout_ms": 120_000}
    for raw in (
        # (a deadline of its own, which its parent's end comes long before)
        {"name": names["hold"], "version": 1, "timeout_ms": 900_000, "steps": [hold]},
        {
            "name": names["late"],
            "version": 1,
            "timeout_ms": DEADLINE_MS,
            "steps": [hang, {"name": "child", "kind": "workflow", "workflow": names["hold"]}],
        },
        # A workflow's deadline of ten minutes, which a start shortens.
        {"name": names["long"], "version": 1, "timeout_ms": 600_000, "steps": [hang]},
        {
            "name": names["again"],
            "version": 1,
            "timeout_ms": OVERRIDE_MS,
            "steps": [{"name": "work", "type": "deadline_first_hangs", "timeout_ms": 120_000}],
        },
        {
            "name": names["quick"],
            "version": 1,
            "timeout_ms": 60_000,
            "steps": [{"name": "only", "type": "deadline_quick"}],
        },
    ):
        register_workflow(pg, parse_workflow(raw))
    return names


def _row(pg: psycopg.Connection[Any], run_id: str) -> dict[str, Any]:
    row = pg.execute(
        "SELECT status, failure_reason, timeout_ms, node_states,"
        "       (extract(epoch FROM created_at) * 1000)::bigint,"
        "       (extract(epoch FROM deadline_at) * 1000)::bigint,"
        "       (extract(epoch FROM updated_at) * 1000)::bigint"
        "  FROM eec_workflow_run WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    assert row is not None, run_id
    keys = ("status", "reason", "timeout_ms", "nodes", "created", "deadline", "ended")
    return dict(zip(keys, row, strict=True))


def _recorded(pg: psycopg.Connection[Any], run_id: str) -> bool:
    return "work" in step_attempts(pg, run_id)


def test_a_run_past_its_deadline_fails_its_step_told_to_stop_its_child_cancelled(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    tag = uuid.uuid4().hex[:6]
    names = _register(pg, tag)
    late, short, in_time = f"late-{tag}", f"short-{tag}", f"quick-{tag}"
    child = f"{late}/child#1"
    hanging = Hanging()
    instance = processor_thread(settings)
    worker = WorkerThread(settings, hanging.registry())
    try:
        start_runs(settings, names["late"], [late])
        start_runs(settings, names["quick"], [in_time])
        started = run_ductor(
            settings, "start", names["long"], "--run-id", short, "--timeout", str(OVERRIDE_MS)
        )
        assert started.returncode == 0, started.stderr
        wait_for(lambda: count_terminal(pg, [late, short, in_time]) == 3, 60, "the runs to end")
        wait_for(lambda: count_terminal(pg, [child]) == 1, 30, "the child run to end")
        # The hanging attempts are told to stop: each step sees its run no longer wants it.
        if not eventually(lambda: hanging.saw_cancel == {late, short}, 30):
            pytest.fail(
                f"the steps did not see their runs end: entered {sorted(hanging.entered)},"
                f" saw {sorted(hanging.saw_cancel)}"
            )
    finally:
        worker.stop()
    assert hanging.entered >= {late, short} and not hanging.returned

    lateness = []
    for run_id, timeout in ((late, DEADLINE_MS), (short, OVERRIDE_MS)):
        row = _row(pg, run_id)
        lateness.append(row["ended"] - row["deadline"])
        assert row["status"] == "failed", row
        assert row["reason"] == f"run deadline of {timeout} ms passed"
        assert row["timeout_ms"] == timeout  # the start's own won over its workflow's
        assert row["deadline"] - row["created"] >= timeout
        assert row["ended"] >= row["deadline"]  # never before it
        # What the step returned once it stopped was recorded, and applied to nothing: the
        # run stays failed, its step cancelled.
        wait_for(functools.partial(_recorded, pg, run_id), 30, "the step's end recorded")
        assert _row(pg, run_id) == row
        assert row["nodes"]["work"]["status"] == "cancelled"
    assert _row(pg, late)["nodes"]["child"]["status"] == "cancelled"
    assert run_statuses(pg, [child]) == {child: "cancelled"}
    held = _row(pg, child)  # its own workflow's deadline, from its creation
    assert held["timeout_ms"] == 900_000 and held["deadline"] - held["created"] == 900_000

    quick = _row(pg, in_time)
    assert quick["status"] == "succeeded" and quick["reason"] is None
    assert quick["timeout_ms"] == 60_000 and quick["ended"] < quick["deadline"]
    shown = run_ductor(settings, "result", late)
    assert shown.returncode == 1 and f"run deadline of {DEADLINE_MS} ms passed" in (
        shown.stdout + shown.stderr
    )
    assert_transitions_applied_once(pg)
    assert instance.alive and sum(instance.stats.errors.values()) == 0
    print(f"the runs failed {lateness} ms after their deadlines")


def test_a_run_failed_at_its_deadline_and_retried_gets_its_whole_timeout_again(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    tag = uuid.uuid4().hex[:6]
    names = _register(pg, tag)
    run_id = f"again-{tag}"
    processor_thread(settings)
    worker = WorkerThread(settings, Hanging().registry())
    try:
        start_runs(settings, names["again"], [run_id])
        wait_for(lambda: count_terminal(pg, [run_id]) == 1, 60, "the run to fail")
        failed = _row(pg, run_id)
        assert failed["reason"] == f"run deadline of {OVERRIDE_MS} ms passed"
        retry_run(settings, run_id)
        # Its second attempt answers at once, well within the deadline the retry set again.
        wait_for(lambda: count_terminal(pg, [run_id]) == 1, 60, "the retried run to end")
    finally:
        worker.stop()
    retried = _row(pg, run_id)
    assert retried["status"] == "succeeded", retried
    assert retried["deadline"] > failed["deadline"] and retried["ended"] < retried["deadline"]
