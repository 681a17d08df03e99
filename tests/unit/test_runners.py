"""The step runners (worker/runners.py) around the steps: an exception nobody foresaw outside
a step function (the step's own are its attempt's failure: steps.py) fails that attempt, never
its slot, which goes on with the next task; the slots' threads are watched."""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from processor.core.model import StepOutcome
from processor.core.step_task import StepTask
from processor.io.runtime.faults import Faults
from processor.io.runtime.threads import ThreadWatch
from processor.worker.runners import ThreadRunner, begin
from processor.worker.steps import AttemptResult
from processor.worker.tasks import Task


def _task(run_id: str) -> Task:
    return Task(StepTask(run_id, "s", 1, "fast", 10**13), ("steps", 0), 0, [], None)


def test_an_exception_around_a_step_fails_its_attempt_and_the_slot_goes_on() -> None:
    ended: queue.SimpleQueue[tuple[str, AttemptResult | None]] = queue.SimpleQueue()

    def execute(task: Task) -> AttemptResult:
        if task.key.run_id == "bad":
            raise RuntimeError("the worker's own bug")
        return AttemptResult(StepOutcome.SUCCEEDED, {"ok": True})

    def on_ended(task: Task, outcome: AttemptResult | None, *_times: Any) -> None:
        ended.put((task.key.run_id, outcome))

    threads = ThreadWatch()
    runner = ThreadRunner(1, execute, on_ended, threads)  # one slot: both go through it
    runner.submit(_task("bad"))
    runner.submit(_task("good"))
    first, second = ended.get(timeout=10), ended.get(timeout=10)
    runner.close()
    assert first[0] == "bad" and first[1] is not None
    assert first[1].error == "the worker failed running it: RuntimeError: the worker's own bug"
    assert second == ("good", AttemptResult(StepOutcome.SUCCEEDED, {"ok": True}))
    assert threads.problems() == []


def test_a_slot_thread_that_dies_is_reported() -> None:
    threads = ThreadWatch(Faults.from_spec("thread=raise:step-1"))
    runner = ThreadRunner(1, lambda task: AttemptResult.failed("unused"), lambda *_: None, threads)
    runner.submit(_task("any"))
    runner.close()
    deadline, pause = time.monotonic() + 10, threading.Event()
    while not threads.problems() and time.monotonic() < deadline:
        pause.wait(0.01)  # the slot's thread dies as it starts
    assert threads.problems() == [
        "thread step-1 died (Exception: injected fault at thread for step-1)"
    ]


def test_an_abandoned_step_reports_its_execution_over_only_once_it_ends() -> None:
    """Abandoned at its deadline (a thread cannot be stopped), a step's slot is free at once,
    but its execution is over only when its function returns: then the runner says so
    (its concurrency slot is held until then: core/limits.py, rule 4). One abandoned
    before it began is over at once."""
    release = threading.Event()
    started = threading.Event()
    over: queue.SimpleQueue[str] = queue.SimpleQueue()

    def execute(task: Task) -> AttemptResult:
        started.set()
        release.wait(10)
        return AttemptResult(StepOutcome.SUCCEEDED, None)

    runner = ThreadRunner(
        1, execute, lambda *_: None, ThreadWatch(), lambda task: over.put(task.key.run_id)
    )
    hung = _task("hung")
    runner.submit(hung)
    assert started.wait(10)
    runner.abandon(hung)
    assert over.empty() and runner.abandoned_alive() == 1
    waiting = _task("never-began")
    waiting.abandoned = True
    runner.submit(waiting)  # taken by the fresh slot, which skips it
    assert over.get(timeout=10) == "never-began"
    release.set()
    assert over.get(timeout=10) == "hung"
    runner.close()


def test_a_step_starts_its_timeout_when_it_begins() -> None:
    """A task's deadline is its start plus its timeout (its close-by bound at most); one past
    its close-by bound, or a task from before start-to-close past its deadline, is
    skipped."""
    now = int(time.time() * 1000)
    task = Task(
        StepTask("r", "s", 1, "fast", now - 60_000, timeout_ms=2_000), ("steps", 0), 0, [], None
    )
    assert begin(task)
    assert now + 2_000 <= task.handle.deadline_ms <= int(time.time() * 1000) + 2_000
    closing = Task(
        StepTask("r", "s", 1, "fast", now, timeout_ms=2_000, close_by_ms=now + 500),
        ("steps", 0),
        0,
        [],
        None,
    )
    assert begin(closing) and closing.handle.deadline_ms == now + 500
    closed = Task(
        StepTask("r", "s", 1, "fast", now, timeout_ms=2_000, close_by_ms=now - 1),
        ("steps", 0),
        0,
        [],
        None,
    )
    assert not begin(closed)
    old = Task(StepTask("r", "s", 1, "fast", now - 1), ("steps", 0), 0, [], None)
    assert not begin(old)
