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
from processor.io.faults import Faults
from processor.io.threads import ThreadWatch
from processor.worker.runners import ThreadRunner
from processor.worker.steps import Outcome
from processor.worker.tasks import Task


def _task(run_id: str) -> Task:
    return Task(StepTask(run_id, "s", 1, "fast", 10**13), ("steps", 0), 0, [], None)


def test_an_exception_around_a_step_fails_its_attempt_and_the_slot_goes_on() -> None:
    ended: queue.SimpleQueue[tuple[str, Outcome | None]] = queue.SimpleQueue()

    def execute(task: Task) -> Outcome:
        if task.key.run_id == "bad":
            raise RuntimeError("the worker's own bug")
        return Outcome(StepOutcome.SUCCEEDED, {"ok": True})

    def on_ended(task: Task, outcome: Outcome | None, *_times: Any) -> None:
        ended.put((task.key.run_id, outcome))

    threads = ThreadWatch()
    runner = ThreadRunner(1, execute, on_ended, threads)  # one slot: both go through it
    runner.submit(_task("bad"))
    runner.submit(_task("good"))
    first, second = ended.get(timeout=10), ended.get(timeout=10)
    runner.close()
    assert first[0] == "bad" and first[1] is not None
    assert first[1].error == "the worker failed running it: RuntimeError: the worker's own bug"
    assert second == ("good", Outcome(StepOutcome.SUCCEEDED, {"ok": True}))
    assert threads.problems() == []


def test_a_slot_thread_that_dies_is_reported() -> None:
    threads = ThreadWatch(Faults.from_spec("thread=raise:step-1"))
    runner = ThreadRunner(1, lambda task: Outcome.failed("unused"), lambda *_: None, threads)
    runner.submit(_task("any"))
    runner.close()
    deadline, pause = time.monotonic() + 10, threading.Event()
    while not threads.problems() and time.monotonic() < deadline:
        pause.wait(0.01)  # the slot's thread dies as it starts
    assert threads.problems() == [
        "thread step-1 died (Exception: injected fault at thread for step-1)"
    ]
