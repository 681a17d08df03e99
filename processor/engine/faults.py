"""Fault-injection points: named places in the engine where a test makes something happen at
exactly that moment (a concurrent write, a crash, a cut connection), so the bad interleaving
is forced instead of hoped for (in the spirit of FoundationDB's BUGGIFY).

Production never arms one: ``NO_FAULTS`` does nothing, and only a test passes a ``Faults``
with actions. Points are constants here, so a test cannot arm a point that does not exist.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from enum import StrEnum


class Point(StrEnum):
    # The stuck sweep selected these runs and is about to force-fail them (run ids).
    STUCK_SELECTED = "watchdog.stuck_selected"


Action = Callable[..., None]


class Faults:
    def __init__(self, actions: Mapping[Point, Action] | None = None) -> None:
        self._actions = dict(actions or {})

    def hit(self, point: Point, *args: object) -> None:
        """Run the action armed at ``point``, if any (a dict lookup when none is)."""
        action = self._actions.get(point)
        if action is not None:
            action(*args)


NO_FAULTS = Faults()
