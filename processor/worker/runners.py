"""Where step functions run: a pool of threads for plain functions, an event loop for
``async def`` ones (process isolation is in isolation.py). Each runs a task as it comes and
reports it the moment it ends, so a slow step holds one slot, never a batch.

A step that outlives its deadline is *abandoned* by the worker: its slot is given back at once
(a new thread takes the hung one's place; an async step is cancelled) and whatever it returns
later is dropped. Python cannot kill a thread, so a hung one lives on: ``abandoned_alive``
counts them, and past its bound the worker stops (worker.py) for its supervisor to start a
fresh process. Every thread here is a daemon: a hung step never holds the process at exit,
and watched (io/runtime/threads.py): one that dies turns the worker unhealthy. A step's own
exception is its attempt's failure (steps.py); one the runner meets around it, which nobody foresaw,
fails that attempt too, never its slot.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, Protocol

from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.logs import describe
from processor.worker.steps import AttemptResult
from processor.worker.tasks import Task

log = logging.getLogger("ductor.worker")

# What a runner calls when a task's step ended (from the runner's thread): the task, its
# outcome (None: not started, its deadline passed while it waited for a slot), and when it
# started and ended (time.time_ns).
Ended = Callable[[Task, AttemptResult | None, int, int], None]
# What a runner calls (from its thread) once the execution of a task it was told to abandon
# is over: its function returned at last, its child process was killed, or it never started.
# Until then the execution runs, and holds its concurrency slot (core/limits.py, rule 4).
Over = Callable[[Task], None]


def _nothing(task: Task) -> None:
    """An ``Over`` that does nothing (a runner whose owner does not ask)."""


def begin(task: Task) -> bool:
    """A slot takes the task: False if it is past its time (a task from before start-to-close
    whose deadline passed while it waited; one that cannot end by its schedule-to-close
    bound): it is skipped. Otherwise its step starts now, and so do its heartbeat clock and
    its timeout (its deadline: now plus its timeout)."""
    step = task.step
    now_ms = int(time.time() * 1000)
    if step.timeout_ms is None:
        if now_ms >= step.deadline_ms:
            return False
    elif step.close_by_ms is not None and now_ms >= step.close_by_ms:
        return False
    else:
        task.handle.deadline_ms = step.deadline_from(now_ms)
    task.handle.beat_at = time.monotonic()
    task.started_ns = time.monotonic_ns()
    return True


class Runner(Protocol):
    def submit(self, task: Task) -> None: ...

    def abandon(self, task: Task) -> None: ...

    def abandoned_alive(self) -> int: ...

    def close(self) -> None: ...


class ThreadRunner:
    """Plain step functions on ``size`` threads (the worker's slots). Tasks are handed over
    as soon as they are claimed and wait in one queue: a free thread takes the next at once,
    without a round trip through the worker's loop, and a slow step holds only its own
    thread."""

    def __init__(
        self,
        size: int,
        execute: Callable[[Task], AttemptResult],
        ended: Ended,
        threads: ThreadWatch | None = None,
        over: Over = _nothing,
    ) -> None:
        self._threads = threads or ThreadWatch()
        self._size = size
        self._execute = execute
        self._ended = ended
        self._over = over
        self._jobs: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._lock = threading.Lock()  # the hand-over between a thread and ``abandon``
        self._running: dict[Task, _Slot] = {}
        self._slots: list[_Slot] = []
        self._abandoned: set[_Slot] = set()
        self._made = 0

    def submit(self, task: Task) -> None:
        with self._lock:
            if len(self._slots) < self._size:
                self._start_slot()
        self._jobs.put(task)

    def abandon(self, task: Task) -> None:
        """Give the task's slot back: a new thread takes the place of the one running it."""
        with self._lock:
            task.abandoned = True
            slot = self._running.pop(task, None)
            if slot is None:
                return  # not picked up yet: the thread that picks it skips it
            slot.abandoned = True
            self._slots.remove(slot)
            self._abandoned.add(slot)
            self._start_slot()

    def abandoned_alive(self) -> int:
        with self._lock:
            return len(self._abandoned)

    def close(self) -> None:
        with self._lock:
            count = len(self._slots)
        for _ in range(count):
            self._jobs.put(None)

    def _start_slot(self) -> None:
        self._made += 1
        slot = _Slot()
        self._slots.append(slot)
        self._threads.start(self._serve, f"step-{self._made}", (slot,))

    def _serve(self, slot: _Slot) -> None:
        while True:
            task = self._jobs.get()
            if task is None:
                return
            with self._lock:  # (no `continue` inside: mypyc compiles this module)
                abandoned = task.abandoned
                if not abandoned:
                    self._running[task] = slot
            if abandoned:
                self._over(task)  # never started
                continue
            started = time.time_ns()
            if not begin(task):
                with self._lock:
                    self._running.pop(task, None)
                self._ended(task, None, started, started)
                continue
            outcome = _executed(self._execute, task)
            ended = time.time_ns()
            with self._lock:
                self._running.pop(task, None)
                given_up = slot.abandoned
                if given_up:
                    self._abandoned.discard(slot)
            if given_up:
                log.warning(
                    "an abandoned step ended %.1f s after it started; its result is dropped",
                    (ended - started) / 1e9,
                    extra={"run_id": task.key.run_id, "node": task.key.node},
                )
                self._over(task)
                return  # its replacement serves in its place
            self._ended(task, outcome, started, ended)


def _executed(execute: Callable[[Task], AttemptResult], task: Task) -> AttemptResult:
    try:
        return execute(task)
    except Exception as exc:  # around the step, not its own (steps.py catches those)
        return unforeseen(task, exc)


def unforeseen(task: Task, exc: Exception) -> AttemptResult:
    """The attempt's failure when running it raised what nobody foresaw outside the step."""
    log.error(
        "running a step raised an unexpected exception; its attempt fails: %s",
        describe(exc),
        exc_info=exc,
        extra={"run_id": task.key.run_id, "node": task.key.node, "stage": "run"},
    )
    return AttemptResult.failed(f"the worker failed running it: {describe(exc)}")


class _Slot:
    __slots__ = ("abandoned",)

    def __init__(self) -> None:
        self.abandoned = False


class AsyncRunner:
    """``async def`` step functions, on one event loop on a thread of its own (started with
    the first async task). An abandoned step is cancelled; one that keeps running anyway (it
    swallowed the cancellation) is counted until it ends."""

    def __init__(
        self,
        execute: Callable[[Task], Coroutine[Any, Any, AttemptResult]],
        ended: Ended,
        threads: ThreadWatch | None = None,
        over: Over = _nothing,
    ) -> None:
        self._threads = threads or ThreadWatch()
        self._execute = execute
        self._ended = ended
        self._over = over
        self._loop: asyncio.AbstractEventLoop | None = None
        self._futures: dict[Task, Future[None]] = {}
        self._abandoned: set[Task] = set()
        self._begun: set[Task] = set()  # tasks whose coroutine started
        self._lock = threading.Lock()

    def submit(self, task: Task) -> None:
        loop = self._loop or self._start()
        future = asyncio.run_coroutine_threadsafe(self._run(task), loop)
        with self._lock:
            self._futures[task] = future

    def abandon(self, task: Task) -> None:
        with self._lock:
            task.abandoned = True
            future = self._futures.pop(task, None)
            begun = task in self._begun
            if future is not None and begun:
                self._abandoned.add(task)
        if future is not None:
            future.cancel()
            if not begun:  # its coroutine never runs: its execution is over
                self._over(task)

    def abandoned_alive(self) -> int:
        with self._lock:
            return len(self._abandoned)

    def close(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    def _start(self) -> asyncio.AbstractEventLoop:
        loop = self._loop = asyncio.new_event_loop()
        self._threads.start(loop.run_forever, "step-async")
        return loop

    async def _run(self, task: Task) -> None:
        with self._lock:
            given_up = task.abandoned
            if not given_up:
                self._begun.add(task)
        if given_up:
            return  # abandoned before it began (abandon() said it is over)
        started = time.time_ns()
        if not begin(task):
            with self._lock:
                self._begun.discard(task)
            self._ended(task, None, started, started)
            return
        try:
            outcome = await self._execute(task)
        except Exception as exc:  # around the step, not its own (steps.py catches those)
            outcome = unforeseen(task, exc)
        finally:  # (also when it was cancelled: CancelledError goes on from here)
            with self._lock:
                self._futures.pop(task, None)
                self._abandoned.discard(task)
                self._begun.discard(task)
            if task.abandoned:
                self._over(task)
        if not task.abandoned:
            self._ended(task, outcome, started, time.time_ns())
