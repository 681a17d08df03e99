"""The threads the database stages run on, off the poll loop: the commit path's
(engine/stage.py) and the request desk's (engine/request_desk.py), and the handle the loop
polls for a stage's result."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from processor.io.runtime.threads import ThreadWatch

R = TypeVar("R")


class StageThread:
    """The daemon thread the database stages run on, one after the other, for the process's
    life. Daemon: a hung query never keeps the process from exiting within its shutdown
    bound. One thread rather than one per batch: starting a thread (and waiting for it to
    start, through a Condition written in Python) cost each batch tens of microseconds, which
    a batch of a few runs at moderate load pays per run."""

    def __init__(self, name: str = "ductor-db", threads: ThreadWatch | None = None) -> None:
        self._stages: queue.SimpleQueue[InFlight[object]] = queue.SimpleQueue()
        # Not `_thread`: mypyc names an attribute's C field `__thread`, a keyword of GCC's
        # (thread-local storage), and the compiled build would not compile.
        self._runner: threading.Thread | None = None
        self._name = name
        self._threads = threads or ThreadWatch()  # should it die, the health probes say so

    def submit(self, stage: Callable[[], R]) -> InFlight[R]:
        in_flight = InFlight(stage)
        if self._runner is None:
            self._runner = self._threads.start(self._serve, self._name)
        self._stages.put(in_flight)  # type: ignore[arg-type]  # (run() only: its type is no matter)
        return in_flight

    def _serve(self) -> None:
        while True:
            self._stages.get().run()


class InFlight(Generic[R]):
    """A database stage submitted to the database thread. ``done`` and ``wait`` are one lock
    operation each, cheap enough for every turn of the poll loop (a Future's go through a
    Condition written in Python)."""

    def __init__(self, stage: Callable[[], R]) -> None:
        self._stage = stage
        self._finished = threading.Lock()
        self._finished.acquire()  # released by the database thread when the stage ends
        self._result: R | None = None
        self._error: BaseException | None = None

    def run(self) -> None:
        """Called on the database thread."""
        try:
            self._result = self._stage()
        except BaseException as exc:  # a bug: surfaced on the poll-loop thread by result()
            self._error = exc
        finally:
            self._finished.release()

    def done(self) -> bool:
        return self.wait(0)

    def wait(self, timeout_s: float | None) -> bool:
        """Whether the stage ended within ``timeout_s`` (None: wait for it)."""
        if timeout_s is None:
            ended = self._finished.acquire()
        elif timeout_s <= 0:
            ended = self._finished.acquire(blocking=False)
        else:
            ended = self._finished.acquire(timeout=timeout_s)
        if ended:
            self._finished.release()
        return ended

    def result(self, timeout_s: float | None = None) -> R:
        """The stage's result; TimeoutError if it did not end within ``timeout_s``."""
        if not self.wait(timeout_s):
            raise TimeoutError(f"the database stage did not end within {timeout_s} s")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result


__all__ = ["InFlight", "StageThread"]
