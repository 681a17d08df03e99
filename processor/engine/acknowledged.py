"""The outbox rows whose records the broker has, waiting to be deleted (engine/executor.py).

They go with the next commit statement, or in a statement of their own once enough have
gathered or the oldest has waited long enough. A dict, so that the same row acknowledged
twice (by its commit and by a relay) is deleted once.
"""

from __future__ import annotations

from collections.abc import Callable

from processor.core.shapes import OutboxKey

# Outbox deletions wait for the next commit statement, or go on their own once this many
# have gathered or the oldest has waited this long.
ACKS_PER_DELETE = 500
ACKS_WAIT_S = 0.2


class Acknowledged:
    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._rows: dict[OutboxKey, None] = {}
        self._since = 0.0  # when the oldest row waiting was acknowledged

    def __bool__(self) -> bool:
        return bool(self._rows)

    def add(self, rows: list[OutboxKey]) -> None:
        """Outbox rows whose records the broker has: deleted by the next database stage."""
        if rows and not self._rows:
            self._since = self._monotonic()
        self._rows.update(dict.fromkeys(rows))

    def due(self, now: float) -> bool:
        """Whether the rows waiting go on their own, without a commit to ride with."""
        return len(self._rows) >= ACKS_PER_DELETE or (
            bool(self._rows) and now - self._since >= ACKS_WAIT_S
        )

    def take(self) -> list[OutboxKey]:
        """At most ``ACKS_PER_DELETE`` rows for the next statement, in key order (two
        statements deleting overlapping rows lock them in the same order); the rest wait for
        the next one."""
        taken = sorted(self._rows)[:ACKS_PER_DELETE]
        for key in taken:
            del self._rows[key]
        if self._rows:
            self._since = self._monotonic()
        return taken


__all__ = ["ACKS_PER_DELETE", "ACKS_WAIT_S", "Acknowledged"]
