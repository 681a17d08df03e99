"""The worker as a task queue, against the real broker and database, with a steps module of the
tests' own that records every execution of its code (counted_steps.py): a slow step holds one
slot and never the fast ones beside it; a step that hangs costs one slot, is abandoned at its
deadline, and never stops the worker (nor its SIGTERM); a step that kills its process is not
a crash loop: it runs once more, in a child process of its own, then its attempt fails and is
retried, while every other task goes on; the tasks a killed worker held run again beside the
others; a task whose attempt is stale is not run."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.core.envelope import Wakeup, decode_wakeup
from processor.core.routing import TIERS, TopicNames
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow
from processor.io.runtime.exit_codes import EXIT_ABANDONED

from . import counted_steps
from .children import Spawned
from .kcat import end_offset, read_partition
from .runs import count_terminal, run_statuses, step_attempts
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"


def _one_step(name: str, timeout_ms: int, attempts: int) -> WorkflowDef:
    return parse_workflow(
        {
            "name": name,
            "version": 1,
            "steps": [
                {
                    "name": "only",
                    "type": "counted",
                    "timeout_ms": timeout_ms,
                    "retry": {"max_attempts": attempts, "backoff_ms": 50},
                }
            ],
        }
    )


def _ids(prefix: str, count: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"{prefix}-{tag}-{i}" for i in range(count)]


def _worker(spawn: Any, settings: Settings, name: str, *flags: str, alone: bool = True) -> Spawned:
    """A worker, once it owns step partitions: every one of every tier's steps topic when it
    is ``alone`` in its group (they come topic by topic: a task sent before the topic of its
    tier was assigned would wait, and a step of a one-second deadline be skipped as stale)."""
    worker: Spawned = spawn(["worker", "--app", APP, *flags], settings, name)
    every = len(TIERS) * settings.step_partitions
    wait_for(
        lambda: worker.owned_partitions() >= (every if alone else 1),
        60,
        f"{name} to own step partitions",
    )
    return worker


def _alive(child: Spawned) -> bool:
    code = child.proc.poll()
    if code is not None:
        tail = child.log_path.read_text(errors="replace").splitlines()[-10:]
        pytest.fail(f"{child.log_path.stem} exited with {code}:\n" + "\n".join(tail))
    return True


def _ran_once_on_the_first_attempt(pg: psycopg.Connection[Any], run_ids: list[str]) -> None:
    """Each run succeeded, its step ran exactly once, on attempt 1."""
    counts = counted_steps.executions(pg)
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    for run_id in run_ids:
        assert counts[(run_id, "only", 1)] == 1, (run_id, step_attempts(pg, run_id))
        assert step_attempts(pg, run_id) == {"only": [(1, "succeeded")]}


def test_a_slow_step_holds_one_slot_and_never_the_fast_steps_beside_it(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    """10 runs whose step takes 8 s, then 300 whose step takes 5 ms (timeout 1 s, one
    attempt), one worker with 16 slots: every fast run succeeds on its first attempt."""
    counted_steps.install(pg)
    register_workflow(pg, _one_step("slow-fast", timeout_ms=1000, attempts=1))
    spawn(["process"], settings, "process")
    worker = _worker(spawn, settings, "worker", "--concurrency", "16")
    slow, fast = _ids("slow", 10), _ids("fast", 300)
    start_runs(settings, "slow-fast", slow, {"sleep_ms": 8000})
    wait_for(
        lambda: len(counted_steps.executions(pg, "slow-")) == 10, 30, "the slow steps to start"
    )
    start_runs(settings, "slow-fast", fast, {"sleep_ms": 5})
    wait_for(
        lambda: _alive(worker) and count_terminal(pg, fast) == len(fast),
        60,
        "every fast run to end",
    )
    _ran_once_on_the_first_attempt(pg, fast)
    # The slow ones outlived their deadline: their attempts timed out (and were abandoned).
    wait_for(lambda: count_terminal(pg, slow) == len(slow), 60, "the slow runs to time out")
    assert set(run_statuses(pg, slow).values()) == {"failed"}
    assert worker.terminate() == 0


def test_a_hung_step_costs_one_slot_is_abandoned_and_sigterm_still_stops_the_worker(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    """A step whose first attempt never returns, then 200 fast runs: they all run on the
    other slots; the hung one is abandoned at its deadline (and grace), its attempt times out
    and the next one succeeds; SIGTERM stops the worker at once, the hang notwithstanding."""
    counted_steps.install(pg)
    register_workflow(pg, _one_step("hangs", timeout_ms=2000, attempts=3))
    spawn(["process"], settings, "process")
    worker = _worker(spawn, settings, "worker", "--concurrency", "4", "--abandon-after", "1")
    (hung,) = _ids("hung", 1)
    fast = _ids("fast", 200)
    start_runs(settings, "hangs", [hung], {"hang_on": [1]})
    wait_for(lambda: bool(counted_steps.executions(pg, hung)), 30, "the hanging step to start")
    start_runs(settings, "hangs", fast)
    wait_for(
        lambda: _alive(worker) and count_terminal(pg, [hung, *fast]) == len(fast) + 1,
        60,
        "every run to end",
    )
    _ran_once_on_the_first_attempt(pg, fast)
    assert run_statuses(pg, [hung]) == {hung: "succeeded"}
    counts = counted_steps.executions(pg, hung)
    assert counts == {(hung, "only", 1): 1, (hung, "only", 2): 1}
    assert [
        line for line in worker.log_lines() if str(line.get("msg")).startswith("abandoned a step")
    ]
    # The hung thread is still there; SIGTERM stops the worker cleanly anyway.
    assert worker.terminate(timeout=15) == 0
    stopped = next(line for line in worker.log_lines() if line.get("msg") == "worker stopped")
    assert stopped["abandoned"] == 1 and stopped["exit_code"] == 0


def test_too_many_hung_steps_stop_the_worker_for_its_supervisor(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    """Past its bound of abandoned steps (none allowed here) a worker stops itself, with exit
    code 5 (not 3, a command's "not finished"); the fresh process its supervisor starts
    runs the next attempt."""
    counted_steps.install(pg)
    register_workflow(pg, _one_step("hangs-bounded", timeout_ms=1000, attempts=2))
    spawn(["process"], settings, "process")
    worker = _worker(spawn, settings, "worker", "--max-abandoned", "0", "--abandon-after", "0.5")
    (hung,) = _ids("hung", 1)
    start_runs(settings, "hangs-bounded", [hung], {"hang_on": [1]})
    wait_for(lambda: worker.proc.poll() is not None, 60, "the worker to stop itself")
    assert worker.proc.returncode == EXIT_ABANDONED == 5
    assert any(
        "abandoned steps are still running" in str(line.get("msg")) for line in worker.log_lines()
    )
    _worker(spawn, settings, "worker-2", alone=False)
    wait_for(lambda: count_terminal(pg, [hung]) == 1, 60, "the run to end")
    assert run_statuses(pg, [hung]) == {hung: "succeeded"}
    assert counted_steps.executions(pg, hung) == {(hung, "only", 1): 1, (hung, "only", 2): 1}


def test_a_step_that_kills_its_process_is_not_a_crash_loop(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    """A step whose first attempt kills its process (SIGKILL, as a native crash or the OOM
    killer would), then 200 fast runs, with a supervisor starting the worker again whenever
    it dies: the attempt runs once more, in a child process of its own, which it kills; that
    fails the attempt ("the step's process died") and its second attempt succeeds; the worker
    dies once; every fast run succeeds on its first attempt, its code run once."""
    settings = replace(settings, instance_timeout_s=3.0)
    counted_steps.install(pg)
    # A deadline longer than the crash takes (it costs the group's session timeout before
    # the next worker gets the partition): the attempt ends by the crashes, not by it.
    register_workflow(pg, _one_step("crashes", timeout_ms=120_000, attempts=3))
    spawn(["process"], settings, "process")
    (crasher,) = _ids("crash", 1)
    fast = _ids("fast", 200)
    deaths = 0
    worker = _worker(spawn, settings, "worker-0")

    def supervise() -> bool:
        nonlocal worker, deaths
        if worker.proc.poll() is not None:
            assert worker.proc.returncode == -signal.SIGKILL, worker.proc.returncode
            deaths += 1
            assert deaths <= 1, "the rerun took its worker down: it ran in the worker's process"
            worker = spawn(["worker", "--app", APP], settings, f"worker-{deaths}")
        return True

    start_runs(settings, "crashes", [crasher], {"crash_on": [1]})
    wait_for(lambda: supervise() and deaths == 1, 60, "the step to kill its worker")
    start_runs(settings, "crashes", fast)
    wait_for(
        lambda: supervise() and count_terminal(pg, [crasher, *fast]) == len(fast) + 1,
        180,
        "every run to end, the worker started again whenever it died",
        0.2,
    )
    assert deaths == 1
    _ran_once_on_the_first_attempt(pg, fast)
    assert run_statuses(pg, [crasher]) == {crasher: "succeeded"}
    assert counted_steps.executions(pg, crasher) == {
        (crasher, "only", 1): 2,  # the first execution and the one rerun
        (crasher, "only", 2): 1,
    }
    (error,) = pg.execute(
        "SELECT error FROM eec_step_result WHERE run_id = %s AND attempt = 1", (crasher,)
    ).fetchone() or (None,)
    assert error is not None and "the step's process died (killed by signal SIGKILL)" in error
    assert worker.terminate() == 0


def test_the_tasks_a_killed_worker_held_run_again_beside_the_others(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    """A worker with 4 slots runs 4 steps of 20 s and has claimed 8 fast tasks ahead of its
    slots when it is SIGKILLed. The next worker runs the 4 slow ones and the 4 fast ones its
    start permit covered again at once, each in a child
    process of its own (any of them may be the step that killed the worker), but the claims
    past the worker's start permit, which it never started, run as new ones; it takes new
    tasks as usual: the 4 slow reruns all start before any ends, fast runs started after the
    kill end before them, and every run succeeds on its first attempt (the fast tasks
    claimed ahead never ran before, and run once)."""
    settings = replace(settings, instance_timeout_s=3.0)
    counted_steps.install(pg)
    register_workflow(pg, _one_step("held-by-the-killed", timeout_ms=90_000, attempts=1))
    spawn(["process"], settings, "process")
    first = _worker(spawn, settings, "worker-0", "--concurrency", "4")
    slow, ahead, after = _ids("slow", 4), _ids("ahead", 8), _ids("after", 20)
    start_runs(settings, "held-by-the-killed", slow, {"sleep_ms": 20_000})
    wait_for(lambda: len(counted_steps.executions(pg, "slow-")) == 4, 30, "the slow steps to run")
    start_runs(settings, "held-by-the-killed", ahead)
    wait_for(
        lambda: _claimed(pg, ahead) == len(ahead),
        30,
        "the fast tasks to be claimed ahead of the busy slots",
    )
    assert not counted_steps.executions(pg, "ahead-"), "they waited for a slot"
    first.kill()
    second = _worker(spawn, settings, "worker-1", "--concurrency", "4", alone=False)
    start_runs(settings, "held-by-the-killed", after)
    wait_for(
        lambda: _alive(second) and sum(counted_steps.executions(pg, "slow-").values()) == 8,
        60,
        "the slow steps to run again",
    )
    assert count_terminal(pg, slow) == 0, "a slow rerun ended before the last one started"
    wait_for(
        lambda: _alive(second) and count_terminal(pg, [*ahead, *after]) == len(ahead + after),
        60,
        "the fast runs to end",
    )
    assert count_terminal(pg, slow) == 0, "the fast runs waited for the slow reruns"
    wait_for(lambda: count_terminal(pg, slow) == len(slow), 60, "the slow runs to end")
    _ran_once_on_the_first_attempt(pg, [*ahead, *after])
    assert set(run_statuses(pg, slow).values()) == {"succeeded"}
    pids: dict[str, int] = dict(
        pg.execute(  # each run's last execution
            "SELECT DISTINCT ON (run_id) run_id, pid FROM test_step_execution"
            " WHERE starts_with(run_id, 'slow-') OR starts_with(run_id, 'ahead-')"
            " ORDER BY run_id, id DESC"
        ).fetchall()
    )
    worker_pid = second.proc.pid
    assert all(pids[run_id] != worker_pid for run_id in slow), "a rerun ran in the worker"
    # The start permit covered the busy slots' worth of the claims ahead (nothing had ended:
    # the window is the 4 slots); the 4 claims past it never started, and ran as new ones.
    assert sum(pids[run_id] == worker_pid for run_id in ahead) == 4, pids
    assert second.terminate() == 0


def _claimed(pg: psycopg.Connection[Any], run_ids: list[str]) -> int:
    row = pg.execute(
        "SELECT count(*) FROM eec_step_attempt WHERE run_id = ANY(%s)", (run_ids,)
    ).fetchone()
    return int(row[0]) if row else 0


def test_the_results_a_run_records_together_wake_it_once(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    """A fan-out of 12 steps that end at the same moment: their results are recorded in
    one group, or a few, and each group wakes the run once (it was a wakeup per step, each a
    record for the broker and the processor to carry, all but one of them finding nothing
    new). Every step runs once and the run succeeds."""
    branches = [f"b{i}" for i in range(12)]
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": "fan-together",
                "version": 1,
                "steps": [
                    {"name": "first", "type": "counted"},
                    *({"name": b, "type": "counted", "depends_on": ["first"]} for b in branches),
                    {"name": "last", "type": "counted", "depends_on": branches},
                ],
            }
        ),
    )
    counted_steps.install(pg)
    spawn(["process"], settings, "process")
    worker = _worker(spawn, settings, "worker", "--concurrency", "16")
    (run_id,) = _ids("fan", 1)
    start_runs(
        settings,
        "fan-together",
        [run_id],
        {"by_node": {b: {"meet": len(branches)} for b in branches}},
    )
    wait_for(lambda: _alive(worker) and count_terminal(pg, [run_id]) == 1, 60, "the run to end")
    assert run_statuses(pg, [run_id]) == {run_id: "succeeded"}
    nodes = ["first", *branches, "last"]
    counts = counted_steps.executions(pg)
    assert {node: counts[(run_id, node, 1)] for node in nodes} == dict.fromkeys(nodes, 1)
    woken = _step_result_wakeups(settings, run_id)
    # first and last wake the run once each; the 12 branches, recorded together, far fewer
    # times than 12 (one group, or a few when a group was being written as others ended).
    assert 3 <= woken <= 6, woken
    assert worker.terminate() == 0


def _step_result_wakeups(settings: Settings, run_id: str) -> int:
    """The wakeups a worker sent ``run_id`` for its recorded results (every tier's topic,
    every partition)."""
    names = TopicNames(settings.topic_prefix)
    count = 0
    for topic in names.wakeup_topics():
        for partition in range(settings.wakeup_partitions):
            for written in read_partition(
                settings, topic, partition, 0, end_offset(settings, topic, partition)
            ):
                wakeup = decode_wakeup(written.value, 1 << 20)
                if isinstance(wakeup, Wakeup) and wakeup.run_id == run_id:
                    count += wakeup.reason == "step_result"
    return count
