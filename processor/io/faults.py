"""Fault-injection points: named places in the engine where a test makes something happen at
exactly that moment (a concurrent write, a crash, a cut connection), so the bad interleaving
is forced instead of hoped for (in the spirit of FoundationDB's BUGGIFY).

Production never arms one: ``NO_FAULTS`` does nothing. A test in the same process passes a
``Faults`` with actions; a test that runs ``ductor process`` as a child arms points with
``DUCTOR_TEST_FAULTS`` (``after_commit=kill@3``: SIGKILL the process the third time the
point is reached; ``starting=term``: SIGTERM instead; ``assigned=ignore@1``: the code at the
point takes its bad branch that time, see ``Faults.forces``), which the processor announces
loudly in its log. Points are constants here, so a test cannot arm a point that does not
exist.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from enum import StrEnum

log = logging.getLogger("ductor.faults")


class Point(StrEnum):
    # The stuck sweep selected these runs and is about to force-fail them (run ids).
    STUCK_SELECTED = "watchdog.stuck_selected"
    # A batch committed; its effects are not produced yet (committed run ids).
    AFTER_COMMIT = "after_commit"
    # A request statement committed (io/request_store.py); the wakeups its answers send are
    # not produced yet (the requests' run ids).
    AFTER_REQUESTS = "after_requests"
    # A sweep claimed kept signals for their dead letters (io/kept_signals.py); the dead
    # letters are not produced yet (the signals' run ids; hit only when it claimed some).
    KEPT_CLAIMED = "kept_claimed"
    # The broker acknowledged the dead letters of a record (or of a run's records); their
    # offsets are not stored yet, so a crash here makes the next owner dead-letter them again
    # (the run id, "" for a record refused before it named one).
    DEAD_LETTERED = "dead_lettered"
    # `ductor process` is starting: its signal handler is set, the processor not built yet.
    STARTING = "starting"
    # `python -m processor` is loading its modules (hit by processor/early_stop.py, which
    # reads DUCTOR_TEST_FAULTS itself: nothing else is loaded yet).
    LOADING = "loading"
    # A consumer was given partitions (the partitions). Forced (``ignore``): the client lets
    # them go at once, unknown to the group, so the member holds nothing while the broker
    # counts them as its own (the stuck member of io/group_watch.py).
    ASSIGNED = "assigned"
    # A member joined its group again and closes its old consumer (io/group_watch.py's
    # RetiredConsumers). Forced (``ignore``): the close first hangs a while, as a client's
    # does when its group coordinator does not answer (seen after a broker restart).
    RETIRING = "retiring"


# What an armed point does when reached; True: the code there takes its bad branch.
Action = Callable[..., bool | None]


class Faults:
    def __init__(self, actions: Mapping[Point, Action] | None = None) -> None:
        self._actions = dict(actions or {})

    @property
    def armed(self) -> list[str]:
        return sorted(self._actions)

    def hit(self, point: Point, *args: object) -> None:
        """Run the action armed at ``point``, if any (a dict lookup when none is)."""
        action = self._actions.get(point)
        if action is not None:
            action(*args)

    def forces(self, point: Point, *args: object) -> bool:
        """Whether the action armed at ``point`` forces the bad branch there this time."""
        action = self._actions.get(point)
        return action is not None and bool(action(*args))

    @staticmethod
    def from_spec(spec: str) -> Faults:
        """Faults from ``point=kill@n,...`` (``DUCTOR_TEST_FAULTS``); ValueError if malformed."""
        actions: dict[Point, Action] = {}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            name, _, what = item.partition("=")
            action, _, nth = what.partition("@")
            try:
                point = Point(name)
            except ValueError:
                known = ", ".join(p.value for p in Point)
                raise ValueError(f"unknown fault point {name!r}; known: {known}") from None
            if (
                action not in (*_SIGNALS, "ignore")
                or not (nth or "1").isdigit()
                or int(nth or "1") < 1
            ):
                raise ValueError(
                    f"fault {item!r}: expected {name}=kill, {name}=term or {name}=ignore,"
                    " optionally @N"
                )
            n = int(nth or "1")
            actions[point] = (
                _ForceOnHit(n) if action == "ignore" else _SignalOnHit(_SIGNALS[action], n)
            )
        return Faults(actions)


# kill: no cleanup runs, exactly like a crash (the OOM killer, a power cut) at that point;
# term: what an orchestrator sends to stop the process, at exactly that point.
_SIGNALS = {"kill": signal.SIGKILL, "term": signal.SIGTERM}


class _SignalOnHit:
    """Send this process a signal the n-th time the point is reached."""

    def __init__(self, sig: signal.Signals, nth: int) -> None:
        self._signal = sig
        self._left = nth

    def __call__(self, *_args: object) -> None:
        self._left -= 1
        if self._left == 0:
            os.kill(os.getpid(), self._signal)


class _ForceOnHit:
    """Force the bad branch the n-th time the point is reached (that time only)."""

    def __init__(self, nth: int) -> None:
        self._left = nth

    def __call__(self, *_args: object) -> bool:
        self._left -= 1
        return self._left == 0


NO_FAULTS = Faults()


def skew_wall_clock(ahead_ms: int) -> None:
    """Make this process's wall clock (``time.time``, ``time.time_ns``) run ``ahead_ms``
    ahead, as a machine whose clock drifted would (``DUCTOR_TEST_CLOCK_AHEAD_MS``, the
    clock-skew test). In the process, not with libfaketime: under libfaketime every timed
    wait of librdkafka (absolute CLOCK_REALTIME deadlines) lasts the offset longer, so a
    0.5 s poll took 8 s, then 24.5 s, with the clock 8 s ahead."""
    if not ahead_ms:
        return
    real_time, real_time_ns = time.time, time.time_ns
    time.time = lambda: real_time() + ahead_ms / 1000
    time.time_ns = lambda: real_time_ns() + ahead_ms * 1_000_000
    log.warning("TEST ONLY: this process's wall clock runs %d ms ahead", ahead_ms)
