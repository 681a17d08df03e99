"""``ductor worker --isolation process``: each slot runs its steps in a child process of its
own, so a step can be killed and a crash takes down only its child.

A child is started (spawn: a fresh interpreter that imports the steps module, never a fork of
the worker's threads and connections) the first time its slot needs it and serves one step at
a time through a pipe. The slot's thread in the worker waits for the answer, passing heartbeats
and the tags the step sets on to the worker and a cancellation on to the child. A step that
outlives its deadline (and grace) is abandoned and its child killed at once, so nothing is left
running; a child that dies under its step (a native crash, ``os._exit``, the OOM killer) fails
the attempt with how it died, and the slot starts a fresh child for the next task. The worker's
own process never runs users' code.

What it costs: a task's data and result cross the pipe (pickled) and two threads on each side,
a millisecond or two per task on the 2-core dev machine (no-op steps: 0.56 times the runs per
second of thread isolation), and a child's start (the import time of the steps module) after
each crash or kill; docs/operations/workers.md, "Process isolation", has the figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import queue
import signal
import threading
import time
from dataclasses import replace
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from typing import Any

from processor.core.failures import no_traceback
from processor.core.step_task import decode_step_task, step_data
from processor.io.runtime.threads import ThreadWatch
from processor.worker.app import registry_for
from processor.worker.handles import StepHandle
from processor.worker.options import WorkerOptions
from processor.worker.runners import Ended, Over, begin, unforeseen
from processor.worker.steps import AttemptResult, execute_async_step, execute_step
from processor.worker.tasks import Task

log = logging.getLogger("ductor.worker")

_POLL_S = 0.05  # how often a slot looks at its task's state while its child works
# How the error of an attempt whose child process died under it begins.
PROCESS_DIED = "the step's process died"
_SPAWN = multiprocessing.get_context("spawn")


class ProcessRunner:
    """``slots`` slots (the worker's concurrency unless given), each a thread in the worker
    and a child process. With ``idle_exit_s`` a child left without work that long ends (the
    worker's reruns use a few children only now and then: core/claims.py)."""

    def __init__(
        self,
        options: WorkerOptions,
        ended: Ended,
        slots: int | None = None,
        idle_exit_s: float | None = None,
        name: str = "step",
        threads: ThreadWatch | None = None,
        over: Over | None = None,
    ) -> None:
        self._threads = threads or ThreadWatch()
        self._app = options.app
        self._ended = ended
        self._over = over
        self._idle_exit_s = idle_exit_s
        self._name = name
        self._jobs: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._slots = [_ChildSlot(self, i) for i in range(slots or options.concurrency)]
        self._started = False
        self._lock = threading.Lock()

    def submit(self, task: Task) -> None:
        with self._lock:
            if not self._started:
                self._started = True
                for slot in self._slots:
                    slot.start()
        self._jobs.put(task)

    def abandon(self, task: Task) -> None:
        task.abandoned = True  # its slot kills its child within _POLL_S

    def abandoned_alive(self) -> int:
        return 0  # an abandoned step's child is killed: nothing is left running

    def over(self, task: Task) -> None:
        """The execution of an abandoned task is over (its child killed, or it never
        started)."""
        if self._over is not None:
            self._over(task)

    def close(self) -> None:
        for _ in self._slots:
            self._jobs.put(None)


class _ChildSlot:
    def __init__(self, runner: ProcessRunner, number: int) -> None:
        self._runner = runner
        self._number = number
        self._child: BaseProcess | None = None
        self._conn: Connection | None = None

    def start(self) -> None:
        name = f"{self._runner._name}-proc-{self._number}"
        self._runner._threads.start(self._serve, name)

    def _serve(self) -> None:
        runner = self._runner
        try:
            while True:
                try:
                    task = runner._jobs.get(timeout=runner._idle_exit_s)
                except queue.Empty:
                    self._kill()  # idle: its child ends (a fresh one starts when needed)
                    continue
                if task is None:
                    return
                if task.abandoned:
                    runner.over(task)  # never started
                    continue
                # Its child first, loaded (a fresh one imports the steps module, seconds under
                # load): the step's timeout counts from when it can run, not while it starts.
                with contextlib.suppress(Exception):  # (one that cannot start: _run says why)
                    self._ensure_child()
                started = time.time_ns()
                if not begin(task):
                    runner._ended(task, None, started, started)
                    continue
                try:
                    outcome = self._run(task)
                except Exception as exc:  # around the step: its attempt fails, not the slot
                    self._kill()
                    outcome = unforeseen(task, exc)
                if outcome is not None:
                    runner._ended(task, outcome, started, time.time_ns())
                else:
                    runner.over(task)  # abandoned: its child was killed
        finally:
            self._kill()

    def _run(self, task: Task) -> AttemptResult | None:
        """The task's outcome from its child; None when it was abandoned (the child killed)."""
        conn = self._ensure_child()
        assert task.data is not None
        step = task.step
        try:
            # The task as its record value (the wire format: a compiled frozen dataclass does
            # not unpickle), without its inline data (a read-only mapping does not pickle: the
            # data is sent as a dict).
            wire = replace(step, data=None).encode()
            handle = task.handle
            conn.send(
                (
                    "run",
                    wire,
                    task.data.input,
                    dict(task.data.deps),
                    handle.deadline_ms,
                    handle.last_details,
                )
            )
        except (OSError, ValueError) as exc:  # the child died before it took the task
            return self._died(f"could not hand it the task: {exc}")
        cancel_sent = False
        while True:
            if task.abandoned:
                self._kill()
                return None
            if task.handle.cancelled and not cancel_sent:
                cancel_sent = True
                with contextlib.suppress(OSError, ValueError):
                    conn.send(("cancel",))
            try:
                if not conn.poll(_POLL_S):
                    continue
                message = conn.recv()
            except (EOFError, OSError):
                return self._died("")
            if message[0] == "beat":
                task.handle.heartbeat(message[1])
            elif message[0] == "tag":  # (sent before its step's "done")
                task.handle.tag(message[1], message[2])
            elif message[0] == "done":
                return AttemptResult(*message[1])

    def _died(self, detail: str) -> AttemptResult:
        child = self._child
        code = None
        if child is not None:
            child.join(1.0)
            code = child.exitcode
        self._kill()
        if code is not None and code < 0:
            how = f"killed by signal {signal.Signals(-code).name}"
        elif code is not None:
            how = f"exited with code {code}"
        else:
            how = "lost"
        why = f"{PROCESS_DIED} ({how}) while running it" + (f": {detail}" if detail else "")
        log.warning("a step's child process died: %s", how)
        return AttemptResult.failed(why, traceback=no_traceback(f"{PROCESS_DIED} ({how})"))

    def _ensure_child(self) -> Connection:
        if self._child is not None and self._child.is_alive() and self._conn is not None:
            return self._conn
        self._kill()
        ours, theirs = _SPAWN.Pipe(duplex=True)
        child = _SPAWN.Process(
            target=child_main,
            args=(theirs, self._runner._app),
            name=f"ductor-{self._runner._name}-{self._number}",
            daemon=True,
        )
        child.start()
        theirs.close()
        self._child, self._conn = child, ours
        _await_ready(child, ours)
        return ours

    def _kill(self) -> None:
        child, conn = self._child, self._conn
        self._child = self._conn = None
        if conn is not None:
            conn.close()
        if child is not None and child.is_alive():
            child.kill()
            child.join(5.0)


def _await_ready(child: BaseProcess, conn: Connection) -> None:
    """Until a fresh child has loaded the steps module (its first message), or died doing so
    (then the step it was to run fails saying how: _ChildSlot._died)."""
    try:
        while not conn.poll(_POLL_S):
            if not child.is_alive():
                return
        conn.recv()  # ("ready",)
    except (EOFError, OSError):
        return


# -- the child --------------------------------------------------------------------------------


class _ChildHandle(StepHandle):
    """The step's side in the child: heartbeats and tags go to the worker through the pipe."""

    __slots__ = ("_conn", "_lock")

    def __init__(
        self, deadline_ms: int, last_details: Any, conn: Connection, lock: threading.Lock
    ) -> None:
        super().__init__(deadline_ms, last_details)
        self._conn = conn
        self._lock = lock

    def heartbeat(self, details: str | None = None) -> None:
        super().heartbeat(details)
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._conn.send(("beat", details))

    def tag(self, key: str, value: str) -> None:
        super().tag(key, value)
        with self._lock, contextlib.suppress(OSError, ValueError):
            self._conn.send(("tag", key, value))


def child_main(conn: Connection, app: str | None) -> None:
    """A child's life: load the steps, then run what the slot sends, one at a time."""
    # The worker decides when a child ends: signals sent to the whole process group (a
    # Ctrl-C, a supervisor's SIGTERM) are for the worker, which stops its steps in order.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    registry = registry_for(app)
    conn.send(("ready",))
    lock = threading.Lock()
    jobs: queue.SimpleQueue[tuple[bytes, Any, dict[str, Any], int, Any] | None]
    jobs = queue.SimpleQueue()
    current: list[StepHandle] = []

    def read() -> None:
        try:
            while True:
                message = conn.recv()
                if message[0] == "run":
                    jobs.put(message[1:])
                elif message[0] == "cancel" and current:
                    current[-1].cancel()
        except (EOFError, OSError):
            jobs.put(None)  # the worker is gone: so is this child

    threading.Thread(target=read, name="from-worker", daemon=True).start()
    while (job := jobs.get()) is not None:
        wire, run_input, deps, deadline_ms, last_details = job
        step = decode_step_task(wire)
        handle = _ChildHandle(deadline_ms, last_details, conn, lock)
        current[:] = [handle]
        data = step_data(run_input, deps)
        if registry.is_async(step.step_type, step.step_version):
            outcome = asyncio.run(execute_async_step(registry, step, data, handle))
        else:
            outcome = execute_step(registry, step, data, handle)
        with lock:
            conn.send(("done", tuple(outcome)))


def _die_with_parent() -> None:
    """Linux: SIGKILL this child when the worker dies, even by SIGKILL (no orphans running
    users' code). Elsewhere the child ends when its pipe closes, between two steps."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
