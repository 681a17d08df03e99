"""A run's tier is carried to its step tasks: each queue has a steps topic per tier, and a
worker serves the top tier first, so a flood of bulk (t2) runs never delays an interactive
(t0) run's steps. On the real services: a one-slot worker busy with a backlog of bulk steps
runs an interactive run's step next, not after the flood."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from processor import client
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow
from processor.worker import StepContext, StepRegistry

from .instances import WorkerThread
from .runs import count_terminal
from .waiting import wait_for

pytestmark = pytest.mark.integration

FLOOD = 300


def test_an_interactive_runs_step_goes_before_a_bulk_flood(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    register_workflow(
        pg,
        parse_workflow({"name": "tiered", "version": 1, "steps": [{"name": "s", "type": "work"}]}),
    )
    order: list[str] = []
    registry = StepRegistry()

    @registry.step("work")
    def work(ctx: StepContext) -> None:
        order.append(ctx.run_id)
        threading.Event().wait(0.02)  # the step's work (a bounded wait, not a poll)

    bulk = [f"bulk-{i}" for i in range(FLOOD)]
    client.start_runs(settings, "tiered", bulk, tier="t2")
    processor_thread(settings)
    worker = WorkerThread(settings, registry, threads=1)
    try:
        wait_for(lambda: len(order) >= 10, 60, "the flood to be under way")
        interactive = [f"now-{i}" for i in range(3)]
        client.start_runs(settings, "tiered", interactive, tier="t0")
        wait_for(lambda: count_terminal(pg, interactive) == 3, 60, "the interactive runs")
        done_before = [r for r in order if r.startswith("bulk-")]
        wait_for(lambda: count_terminal(pg, bulk) == FLOOD, 120, "the flood to end")
    finally:
        worker.stop()
    # The interactive steps ran while most of the flood still waited: served first.
    assert len(done_before) < FLOOD // 2, len(done_before)
    assert sorted(order) == sorted([*bulk, *interactive])  # each once
    names = TopicNames(settings.topic_prefix)
    assert names.steps_for("default", "t0") == f"{settings.topic_prefix}.steps.default.t0"
