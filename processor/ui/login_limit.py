"""How many wrong tokens the login form takes (pure: the clock is an argument).

A wrong token counts against the address it came from and against all addresses together,
each over a sliding window. While either count is full the form refuses every try, the right
token included (otherwise the answer would still tell a guess apart), with 429 and how long to
wait; the refusals themselves are not counted, so waiting the time out is always enough. The
overall count bounds a guesser that spreads its tries over many addresses; its price is that,
while one keeps guessing, nobody new logs in (sessions already given go on working).

Memory is bounded: only addresses with a wrong try inside the window are kept, and at most
``overall`` tries are counted per window, so at most that many addresses are.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LoginLimits:
    per_client: int = 5
    overall: int = 30
    window_s: float = 60.0


class LoginLimiter:
    """The wrong tries of the window, per address and overall."""

    def __init__(self, limits: LoginLimits, clock: Callable[[], float]) -> None:
        self.limits = limits
        self._clock = clock
        self._by_client: dict[str, deque[float]] = {}
        self._overall: deque[float] = deque()

    def retry_after(self, client: str) -> float | None:
        """None: ``client`` may try now; else the seconds until it may."""
        now = self._clock()
        self._expire(now)
        waits = []
        mine = self._by_client.get(client)
        if mine is not None and len(mine) >= self.limits.per_client:
            waits.append(mine[0] + self.limits.window_s - now)
        if len(self._overall) >= self.limits.overall:
            waits.append(self._overall[0] + self.limits.window_s - now)
        return max(waits) if waits else None

    def failed(self, client: str) -> None:
        """A wrong token from ``client`` (one it was allowed to try: ``retry_after`` None)."""
        now = self._clock()
        self._expire(now)
        self._by_client.setdefault(client, deque()).append(now)
        self._overall.append(now)

    def succeeded(self, client: str) -> None:
        """The right token: ``client``'s own wrong tries are forgiven (the overall ones stay)."""
        self._by_client.pop(client, None)

    def tracked(self) -> int:
        """How many addresses have wrong tries in the window (for the tests of the bound)."""
        return len(self._by_client)

    def _expire(self, now: float) -> None:
        horizon = now - self.limits.window_s
        while self._overall and self._overall[0] <= horizon:
            self._overall.popleft()
        for client in [c for c, times in self._by_client.items() if times[-1] <= horizon]:
            del self._by_client[client]
        for times in self._by_client.values():
            while times[0] <= horizon:
                times.popleft()
