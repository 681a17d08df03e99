"""Fault-injection points: named places in the engine where a test makes something happen at
exactly that moment (a concurrent write, a crash, a cut connection), so the bad interleaving
is forced instead of hoped for (in the spirit of FoundationDB's BUGGIFY).

Production never arms one: ``NO_FAULTS`` does nothing. A test in the same process passes a
``Faults`` with actions; a test that runs ``ductor process`` as a child arms points with
``DUCTOR_TEST_FAULTS`` (``after_commit=kill@3``: SIGKILL the process the third time the
point is reached; ``starting=term``: SIGTERM instead; ``assigned=ignore@1``: the code at the
point takes its bad branch that time, see ``Faults.forces``; ``stopped=hang``: the code
blocks there for good; ``tick=raise:r-7``: a plain
``Exception`` is raised there each time the point is reached for run ``r-7``), which the
processor announces loudly in its log. Points are constants here, so a test cannot arm a
point that does not exist.

The ``raise`` points stand for whatever nobody foresaw (a bug, input no door refused): each
proves that such an exception, met while handling one item, is isolated to that item (its
dead letter, its quarantine, its failed attempt, a log line and a count) and never reaches a
loop (docs/guarantees.md#isolation). The ``thread`` point, armed with a thread's name, ends
that thread the way an unforeseen exception would, to prove that a dead thread turns the
health endpoints unhealthy (io/runtime/threads.py).
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
    # A request statement committed (io/postgres/request_store.py); the wakeups its answers send are
    # not produced yet (the requests' run ids).
    AFTER_REQUESTS = "after_requests"
    # The request statement read the runs its signals name (io/postgres/request_store.py) and has
    # not recorded the signals yet, in its transaction (the run ids of the signals to record).
    SIGNALS_READ = "signals_read"
    # A sweep claimed kept signals for their dead letters (io/postgres/kept_signals.py); the dead
    # letters are not produced yet (the signals' run ids; hit only when it claimed some).
    KEPT_CLAIMED = "kept_claimed"
    # The broker acknowledged the dead letters of a record (or of a run's records); their
    # offsets are not stored yet, so a crash here makes the next owner dead-letter them again
    # (the run id, "" for a record refused before it named one).
    DEAD_LETTERED = "dead_lettered"
    # `ductor process` is starting: its signal handler is set, the processor not built yet.
    STARTING = "starting"
    # `python -m processor` is loading its modules (hit by processor/cli/early_stop.py, which
    # reads DUCTOR_TEST_FAULTS itself: nothing else is loaded yet).
    LOADING = "loading"
    # `ductor process` or `ductor worker` finished its shutdown; the interpreter's teardown
    # (the clients' destructors) comes next. Armed ``hang``: it never ends, as a teardown that
    # waits for a broker that is gone (cli/common.py's overrun bound ends the process).
    STOPPED = "stopped"
    # A consumer was given partitions (the partitions). Forced (``ignore``): the client lets
    # them go at once, unknown to the group, so the member holds nothing while the broker
    # counts them as its own (the stuck member of io/kafka/group_watch.py).
    ASSIGNED = "assigned"
    # A member joined its group again and closes its old consumer (io/kafka/group_watch.py's
    # RetiredConsumers). Forced (``ignore``): the close first hangs a while, as a client's
    # does when its group coordinator does not answer (seen after a broker restart).
    RETIRING = "retiring"
    # -- raise:<run id> points: an unforeseen exception while handling one item --------------
    # The processor's intake of one record (its run id, once decoded).
    INTAKE = "intake"
    # The request statement (io/postgres/request_store.py), on the request thread (the batch's run
    # ids).
    REQUEST = "request"
    # The plan of one answered request, built and carried out on the loop thread (its run id).
    REQUEST_PLAN = "request_plan"
    # The database stage, between the load and the ticks (the batch's run ids).
    TICK = "tick"
    # The stage's plan of one run, once the commit answered (its run id).
    DECIDE = "decide"
    # The executor carrying out one plan: its records produced (its run id).
    PRODUCE = "produce"
    # One record of a trigger's source topic, mapped (the run id it names).
    TRIGGER = "trigger"
    # One item of a sweep: a stuck run settled (its run id), a schedule fired (its name).
    SWEEP = "sweep"
    # A worker's step task: taken in (its run id), its claim answered, its result recorded
    # (the results lane's batch of run ids).
    TASK_INTAKE = "task_intake"
    TASK_CLAIMED = "task_claimed"
    TASK_RECORD = "task_record"
    # A watched thread's turn (its name): raise:<name> ends that thread (io/runtime/threads.py).
    THREAD = "thread"


# What an armed point does when reached; True: the code there takes its bad branch.
Action = Callable[..., bool | None]


class Faults:
    def __init__(self, actions: Mapping[Point, Action] | None = None) -> None:
        self._actions = dict(actions or {})

    @property
    def armed(self) -> list[str]:
        return sorted(self._actions)

    def at(self, point: Point) -> bool:
        """Whether ``point`` is armed (for a hot path that skips building the point's
        arguments when it is not)."""
        return point in self._actions

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
            try:
                point = Point(name)
            except ValueError:
                known = ", ".join(p.value for p in Point)
                raise ValueError(f"unknown fault point {name!r}; known: {known}") from None
            if what.startswith("raise:") and what != "raise:":
                actions[point] = RaiseFor(point, what.removeprefix("raise:"))
                continue
            action, _, nth = what.partition("@")
            if (
                action not in (*_SIGNALS, "ignore", "hang")
                or not (nth or "1").isdigit()
                or int(nth or "1") < 1
            ):
                raise ValueError(
                    f"fault {item!r}: expected {name}=kill, {name}=term, {name}=ignore or"
                    f" {name}=hang,"
                    f" optionally @N, or {name}=raise:<run id>"
                )
            n = int(nth or "1")
            if action == "hang":
                actions[point] = _HangOnHit(n)
            elif action == "ignore":
                actions[point] = _ForceOnHit(n)
            else:
                actions[point] = _SignalOnHit(_SIGNALS[action], n)
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


class _HangOnHit:
    """Block the n-th time the point is reached, for good: what a call that never returns
    does to its caller."""

    def __init__(self, nth: int) -> None:
        self._left = nth

    def __call__(self, *_args: object) -> None:
        self._left -= 1
        while self._left == 0:
            time.sleep(3600)


class RaiseFor:
    """Raise a plain ``Exception`` (which nothing catches by its type) each time the point is
    reached for ``target``: a run id (a schedule's, a thread's name) alone or among others."""

    def __init__(self, point: Point, target: str) -> None:
        self._point = point
        self.target = target

    def __call__(self, *args: object) -> None:
        for arg in args:
            hit = arg == self.target or (
                isinstance(arg, list | tuple | set | frozenset) and self.target in arg
            )
            if hit:
                raise Exception(f"injected fault at {self._point.value} for {self.target}")


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
