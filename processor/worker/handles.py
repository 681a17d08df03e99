"""The live side of an attempt a worker runs (``StepHandle``): what its step function's
context (worker/steps.py) and the worker share while it runs.
"""

from __future__ import annotations

import time
from typing import Any


class StepHandle:
    """The live side of one attempt, shared by its step function and the worker: heartbeats
    go one way (with the details of the last one, JSON text), and the tags the step set on its
    run (recorded with its result if it succeeds), cancellation the other. Plain attribute
    writes (atomic under the GIL): a heartbeat costs a clock read, ``cancelled`` a
    comparison. ``deadline_ms`` is set when the step starts (its start plus its timeout);
    ``last_details``: what an earlier execution of the step said with its last heartbeat."""

    __slots__ = (
        "_cancelled",
        "beat_at",
        "beats",
        "deadline_ms",
        "details",
        "last_details",
        "tags",
    )

    def __init__(self, deadline_ms: int, last_details: Any = None) -> None:
        self.deadline_ms = deadline_ms
        self.beat_at = time.monotonic()
        self.beats = 0
        self.details: str | None = None
        self.last_details = last_details
        self._cancelled = False
        self.tags: dict[str, str] = {}

    def heartbeat(self, details: str | None = None) -> None:
        if details is not None:
            self.details = details
        self.beat_at = time.monotonic()
        self.beats += 1

    def tag(self, key: str, value: str) -> None:
        """Keep tag ``key`` = ``value`` for the attempt's result (checked by the caller:
        StepContext.tag); a key set again takes its latest value."""
        self.tags[key] = value

    def cancel(self) -> None:
        self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled or time.time() * 1000 >= self.deadline_ms
