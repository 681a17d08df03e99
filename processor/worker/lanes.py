"""One connection of the worker's database on a thread of its own, and the requests waiting
for it (database.py has two: claims and results). The thread takes whatever has gathered since
its last statement and hands it to its ``serve``; a lost connection is reopened with the
outage's capped backoff and the same statement run again (every write the worker makes may be
redone)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from enum import Enum
from typing import Any, Literal, TypeVar

import psycopg

from processor.io.postgres.db_errors import Fault, classify
from processor.io.runtime.outage import SharedOutage
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.logs import first_line
from processor.worker.messages import Request

T = TypeVar("T")


class Stopped(Enum):
    STOPPED = "stopped"


STOPPED: Literal[Stopped.STOPPED] = Stopped.STOPPED


class Lane:
    """One connection on a thread of its own, and the requests waiting for it: the thread
    takes whatever has gathered since its last statement and hands it to ``serve``."""

    def __init__(
        self,
        name: str,
        connect: Callable[[], psycopg.Connection[Any]],
        serve: Callable[[list[Request]], bool],
        outage: SharedOutage,
        tick: Callable[[], bool] | None = None,
        tick_s: float = 1.0,
        threads: ThreadWatch | None = None,
    ) -> None:
        self.name = name
        self._connect = connect
        self._serve_batch = serve
        self._outage = outage
        self._tick = tick
        self._tick_s = tick_s
        self.conn: psycopg.Connection[Any] | None = None
        # (None: only wakes the thread, to see that it is closing)
        self.requests: queue.SimpleQueue[Request | None] = queue.SimpleQueue()
        self.closing = threading.Event()  # stop taking requests
        self.give_up = threading.Event()  # stop retrying through an outage
        self.thread = (threads or ThreadWatch()).thread(self._serve, f"worker-{name}")

    def start(self) -> None:
        self.thread.start()

    def put(self, request: Request) -> None:
        self.requests.put(request)

    def close(self, timeout_s: float) -> None:
        """Finish what was asked within ``timeout_s``, then give up on an outage."""
        self.closing.set()
        self.requests.put(None)
        if self.thread.is_alive():
            self.thread.join(timeout_s)
        self.give_up.set()
        if self.thread.is_alive():  # (never started when the worker stopped while starting)
            self.thread.join(1.0)

    def _serve(self) -> None:
        next_tick = time.monotonic() + self._tick_s
        while True:
            wait = max(0.0, next_tick - time.monotonic()) if self._tick else 1.0
            got: list[Request | None] = []
            try:
                got.append(self.requests.get(timeout=wait))
                while True:
                    got.append(self.requests.get_nowait())
            except queue.Empty:
                pass
            batch = [request for request in got if request is not None]
            if batch and not self._serve_batch(batch):
                return
            if self._tick is not None and time.monotonic() >= next_tick:
                next_tick = time.monotonic() + self._tick_s
                if not self._tick():
                    return
            if self.closing.is_set() and self.requests.empty():
                return

    def through_outages(
        self, action: Callable[[psycopg.Connection[Any]], T]
    ) -> T | Literal[Stopped.STOPPED]:
        while True:
            try:
                if self.conn is None:
                    self.conn = self._connect()
                result = action(self.conn)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # A lost connection (whether a lost write committed is unknown: every write
                # here may be redone), or a statement that lost a lock or its time: the same
                # statement again after the backoff.
                if self.conn is not None and classify(exc) is Fault.CONNECTION:
                    self.conn.close()
                    self.conn = None
                if self.give_up.wait(self._outage.failed(self.name, first_line(exc))):
                    return STOPPED
                continue
            except psycopg.Error:
                self._outage.ok(self.name)  # it answered: what it refused is the caller's
                raise
            self._outage.ok(self.name)
            return result

    def close_connection(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
