"""A concurrency slot is held by an execution, not an attempt (core/limits.py, rule 4), on the
real services: a limit of 1, a step that runs 10 s ignoring its cancellation, in a thread (a
worker cannot stop it), and another run waiting for the slot. Whether its attempt times out
(2 s), fails for its heartbeat or its run is cancelled, the execution goes on, and keeps its
slot until it ends: no two executions under the limit ever run at once (counted where users
feel it: the steps module records each execution's start and end, counted_steps.py), and
`ductor inspect` says why the slot is still held meanwhile. Before, the slot was freed with
the attempt, and the next execution ran beside the one still running."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from processor.client import inspect_run, send_signal, start_runs
from processor.core.routing import TIERS
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from . import counted_steps
from .children import Spawned, run_ductor
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"


def _limited(name: str, how: str) -> WorkflowDef:
    """One step under a concurrency limit of 1 (a limit of the test's own), with the timeout
    ``how`` ends its first attempt by: 2 s; a heartbeat timeout of 1 s (the step never
    beats); none that matters (its run is cancelled)."""
    step: dict[str, Any] = {
        "name": "only",
        "type": "counted",
        "timeout_ms": 2_000 if how == "timeout" else 60_000,
        "retry": {"max_attempts": 3, "backoff_ms": 50},
        "concurrency": {"limit": 1, "name": f"slot-{name}"},
    }
    if how == "heartbeat":
        step["heartbeat_timeout_ms"] = 1_000
    return parse_workflow({"name": name, "version": 1, "steps": [step]})


def _worker(spawn: Any, settings: Settings) -> Spawned:
    worker: Spawned = spawn(["worker", "--app", APP, "--concurrency", "4"], settings, "worker")
    every = len(TIERS) * settings.step_partitions
    wait_for(lambda: worker.owned_partitions() >= every, 60, "the worker to own its partitions")
    return worker


def _lingering(settings: Settings, run_id: str) -> list[str]:
    """The slots `ductor inspect` says the run's first attempt keeps after it ended."""
    document = inspect_run(settings, run_id)
    first = [a for a in document["attempts"] if a["attempt"] == 1]
    return list(first[0].get("holds_slots", ())) if first else []


@pytest.mark.parametrize("how", ["timeout", "heartbeat", "cancel"])
def test_a_slot_stays_with_an_execution_that_outlives_its_attempt(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned], how: str
) -> None:
    counted_steps.install(pg)
    tag = uuid.uuid4().hex[:6]
    name = f"slot-{how}-{tag}"
    register_workflow(pg, _limited(name, how))
    spawn(["process"], settings, "process")
    worker = _worker(spawn, settings)
    slow, other = f"{name}-slow", f"{name}-other"
    start_runs(settings, name, [slow], {"sleep_on": {"1": 10_000}})
    wait_for(lambda: bool(counted_steps.executions(pg, slow)), 30, "the slow step to start")
    start_runs(settings, name, [other])
    if how == "cancel":
        send_signal(settings, slow)
    # Its attempt ends (times out, fails for its heartbeat, is cancelled with its run), its
    # code still runs: the slot stays with it, and inspect says so meanwhile.
    shown: list[str] = []

    def ended() -> bool:
        kept = [f"c/slot-{name}/"]
        if not shown and _lingering(settings, slow) == kept:
            text = run_ductor(settings, "inspect", slow).stdout
            # Kept before and after the text was read: kept while it was (a slot kept is
            # given back once, never taken again), however slow the command on this machine.
            if _lingering(settings, slow) == kept:
                shown.append(text)
        return worker.running() and count_terminal(pg, [slow, other]) == 2

    wait_for(ended, 60, "both runs to end")
    assert counted_steps.overlapping(pg, name) == [], "two executions held one slot at once"
    assert shown, "inspect never showed the slot kept by the execution still running"
    assert "keeps its slot of c/slot-" in shown[0], shown[0]
    expected = "cancelled" if how == "cancel" else "succeeded"
    assert run_statuses(pg, [slow, other]) == {slow: expected, other: "succeeded"}
    runs = [(run_id, attempt) for run_id, attempt, _, _ in counted_steps.intervals(pg, name)]
    assert runs[0] == (slow, 1)  # the slow one first; the rest only once it had ended
    assert _lingering(settings, slow) == []
    # Nothing left counted: the slot was freed once the execution ended.
    assert pg.execute("SELECT count(*) FROM eec_limit_hold").fetchone() == (0,)
