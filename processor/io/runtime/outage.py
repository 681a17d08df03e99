"""One dependency's outages as a long-running component sees them: one error line when an
outage starts, one info line when it ends, how many there were, and the backoff between tries.

A component that keeps trying (a reconnect, waiting for acknowledgements) reports every
failure with ``failed``; only the first of an outage is logged. The first success reports
``ok``, which logs the end with the outage's length and tries, and resets the backoff.
``until_available`` is that loop for a service's start, which waits for its dependencies.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from processor.core.backoff import retry_delay_s


class Outage:
    def __init__(self, dependency: str, log: logging.Logger) -> None:
        self.dependency = dependency
        self.count = 0  # outages so far
        self._log = log
        self._since: float | None = None
        self._failures = 0
        self.ended_at = float("-inf")  # monotonic time the last outage ended

    @property
    def active(self) -> bool:
        return self._since is not None

    @property
    def lasted_s(self) -> float:
        """How long the current outage has lasted so far (0 when there is none)."""
        return 0.0 if self._since is None else time.monotonic() - self._since

    def failed(self, problem: str) -> float:
        """Report a failure; returns how long to wait before the next try."""
        if self._since is None:
            self._since = time.monotonic()
            self.count += 1
            self._log.error(
                "%s unavailable: %s; waiting and retrying",
                self.dependency,
                problem,
                extra={"dependency": self.dependency, "outage": "started", "problem": problem},
            )
        delay = retry_delay_s(self._failures)
        self._failures += 1
        return delay

    def ok(self) -> None:
        """Report a success; ends the outage, if there was one."""
        if self._since is not None:
            seconds = time.monotonic() - self._since
            self._log.info(
                "%s available again after %.1f s (%d tries failed)",
                self.dependency,
                seconds,
                self._failures,
                extra={
                    "dependency": self.dependency,
                    "outage": "ended",
                    "outage_s": round(seconds, 3),
                    "failures": self._failures,
                },
            )
            self.ended_at = time.monotonic()
        self._since = None
        self._failures = 0


class SharedOutage:
    """One dependency's outage as several parties of one component see it (the worker's two
    database connections): it starts when the first party fails, and then every party is in
    doubt (its connection most likely went too) until it has succeeded once, so the outage
    ends when all of them are through it: one pair of lines, not one per party. Safe to call
    from the parties' threads."""

    def __init__(self, outage: Outage, parties: tuple[str, ...]) -> None:
        self.outage = outage
        self._parties = parties
        self._doubted: set[str] = set()
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.outage.active

    @property
    def count(self) -> int:
        return self.outage.count

    def failed(self, party: str, problem: str) -> float:
        with self._lock:
            self._doubted.update(self._parties)
            return self.outage.failed(problem)

    def ok(self, party: str) -> None:
        with self._lock:
            self._doubted.discard(party)
            if not self._doubted:
                self.outage.ok()

    def doubts(self, party: str) -> bool:
        """Whether ``party`` has yet to succeed since the outage started (it should try)."""
        with self._lock:
            return party in self._doubted


# How often a start that waits for a dependency lets its caller turn (keep its health probe
# fresh, serve its clients) between two tries.
_TURN_S = 0.1


def until_available(
    outage: Outage,
    attempt: Callable[[], None],
    unavailable: Callable[[Exception], str | None],
    stop: threading.Event,
    turn: Callable[[], None],
) -> bool:
    """Try ``attempt`` until it succeeds (True) or ``stop`` is set (False): how a service's
    start rides out a dependency that does not answer yet, as it would once running. A failure
    that ``unavailable`` describes is reported to ``outage`` (one line when the outage starts,
    one when it ends) and tried again after its backoff; any other failure is raised.
    ``turn`` is called before every try and about every 100 ms between two."""
    while True:
        turn()
        if stop.is_set():
            return False
        try:
            attempt()
        except Exception as exc:
            problem = unavailable(exc)
            if problem is None:
                raise
            retry_at = time.monotonic() + outage.failed(problem)
            while not stop.wait(max(0.0, min(_TURN_S, retry_at - time.monotonic()))):
                if time.monotonic() >= retry_at:
                    break
                turn()
            continue
        outage.ok()
        return True
