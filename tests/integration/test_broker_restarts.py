"""One processor and one worker, each the only member of its group, through three broker
restarts on the broker's data: after each restart, runs started just before it and just after it
all end. What this forces is the member that holds nothing after a restart (seen with the
KIP-848 protocol: a worker held no partition for 90 s while its topic had lag): each service
must notice and join its group again, or the round's runs never end.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from .audit import assert_results_applied, assert_transitions_applied_once
from .children import Spawned
from .restarts import LocalInfra
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

ROUNDS = 3  # (twenty cost three minutes of CI: test_stuck_member.py forces the stuck member;
#            this is the soak beside it, on real restarts)
RUNS_PER_SIDE = 10  # started before the restart, and as many after it
# Deadlines no restart outlasts: a timed-out attempt would hide a stall behind a retry.
_WORKFLOW = {
    "name": "restarts",
    "version": 1,
    "steps": [
        {"name": "first", "type": "fast", "timeout_ms": 300_000},
        {"name": "second", "type": "fast", "depends_on": ["first"], "timeout_ms": 300_000},
    ],
}


def _alive(child: Spawned) -> bool:
    code = child.proc.poll()
    if code is not None:
        tail = child.log_path.read_text(errors="replace").splitlines()[-10:]
        pytest.fail(f"{child.log_path.stem} exited with {code}:\n" + "\n".join(tail))
    return True


def _rejoins(child: Spawned) -> int:
    return sum(1 for line in child.log_lines() if line.get("msg") == "joining the group again")


def test_a_processor_and_a_worker_go_on_after_each_of_three_broker_restarts(
    settings: Settings,
    audit: psycopg.Connection[Any],
    spawn: Any,
    local_infra: LocalInfra,
) -> None:
    register_workflow(audit, parse_workflow(_WORKFLOW))
    processor = spawn(["process"], settings, "process")
    worker = spawn(["worker"], settings, "worker")
    warm = ["restarts-warm"]
    start_runs(settings, "restarts", warm)
    wait_for(lambda: count_terminal(audit, warm) == 1, 60, "the first run to end")
    every: list[str] = [*warm]
    rounds: list[tuple[float, float]] = []
    for n in range(ROUNDS):
        before = [f"restarts-{n}-before-{i}" for i in range(RUNS_PER_SIDE)]
        after = [f"restarts-{n}-after-{i}" for i in range(RUNS_PER_SIDE)]
        start_runs(settings, "restarts", before)
        down_s = local_infra.restart_kafka()
        back_at = time.monotonic()
        start_runs(settings, "restarts", after)
        ids = before + after
        wait_for(
            lambda ids=ids: (
                _alive(processor)  # type: ignore[misc]
                and _alive(worker)
                and count_terminal(audit, ids) == len(ids)
            ),
            120,
            f"round {n + 1}'s runs to end after the broker's restart",
            0.2,
        )
        rounds.append((down_s, time.monotonic() - back_at))
        every += ids
    assert processor.terminate() == 0
    assert worker.terminate() == 0
    assert set(run_statuses(audit, every).values()) == {"succeeded"}
    assert_results_applied(audit, every)
    assert_transitions_applied_once(audit)
    print(
        f"{ROUNDS} broker restarts: down {min(d for d, _ in rounds):.1f}-"
        f"{max(d for d, _ in rounds):.1f} s; every round's runs ended within "
        f"{max(e for _, e in rounds):.1f} s of the broker answering (median "
        f"{sorted(e for _, e in rounds)[ROUNDS // 2]:.1f} s); the processor joined its group "
        f"again {_rejoins(processor)} time(s), the worker {_rejoins(worker)}"
    )
