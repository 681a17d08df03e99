"""When the worker's loop does what, on the injected clock (io/runtime/clock.py): how long a turn
waits for records and for answers, when the running steps are watched and the stats logged,
and how long a stopping worker has left. A unit test drives it with a ManualClock."""

from __future__ import annotations

from processor.io.runtime.clock import Clock

# How long an idle loop blocks in poll, and how long a busy one waits for its slots and its
# database lanes between two polls.
IDLE_POLL_S = 0.1
BUSY_WAIT_S = 0.002
# How often running steps are checked against their deadlines and heartbeat timeouts.
WATCH_EVERY_S = 0.05


class Turns:
    def __init__(self, clock: Clock, stats_every_s: float) -> None:
        self._clock = clock
        self._stats_every_s = stats_every_s
        self._next_watch = 0.0
        self._next_stats = clock.monotonic() + stats_every_s
        self.stopping_since: float | None = None
        self._stop_by = 0.0

    def now(self) -> float:
        return self._clock.monotonic()

    @staticmethod
    def poll_wait(holding: int, backlog: int, in_flight: int) -> float:
        """A loop with nothing held, nothing in its backlog and nothing on its way to the
        broker blocks in poll a while (it has nothing else to do); any other, not at all."""
        return IDLE_POLL_S if not holding and not backlog and not in_flight else 0.0

    @staticmethod
    def send_now(holding: int, backlog: int, in_flight: int) -> bool:
        """Whether a loop with records on their way and nothing else to do sends them at
        once (the producer's flush skips its linger, which would hold them for more to join
        a batch while none will come) and waits for their reports there. A loop with work
        goes on with it, and the linger batches as before: a cork, not a timer."""
        return bool(in_flight) and not holding and not backlog

    @staticmethod
    def answers_wait(polled: int, holding: int) -> float:
        """A turn that polled nothing while tasks are held waits a moment for the slots' and
        the lanes' answers (instead of spinning); else it takes what is there."""
        return BUSY_WAIT_S if not polled and holding else 0.0

    def watch_due(self, now: float) -> bool:
        """Whether the running steps are to be watched at ``now`` (every WATCH_EVERY_S)."""
        if now < self._next_watch:
            return False
        self._next_watch = now + WATCH_EVERY_S
        return True

    def stats_due(self, now: float) -> bool:
        """Whether the stats line is due at ``now`` (every DUCTOR_STATS_LOG_INTERVAL_S)."""
        if now < self._next_stats:
            return False
        self._next_stats = now + self._stats_every_s
        return True

    def begin_stopping(self, now: float, wait_s: float) -> None:
        """The worker stops at ``now`` and waits at most ``wait_s`` for its running steps."""
        self.stopping_since = now
        self._stop_by = now + wait_s

    def left_s(self) -> float:
        """What is left of the shutdown bound (none unless the worker is stopping)."""
        if self.stopping_since is None:
            return 0.0
        return max(0.0, self._stop_by - self._clock.monotonic())
