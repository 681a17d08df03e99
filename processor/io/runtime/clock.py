"""The one clock a composition root injects into the loops it builds.

A loop reads two times: monotonic seconds, for its own waits and intervals (never shifted by
NTP), and wall milliseconds, this process's clock, which ``DatabaseClock`` corrects to
Postgres's for anything a run's state is judged by. Taking both from one injected value,
instead of calling ``time`` where they are needed, is what lets a unit test drive a loop's
idle timeouts, back-pressure and deadline watches by moving a fake clock forward.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Clock:
    monotonic: Callable[[], float] = time.monotonic  # seconds, for intervals
    wall_ms: Callable[[], int] = _wall_ms  # this process's wall clock, in milliseconds


SYSTEM_CLOCK = Clock()


class ManualClock:
    """A clock that moves only when told (tests; a replay): ``clock`` is its ``Clock``."""

    def __init__(self, monotonic_s: float = 1_000.0, wall_ms: int = 1_700_000_000_000) -> None:
        self._monotonic_s = monotonic_s
        self._wall_ms = wall_ms
        self.clock = Clock(monotonic=lambda: self._monotonic_s, wall_ms=lambda: self._wall_ms)

    def advance(self, seconds: float) -> None:
        self._monotonic_s += seconds
        self._wall_ms += round(seconds * 1000)
