"""How far ahead of its free slots a worker claims tasks.

A claim is a round trip to Postgres, and a claimed task counts as started: if the worker
dies, every task it had claimed and not finished is run again by the next worker as a rerun,
in a child process of its own (core/claims.py). Claiming too little leaves fast steps waiting
for round trips; claiming too much turns a crash into a long line of reruns. So the worker
claims ahead about what its slots finish in four claim round trips, plus two tasks per slot:

    ahead = 2 * slots + 4 * (steps ended per second) * (claim round trip, s)

bounded by ``cap`` (the prefetch). Fast steps then keep the claims flowing (the bound grows
until round trips overlap the work; with two, a claim's own wait behind the other statements
kept the pipeline short), while slow steps keep it near two tasks per slot. Both
rates are smoothed (exponentially weighted), from times the caller passes in: no clock here.

A claimed task's start-to-close timeout counts from its claim until the worker reports a
later start, which it does once the task is on a slot. A task claimed so far ahead that it
waits longer than its timeout could be timed out by the coordinator while it waits here
(met under load, when claims take hundreds of milliseconds and the four round trips of work
are seconds of it): ``within_horizon`` keeps a task's expected wait under a quarter of its
timeout.
"""

from __future__ import annotations

_WINDOW_S = 0.25  # steps ended are counted over windows this long
_WEIGHT = 0.5  # weight of the newest window or round trip in the averages
_TRIPS = 4  # round trips of work claimed ahead
_HORIZON = 0.25  # the longest expected wait of a claimed task, as a share of its timeout


class ClaimPace:
    def __init__(self, slots: int, cap: int, now: float) -> None:
        self.slots = slots
        self.cap = max(cap, slots)
        self.rate = 0.0  # steps ended per second
        self.round_trip_s = 0.0
        self._window_start = now
        self._ended_in_window = 0

    def claimed(self, round_trip_s: float) -> None:
        """A claim's answer came back after ``round_trip_s``."""
        if self.round_trip_s == 0.0:
            self.round_trip_s = round_trip_s
        else:
            self.round_trip_s += _WEIGHT * (round_trip_s - self.round_trip_s)

    def ended(self, now: float, count: int = 1) -> None:
        """``count`` steps ended (or were given up) at ``now``."""
        self._roll(now)
        self._ended_in_window += count

    def limit(self, now: float) -> int:
        """How many tasks may be claimed and not yet started at ``now``."""
        self._roll(now)
        return min(self.cap, 2 * self.slots + round(_TRIPS * self.rate * self.round_trip_s))

    def within_horizon(self, position: int, timeout_ms: int | None) -> bool:
        """Whether a task claimed now with ``position`` claimed tasks ahead of it (not yet
        started) is expected to start within a quarter of its ``timeout_ms``, at the rate
        steps ended lately. One whose position has a free slot waiting for it always is,
        as is any while no rate is known (the limit is then two tasks per slot)."""
        if timeout_ms is None or position < self.slots or self.rate <= 0.0:
            return True
        return position / self.rate <= _HORIZON * timeout_ms / 1000

    def start_window(self, now: float) -> int:
        """How many claimed tasks beyond the busy slots may have leave to start (the worker's
        start permit): the slots' worth, plus what they finish in two claim round trips, so
        that a freed slot rarely waits for the permit. A worker that dies leaves these as
        reruns, the rest of its claims as never started."""
        self._roll(now)
        return min(self.cap, self.slots + round(2 * self.rate * self.round_trip_s))

    def _roll(self, now: float) -> None:
        elapsed = now - self._window_start
        if elapsed < _WINDOW_S:
            return
        observed = self._ended_in_window / elapsed
        # The first window is taken as it is: the averages start from what was seen.
        self.rate = observed if self.rate == 0.0 else self.rate + _WEIGHT * (observed - self.rate)
        self._window_start = now
        self._ended_in_window = 0
