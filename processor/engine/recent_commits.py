"""The runs this instance committed in the last few seconds, kept for the day the database
restarts or fails over.

A server acknowledges a commit before it is durable when ``synchronous_commit`` is off (up to
three ``wal_writer_delay``, 0.6 s by default, are lost with its crash), and a standby promoted
while behind its primary never had the last commits. Either way the runs those commits moved
are back where they were, and nothing but their next deadline would tick them again: with a
step's result recorded and its deadline minutes away, minutes of a run standing still. So the
commit path remembers what it committed in the last ``RECENT_COMMITS_S`` seconds, and whoever
first meets a server started anew (the commit path's or the sweeps' connection, whichever
reconnects first: an idle instance commits nothing) takes them to be woken again, once. A run
woken needlessly costs one tick that finds nothing to do.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterable

from processor.core.shapes import RunRef

RECENT_COMMITS_S = 5.0


class RecentCommits:
    """(run id, tier) of the commits of the last ``window_s`` seconds; shared by the database
    stage (which adds) and the watchdog (which may take), each on a thread of its own."""

    def __init__(self, window_s: float = RECENT_COMMITS_S) -> None:
        self.window_s = window_s
        self._lock = threading.Lock()
        self._runs: deque[tuple[float, str, str]] = deque()  # (monotonic s, run id, tier)
        self._server_started: object = None  # the server's start time, as last met

    def add(self, now: float, runs: Iterable[RunRef]) -> None:
        """Runs committed at ``now`` (a monotonic time); older ones than the window go."""
        horizon = now - self.window_s
        with self._lock:
            kept = self._runs
            kept.extend((now, run_id, tier) for run_id, tier in runs)
            while kept and kept[0][0] < horizon:
                kept.popleft()

    def met(self, server_started: object) -> list[RunRef]:
        """A connection met a server that started at ``server_started``: the runs to wake
        again, once each, when that is another start than the one met before (none on the
        first meeting, nor when another connection met this start first)."""
        with self._lock:
            before, self._server_started = self._server_started, server_started
            if before is None or before == server_started:
                return []
            runs, self._runs = self._runs, deque()
        return list(dict.fromkeys((run_id, tier) for _at, run_id, tier in runs))
