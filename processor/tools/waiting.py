"""Polling with a deadline: how the tools (and the integration tests) wait for something
another process does, never a sleep of a guessed length.

``polls`` is the loop, for a body that does more than ask (samples, progress lines, faults
timed by what it sees); ``eventually`` is the loop around one question. Both check before
they give up: the body runs at once, and once more after the last pause, so a condition is
never given up on before its deadline, only at or after it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator


def polls(timeout_s: float, interval_s: float) -> Iterator[float]:
    """Yields the monotonic time at once, then every ``interval_s``, until a yield comes
    back after ``timeout_s`` has passed. A loop over it that ends without ``break`` or
    ``return`` timed out."""
    deadline = time.monotonic() + timeout_s
    while True:
        yield time.monotonic()
        if time.monotonic() > deadline:
            return
        time.sleep(interval_s)  # the pause between two polls, bounded by the deadline


def eventually(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Whether ``predicate`` came true within ``timeout_s``, asked every ``interval_s``."""
    return any(predicate() for _ in polls(timeout_s, interval_s))
