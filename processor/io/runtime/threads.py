"""The long-lived threads of one process (a processor or a worker), watched.

Every item a thread handles is isolated where it is handled (docs/guarantees.md#isolation),
so a thread should never end on an exception. Should one do so all the same (a bug outside
every item), the process would live on with a part of it dead: a stage thread that never
answers again, a sweep that never runs, a heartbeat that stopped. A watched thread that ends
on an exception is logged with its traceback and listed here, and the health endpoints
(io/runtime/health_http.py) then answer 503 on ``/healthz`` and ``/readyz``, saying which thread
died and why: a supervisor restarts the instance, which is safe (what it had not finished is
redone by the group).

The ``thread`` fault point (io/runtime/faults.py, ``thread=raise:<thread name>``) ends a watched
thread that way as it starts, for the tests.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.telemetry.logs import describe

log = logging.getLogger("ductor.threads")


class ThreadWatch:
    def __init__(self, faults: Faults = NO_FAULTS) -> None:
        self._faults = faults
        self._lock = threading.Lock()
        self._dead: dict[str, str] = {}  # thread name -> why it ended

    def thread(
        self, target: Callable[..., object], name: str, args: tuple[object, ...] = ()
    ) -> threading.Thread:
        """A daemon thread that runs ``target(*args)`` watched (not started yet)."""
        return threading.Thread(target=self._run, args=(name, target, args), name=name, daemon=True)

    def start(
        self, target: Callable[..., object], name: str, args: tuple[object, ...] = ()
    ) -> threading.Thread:
        """``thread``, started."""
        started = self.thread(target, name, args)
        started.start()
        return started

    def _run(self, name: str, target: Callable[..., object], args: tuple[object, ...]) -> None:
        try:
            self._faults.hit(Point.THREAD, name)
            target(*args)
        except BaseException as exc:  # whatever ended it is reported, not raised
            self.died(name, exc)

    def died(self, name: str, exc: BaseException) -> None:
        """The thread ``name`` ended on ``exc``: logged, and reported by the health probes."""
        why = describe(exc)
        with self._lock:
            self._dead[name] = why
        log.critical(
            "thread %s died: %s; the instance reports itself unhealthy (/healthz, /readyz)",
            name,
            why,
            exc_info=exc,
            extra={"dead_thread": name},
        )

    def problems(self) -> list[str]:
        """What the health probes say of the threads that died (none: empty)."""
        with self._lock:
            dead = sorted(self._dead.items())
        return [f"thread {name} died ({why})" for name, why in dead]
