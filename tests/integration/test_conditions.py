"""Conditions and skips on the real services: a workflow branching on its input runs one
branch and skips the other, and the join after both (``run_if: all_done``) runs once and sees
only the branch that ran; a step whose condition reads a dependency's output runs or is
skipped by it, and what follows a skipped step is skipped too; a condition on a value of the
wrong type is false, never an error; the functions of skipped steps are never executed.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import psycopg
import pytest

from processor import StepContext, StepRegistry
from processor.io.config.settings import Settings

from .audit import assert_transitions_applied_once
from .instances import WorkerThread
from .runs import count_terminal, register_raw, run_statuses, start_by_cli
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _counting_registry(calls: Counter[tuple[str, str]]) -> StepRegistry:
    """Step functions that count their executions by (run, step type)."""
    registry = StepRegistry()
    lock = threading.Lock()

    def counted(ctx: StepContext, kind: str) -> None:
        with lock:
            calls[(ctx.run_id, kind)] += 1

    @registry.step("cond_check")
    def check(ctx: StepContext) -> dict[str, Any]:
        counted(ctx, "cond_check")
        return {"n": ctx.input["n"]}

    @registry.step("cond_branch")
    def branch(ctx: StepContext) -> dict[str, Any]:
        counted(ctx, f"cond_branch:{ctx.node}")
        return {"ran": ctx.node}

    @registry.step("cond_join")
    def join(ctx: StepContext) -> dict[str, Any]:
        counted(ctx, f"cond_join:{ctx.node}")
        return {"deps": dict(ctx.deps)}

    @registry.step("cond_score")
    def score(ctx: StepContext) -> dict[str, Any]:
        counted(ctx, "cond_score")
        return {"v": ctx.input["v"]}

    return registry


def _row(pg: psycopg.Connection[Any], run_id: str) -> tuple[dict[str, str], Any]:
    """A run's node statuses and its output."""
    row = pg.execute(
        "SELECT node_states, output FROM eec_workflow_run WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert row is not None
    return {n: s["status"] for n, s in row[0].items()}, row[1]


def _recorded(pg: psycopg.Connection[Any], run_ids: list[str]) -> set[tuple[str, str]]:
    rows = pg.execute(
        "SELECT run_id, node_id FROM eec_step_result WHERE run_id = ANY(%s)", (run_ids,)
    ).fetchall()
    return {(r[0], r[1]) for r in rows}


def test_a_branch_on_the_input_runs_one_side_and_the_join_sees_only_it(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    tag = uuid.uuid4().hex[:6]
    workflow = register_raw(
        pg,
        {
            "name": f"branch-{tag}",
            "version": 1,
            "steps": [
                {"name": "check", "type": "cond_check"},
                {
                    "name": "big",
                    "type": "cond_branch",
                    "depends_on": ["check"],
                    "when": "$.steps.check.output.n > 100",
                },
                {
                    "name": "small",
                    "type": "cond_branch",
                    "depends_on": ["check"],
                    "when": "$.input.n <= 100",
                },
                {
                    "name": "join",
                    "type": "cond_join",
                    "depends_on": ["big", "small"],
                    "run_if": "all_done",
                },
            ],
            "output": {"big": "big", "small": "small", "join": "join"},
        },
    )
    calls: Counter[tuple[str, str]] = Counter()
    instance = processor_thread(settings)
    worker = WorkerThread(settings, _counting_registry(calls))
    runs = {f"big-{i}-{tag}": 500 for i in range(3)} | {f"small-{i}-{tag}": 7 for i in range(3)}
    try:
        for run_id, n in runs.items():
            start_by_cli(settings, workflow, run_id, f'{{"n": {n}}}')
        wait_for(lambda: count_terminal(pg, list(runs)) == len(runs), 90, "every run to end")
    finally:
        worker.stop()
    assert run_statuses(pg, list(runs)) == dict.fromkeys(runs, "succeeded")
    recorded = _recorded(pg, list(runs))
    for run_id, n in runs.items():
        ran, skipped = ("big", "small") if n > 100 else ("small", "big")
        nodes, output = _row(pg, run_id)
        assert nodes == {"check": "succeeded", ran: "succeeded", skipped: "skipped"} | {
            "join": "succeeded"
        }
        # The join ran once, after both ended, and read only the branch that ran: the
        # skipped one is absent, not null, from its data and from the run's output.
        assert output == {ran: {"ran": ran}, "join": {"deps": {ran: {"ran": ran}}}}
        assert (run_id, skipped) not in recorded  # no result of any kind for it
        assert calls[(run_id, f"cond_branch:{ran}")] == 1
        assert calls[(run_id, f"cond_branch:{skipped}")] == 0  # never executed
        assert calls[(run_id, "cond_join:join")] == 1
    assert_transitions_applied_once(pg)
    assert instance.alive and sum(instance.stats.errors.values()) == 0


def test_a_condition_on_a_dependency_s_output_decides_and_skips_propagate(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    tag = uuid.uuid4().hex[:6]
    workflow = register_raw(
        pg,
        {
            "name": f"review-{tag}",
            "version": 1,
            "steps": [
                {"name": "score", "type": "cond_score"},
                {
                    "name": "review",
                    "type": "cond_branch",
                    "depends_on": ["score"],
                    "when": "$.steps.score.output.v >= 0.5",
                },
                # Its only dependency skipped: skipped too (no run_if).
                {"name": "notify", "type": "cond_join", "depends_on": ["review"]},
            ],
            "output": "notify",
        },
    )
    calls: Counter[tuple[str, str]] = Counter()
    instance = processor_thread(settings)
    worker = WorkerThread(settings, _counting_registry(calls))
    # v: a number above, one below, and values a comparison with a number is false for (a
    # string, null, a missing field): skipped, never an error of the tick.
    inputs = {
        f"high-{tag}": '{"v": 0.9}',
        f"low-{tag}": '{"v": 0.1}',
        f"text-{tag}": '{"v": "high"}',
        f"null-{tag}": '{"v": null}',
    }
    try:
        for run_id, payload in inputs.items():
            start_by_cli(settings, workflow, run_id, payload)
        wait_for(lambda: count_terminal(pg, list(inputs)) == len(inputs), 90, "every run to end")
    finally:
        worker.stop()
    assert run_statuses(pg, list(inputs)) == dict.fromkeys(inputs, "succeeded")
    for run_id in inputs:
        nodes, output = _row(pg, run_id)
        if run_id == f"high-{tag}":
            assert nodes == dict.fromkeys(["score", "review", "notify"], "succeeded")
            assert output == {"deps": {"review": {"ran": "review"}}}
            assert calls[(run_id, "cond_branch:review")] == 1
            assert calls[(run_id, "cond_join:notify")] == 1
        else:
            assert nodes == {"score": "succeeded", "review": "skipped", "notify": "skipped"}
            assert output is None  # its output step was skipped: the run has none
            assert calls[(run_id, "cond_branch:review")] == 0
            assert calls[(run_id, "cond_join:notify")] == 0
        assert calls[(run_id, "cond_score")] == 1
    assert_transitions_applied_once(pg)
    assert instance.alive and sum(instance.stats.errors.values()) == 0
