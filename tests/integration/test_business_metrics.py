"""Runs started and ended, by workflow and final status, as two real `ductor process` instances
expose them on /metrics (`ductor_runs_started_total`, `ductor_runs_ended_total`): each run's
start and end counted exactly once over both instances, although every wakeup reaches every
partition (the instances race for the same runs), wakeups come again after the runs ended, and
one run loses every version race until it is force-failed."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor import NonRetryable, StepContext, StepRegistry
from processor.client import send_signal
from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow

from .children import Spawned, still_running
from .contention import OutsideWriter
from .instances import WorkerThread
from .runs import run_statuses
from .samples import now_ms, produce_wakeups, sample_workflow
from .scrape import free_port, scrape, values
from .waiting import wait_for

pytestmark = pytest.mark.integration

Tally = Counter[tuple[str, ...]]
STARTED = ("ductor_workflow",)
ENDED = ("ductor_workflow", "ductor_status")


def _registry() -> StepRegistry:
    registry = StepRegistry()

    @registry.step("metrics_charge")
    def charge(ctx: StepContext) -> dict[str, Any]:
        if ctx.input["decline"]:
            raise NonRetryable("the card was declined")
        return {"charged": True}

    return registry


def _workflows(pg: psycopg.Connection[Any], tag: str) -> tuple[WorkflowDef, WorkflowDef]:
    """A one-step workflow whose step fails when the input says so, and one that waits for a
    signal that never comes (its runs end only when cancelled)."""
    checkout = parse_workflow(
        {
            "name": f"checkout-{tag}",
            "version": 1,
            "steps": [{"name": "charge", "type": "metrics_charge", "retry": {"max_attempts": 1}}],
        }
    )
    hold = parse_workflow(
        {
            "name": f"hold-{tag}",
            "version": 1,
            "steps": [{"name": "approval", "kind": "wait", "signal": "approve"}],
        }
    )
    for wf in (checkout, hold):
        register_workflow(pg, wf)
    return checkout, hold


def _scraped(ports: list[int], sample: str, *labels: str) -> Tally:
    """One counter summed over the instances, by the values of ``labels``."""
    total: Tally = Counter()
    for port in ports:
        for found, value in values(scrape(port), sample).items():
            named = dict(found)
            total[tuple(named[label] for label in labels)] += int(value)
    return total


def _wake_everywhere(settings: Settings, run_ids: list[str]) -> None:
    """A start wakeup of each run on every partition of its tier: whichever instances own
    them tick the same runs at once, and all but one of their commits lose or find nothing."""
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    produce_wakeups(
        settings,
        [
            (topic, Wakeup(run_id, "start", produced_at=now_ms()), partition)
            for run_id in run_ids
            for partition in range(settings.wakeup_partitions)
        ],
    )


def test_each_run_start_and_end_is_counted_once_by_workflow_and_status(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    settings = replace(settings, livelock_requeues=1)
    tag = uuid.uuid4().hex[:6]
    checkout, hold = _workflows(pg, tag)
    paid = [f"paid-{tag}-{i}" for i in range(3)]
    declined = [f"declined-{tag}-{i}" for i in range(2)]
    waiting, later, fought = f"waiting-{tag}", f"later-{tag}", f"fought-{tag}"
    insert_runs(pg, checkout, [(r, {"decline": False}) for r in paid], "t1")
    insert_runs(pg, checkout, [(r, {"decline": True}) for r in declined], "t1")
    insert_runs(pg, hold, [(waiting, {})], "t1")
    insert_runs(pg, hold, [(later, {})], "t1", start_ms=now_ms() + 3_600_000)  # starts in 1 h
    insert_runs(pg, sample_workflow(), [(fought, {})], "t1")
    everyone = [*paid, *declined, waiting, later, fought]

    ports = [free_port(), free_port()]
    instances: list[Spawned] = [
        spawn(["process"], replace(settings, metrics_port=port), f"business-{i}")
        for i, port in enumerate(ports)
    ]
    worker = WorkerThread(settings, _registry())
    # Every commit of this run loses to an outside writer until the livelock guard fails it.
    writer = OutsideWriter(settings.pg_dsn, fought)
    try:
        wait_for(lambda: writer.writes > 0, 10, "the outside writer to start")
        _wake_everywhere(settings, everyone)
        wait_for(
            lambda: (
                still_running(*instances)
                and run_statuses(pg, everyone)
                == {
                    **dict.fromkeys(paid, "succeeded"),
                    **dict.fromkeys(declined, "failed"),
                    waiting: "running",
                    later: "pending",
                    fought: "failed",
                }
            ),
            90,
            "the checkouts to end, the waiting run to start and the fought run to be failed",
        )
    finally:
        writer.stop()
    # Cancelled: a run that started, and one that never did (its start is an hour ahead).
    send_signal(settings, waiting)
    send_signal(settings, later)
    wait_for(
        lambda: run_statuses(pg, [waiting, later]) == {waiting: "cancelled", later: "cancelled"},
        60,
        "the cancels",
    )

    started = Counter({(checkout.name,): 5, (hold.name,): 1})
    ended = Counter(
        {
            (checkout.name, "succeeded"): 3,
            (checkout.name, "failed"): 2,
            (hold.name, "cancelled"): 2,
            (sample_workflow().name, "failed"): 1,  # force-failed: an end, never a start
        }
    )
    wait_for(
        lambda: _scraped(ports, "ductor_runs_ended_total", *ENDED) == ended,
        30,
        "every end to be counted",
    )
    counted = _scraped(ports, "ductor_runs_started_total", *STARTED)
    # The fought run's first tick races the outside writer's turns: it lost every time until
    # one CI run, where it landed in the instant between two writers' locks (the run then did
    # start, and its start counts once). Never more than once, and every other count exact.
    assert counted.pop((sample_workflow().name,), 0) <= 1
    assert counted == started
    # The fought run's commits all lost (and the racing instances' may have): none counted.
    assert _scraped(ports, "ductor_conflicts_total")[()] > 0

    # Woken again, everywhere, once they all ended: ticks that change nothing count nothing.
    def noops() -> int:
        return _scraped(ports, "ductor_ticks_total", "ductor_outcome")[("noop",)]

    noops_before = noops()
    _wake_everywhere(settings, everyone)
    wait_for(lambda: noops() >= noops_before + len(everyone), 60, "the late wakeups to be ticked")
    assert _scraped(ports, "ductor_runs_ended_total", *ENDED) == ended
    counted = _scraped(ports, "ductor_runs_started_total", *STARTED)
    # The fought run's first tick races the outside writer's turns: it lost every time until
    # one CI run, where it landed in the instant between two writers' locks (the run then did
    # start, and its start counts once). Never more than once, and every other count exact.
    assert counted.pop((sample_workflow().name,), 0) <= 1
    assert counted == started
    worker.stop()
    assert [instance.terminate() for instance in instances] == [0, 0]
    finals = [instance.final_stats() for instance in instances]
    # The instances' own totals when they stopped: nothing counted twice in the meantime.
    assert sum((Counter(f["runs_started"]) for f in finals), Counter()) == {
        w: n for (w,), n in started.items()
    }
    assert sum((Counter(f["runs_ended"]) for f in finals), Counter()) == {
        f"{w}:{s}": n for (w, s), n in ended.items()
    }
