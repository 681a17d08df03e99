"""A step runs once per attempt unless a process died or a deadline passed, counted where users
feel it: executions of their code per (run, step, attempt), recorded by the tests' own steps
module (counted_steps.py). Two processors and two workers carry 1,000 runs of a 4-step
workflow while the broker is down for 35 s (no process crashes: at most 0.5 % extra
executions), and 2,000 while every processor and worker is restarted in turn by SIGTERM
(none)."""

from __future__ import annotations

import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.run_counts import count_outbox_with_prefix
from processor.io.postgres.workflows import register_workflow

from . import counted_steps
from .audit import assert_results_applied, assert_transitions_applied_once
from .children import Spawned
from .restarts import LocalInfra
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"
RUNS = 2000


def _quad(name: str = "counted-quad", retry: dict[str, int] | None = None) -> WorkflowDef:
    """s0; s1 and s2 after it; s3 after both: every step a counted one, retried as ``retry``
    says (3 attempts by default)."""
    step = {"type": "counted", "timeout_ms": 30_000, "retry": retry or {"max_attempts": 3}}
    return parse_workflow(
        {
            "name": name,
            "version": 1,
            "steps": [
                {"name": "s0", **step},
                {"name": "s1", "depends_on": ["s0"], **step},
                {"name": "s2", "depends_on": ["s0"], **step},
                {"name": "s3", "depends_on": ["s1", "s2"], **step},
            ],
        }
    )


class SubprocessFleet:
    """Two processors and two workers, each one a `ductor` subprocess."""

    def __init__(self, spawn: Callable[..., Spawned], settings: Settings) -> None:
        self._spawn = spawn
        self._settings = settings
        self._started = 0
        self.members: dict[str, Spawned] = {}
        for name in ("process-a", "process-b", "worker-a", "worker-b"):
            self.start(name)
        for name in self.members:
            self.wait_owns(name)

    def start(self, name: str) -> None:
        self._started += 1
        args = ["process"] if name.startswith("process") else ["worker", "--app", APP]
        self.members[name] = self._spawn(args, self._settings, f"{name}-{self._started}")

    def wait_owns(self, name: str) -> None:
        member = self.members[name]
        wait_for(lambda: member.owned_partitions() > 0, 60, f"{name} to own partitions")

    def running(self) -> bool:
        return all(member.running() for member in self.members.values())

    def stop(self) -> None:
        for name, member in self.members.items():
            assert member.terminate() == 0, f"{name} did not stop cleanly"


def _start(
    settings: Settings, pg: psycopg.Connection[Any], sleep_ms: int, runs: int = RUNS
) -> list[str]:
    counted_steps.install(pg)
    register_workflow(pg, _quad())
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"once-{tag}-{i}" for i in range(runs)]
    start_runs(settings, "counted-quad", run_ids, {"sleep_ms": sleep_ms})
    return run_ids


def _report(pg: psycopg.Connection[Any], run_ids: list[str]) -> tuple[int, int]:
    """(attempts that ran, executions beyond one per attempt) of these runs."""
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert_transitions_applied_once(pg)
    # Every process stopped cleanly: none left an acknowledged outbox row for others to
    # send again (they are deleted at shutdown and when partitions go).
    prefix = run_ids[0].rsplit("-", 1)[0]
    assert count_outbox_with_prefix(pg, prefix) == 0
    counts = counted_steps.executions(pg, prefix)
    return len(counts), counted_steps.extra_executions(counts)


def test_a_broker_down_35_s_under_load_costs_at_most_half_a_percent_extra_executions(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any, local_infra: LocalInfra
) -> None:
    """The processes ride through the outage (the first worker exited after a 30 s flush). A
    processor and a worker are stopped by SIGTERM in the middle of it and stop cleanly within
    the shutdown bound (a last commit waited for a group coordinator that was gone): their
    partitions go to the others, which go on once the broker is back. Each worker logs the
    outage once when it starts and once when it ends."""
    fleet = SubprocessFleet(spawn, settings)
    # Steps of 40 ms: the workers, not the processors, are the bottleneck (two workers of 8
    # slots take about 10 s over the 4,000 steps), so each holds tasks it fetched when the
    # broker goes and reports the outage when their wakeups go unacknowledged. (With 5 ms
    # steps a worker could be idle at that moment: with nothing to send, it has no outage to
    # see.)
    run_ids = _start(settings, audit, sleep_ms=40, runs=RUNS // 2)
    wait_for(
        lambda: fleet.running() and count_terminal(audit, run_ids) >= len(run_ids) // 5,
        120,
        "a fifth of the runs to end first",
    )
    local_infra.kill_kafka()
    down_at = time.monotonic()
    rider = fleet.members["worker-a"]
    quitters = [fleet.members.pop(name) for name in ("worker-b", "process-b")]
    wait_for(
        lambda: fleet.running() and min(rider.outages("kafka"), quitters[0].outages("kafka")) > 0,
        30,
        "both workers to report the broker outage",
        0.5,
    )
    stopping_at = time.monotonic()
    for quitter in quitters:
        quitter.proc.send_signal(signal.SIGTERM)
    for quitter in quitters:
        # Within its bound, with room for a loaded machine; past it, the failure carries its
        # stacks, native ones too, taken before its own watchdog (the bound + 8 s) ends it.
        code = quitter.terminate()
        assert code == 0, (
            f"{quitter.log_path.name} stopped mid-outage with {code}:\n{quitter.stacks()}"
            f"\n{quitter.tail(15)}"
        )
    stop_s = time.monotonic() - stopping_at
    wait_for(lambda: fleet.running() and time.monotonic() - down_at >= 35, 60, "35 s", 0.5)
    local_infra.start_kafka()
    wait_for(
        lambda: fleet.running() and count_terminal(audit, run_ids) == len(run_ids),
        300,
        "every run to end after the broker came back",
        0.5,
    )
    fleet.stop()
    attempts, extra = _report(audit, run_ids)
    print(
        f"broker down 35 s: {extra} extra executions of {attempts} attempts; a worker and a"
        f" processor stopped mid-outage in {stop_s:.1f} s"
    )
    assert extra <= 0.005 * attempts, (extra, attempts)
    quitter = quitters[0]
    assert (rider.outages("kafka"), rider.outages("kafka", "ended")) == (1, 1)
    assert (quitter.outages("kafka"), quitter.outages("kafka", "ended")) == (1, 0)
    assert not rider.outages("postgres") and not quitter.outages("postgres")


def test_a_rolling_sigterm_restart_of_every_process_runs_no_step_twice(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    fleet = SubprocessFleet(spawn, settings)
    # Steps of 40 ms: two workers of 8 slots take about 25 s over the 8,000 steps, longer
    # than the four restarts.
    run_ids = _start(settings, audit, sleep_ms=40)
    for name in ("process-a", "worker-a", "process-b", "worker-b"):
        wait_for(fleet.running, 5, "the fleet to run")
        assert fleet.members[name].terminate() == 0, f"{name} did not stop cleanly"
        fleet.start(name)
        fleet.wait_owns(name)
    assert count_terminal(audit, run_ids) < RUNS, "every run ended before the restarts did"
    wait_for(
        lambda: fleet.running() and count_terminal(audit, run_ids) == RUNS,
        300,
        "every run to end",
        0.5,
    )
    fleet.stop()
    attempts, extra = _report(audit, run_ids)
    print(f"rolling restart: {extra} extra executions of {attempts} attempts")
    assert extra == 0, extra
