"""A member that holds nothing while its group's records wait for it joins the group again.

Forced with the ``assigned=ignore@1`` fault point: the member's client lets its first
assignment go at once, unknown to the group, so the broker counts the partitions as the
member's while the member reads none of them (what was seen after a broker restart). Without
the group watch (io/kafka/group_watch.py) the runs below never end; with it, the member joins again
after ``DUCTOR_GROUP_STALL_S`` of reading nothing and they all do. A spare member, idle while
the others' records wait on them, is not taken for stuck.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.client import start_runs
from processor.core.routing import TIERS
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.group_watch import RETIRING_HANG_S
from processor.io.postgres.workflows import register_workflow
from processor.worker import StepContext, StepRegistry

from .audit import assert_transitions_applied_once
from .children import Spawned
from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .scrape import free_port
from .waiting import wait_for

pytestmark = pytest.mark.integration

STALL_S = 2.0


def _rejoin_lines(child: Spawned) -> list[dict[str, Any]]:
    return [line for line in child.log_lines() if line.get("msg") == "joining the group again"]


def _ignored(child: Spawned) -> bool:
    return any(
        str(line.get("msg", "")).startswith("TEST ONLY: an assignment")
        for line in child.log_lines()
    )


@pytest.mark.parametrize("stuck", ["process", "worker"])
def test_a_member_the_group_counts_but_that_holds_nothing_joins_again(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any, stuck: str
) -> None:
    watched = replace(settings, group_stall_s=STALL_S)
    faulty = replace(watched, test_faults="assigned=ignore@1")
    processor = spawn(["process"], faulty if stuck == "process" else watched, "process")
    worker = spawn(["worker"], faulty if stuck == "worker" else watched, "worker")
    member = processor if stuck == "process" else worker
    wait_for(lambda: _ignored(member), 60, f"the {stuck} to ignore its first assignment")
    run_ids = [f"stuck-{stuck}-{uuid.uuid4().hex[:6]}-{i}" for i in range(20)]
    started = time.monotonic()
    start_runs(settings, "sample", run_ids)
    wait_for(lambda: count_terminal(audit, run_ids) == len(run_ids), 90, "every run to end", 0.2)
    ended_s = time.monotonic() - started
    lines = _rejoin_lines(member)
    assert processor.terminate() == 0
    assert worker.terminate() == 0
    assert set(run_statuses(audit, run_ids).values()) == {"succeeded"}
    assert_transitions_applied_once(audit)
    assert len(lines) == 1, lines
    assert "does not hold" in lines[0]["reason"], lines[0]
    other = worker if stuck == "process" else processor
    assert not _rejoin_lines(other)
    if stuck == "process":
        assert processor.final_stats()["rejoins"] == 1
    print(f"the {stuck} joined again ({lines[0]['reason']}); the runs ended in {ended_s:.1f} s")


def _alive(port: int) -> bool:
    """Whether /healthz answers 200 (the loop turns); False while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as answer:
            return bool(answer.status == 200)
    except (urllib.error.URLError, ConnectionError):
        return False


@pytest.mark.parametrize("stuck", ["process", "worker"])
def test_a_member_whose_old_client_hangs_on_close_goes_on_without_it(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any, stuck: str
) -> None:
    """The old client's close hangs (``retiring=ignore``: as when its group coordinator does
    not answer, seen after a broker restart). The member's loop goes on meanwhile: its
    liveness probe stays up (a loop blocked in the close fails it within 2 s, and an
    orchestrator would restart the process), and every run ends once the old client is gone."""
    port = free_port()
    watched = replace(settings, group_stall_s=STALL_S)
    faulty = replace(
        watched,
        test_faults="assigned=ignore@1,retiring=ignore@1",
        health_port=port,
        health_stall_s=2.0,
    )
    processor = spawn(["process"], faulty if stuck == "process" else watched, "process")
    worker = spawn(["worker"], faulty if stuck == "worker" else watched, "worker")
    member = processor if stuck == "process" else worker
    wait_for(lambda: _ignored(member), 60, f"the {stuck} to ignore its first assignment")
    run_ids = [f"retired-{stuck}-{uuid.uuid4().hex[:6]}-{i}" for i in range(20)]
    start_runs(settings, "sample", run_ids)
    wait_for(lambda: bool(_rejoin_lines(member)), 60, f"the {stuck} to join its group again")
    hung_until = time.monotonic() + RETIRING_HANG_S
    # While the old client's close hangs, the probe is asked every 0.5 s for 4 s (twice the
    # stall after which a blocked loop fails it): all 200.
    probes: list[bool] = []
    watch_until = time.monotonic() + 4.0

    def probed_long_enough() -> bool:
        probes.append(_alive(port))
        return time.monotonic() > watch_until

    wait_for(probed_long_enough, 30, "four seconds of liveness probes", 0.5)
    assert time.monotonic() < hung_until, "the probes outlasted the hang: the test proves nothing"
    assert all(probes), f"liveness failed while the old client closed: {probes}"
    wait_for(lambda: count_terminal(audit, run_ids) == len(run_ids), 120, "every run to end", 0.2)
    assert any(
        str(line.get("msg", "")).startswith("TEST ONLY: a retired consumer's close hangs")
        for line in member.log_lines()
    )
    wait_for(
        lambda: any(
            line.get("msg") == "the consumer left behind is closed" for line in member.log_lines()
        ),
        60,
        "the old client to close once its hang ends",
    )
    assert processor.terminate() == 0
    assert worker.terminate() == 0
    assert set(run_statuses(audit, run_ids).values()) == {"succeeded"}
    assert_transitions_applied_once(audit)
    assert len(_rejoin_lines(member)) == 1


def test_a_spare_worker_idle_beside_busy_ones_is_not_taken_for_stuck(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any, caplog: Any
) -> None:
    """Four workers for three step partitions (of each tier's steps topic: the group's
    assignor gives partition i of the three topics to one member): one holds nothing. While
    the others hold tasks that wait (their records past the committed offsets) for several
    quiet times, no worker joins again: the records are read by the members that hold
    them."""
    # Quiet times of 2.5 s, so a look's verdict is confirmed 2.5 s later (5 s by default, with
    # 30 s quiet times): at 1 s, CI's load once let a passing state be confirmed.
    watched = replace(settings, group_stall_s=2.5)
    gate = threading.Event()
    registry = StepRegistry()

    @registry.step("gated")
    def gated(ctx: StepContext) -> Any:
        gate.wait(120)
        return {"attempt": ctx.attempt}

    register_workflow(
        audit,
        parse_workflow(
            orjson.loads(
                orjson.dumps(
                    {
                        "name": "gated-spare",
                        "version": 1,
                        "steps": [{"name": "g", "type": "gated", "timeout_ms": 300_000}],
                    }
                )
            )
        ),
    )
    processor = spawn(["process"], watched, "process")
    workers = [WorkerThread(watched, registry) for _ in range(4)]
    try:
        wait_for(
            lambda: (
                sorted(len(w.worker.source.assigned) for w in workers) == [0, *[len(TIERS)] * 3]
            ),
            60,
            "three workers to hold a step partition (of each tier) each, one to hold none",
        )
        run_ids = [f"spare-{uuid.uuid4().hex[:6]}-{i}" for i in range(12)]
        for rank, tier in enumerate(TIERS):  # tasks waiting on each of the three partitions
            start_runs(settings, "gated-spare", run_ids[rank :: len(TIERS)], tier=tier)
        # Several quiet times with tasks waiting: every worker looks at the group at least
        # twice meanwhile.
        deadline = time.monotonic() + 8.0
        wait_for(lambda: time.monotonic() > deadline, 15, "eight quiet seconds", 0.2)
        reasons = [
            (getattr(r, "instance", ""), getattr(r, "reason", ""), getattr(r, "waiting", ""))
            for r in caplog.records
            if r.getMessage() == "joining the group again"
        ]
        assert [w.worker.stats.rejoins for w in workers] == [0, 0, 0, 0], reasons
        gate.set()
        wait_for(lambda: count_terminal(audit, run_ids) == len(run_ids), 60, "every run to end")
    finally:
        gate.set()
        for w in workers:
            w.stop()
    assert processor.terminate() == 0
    assert set(run_statuses(audit, run_ids).values()) == {"succeeded"}
    assert [w.worker.stats.rejoins for w in workers] == [0, 0, 0, 0]
