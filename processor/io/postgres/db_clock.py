"""The coordinator's one clock: wall-clock time as Postgres reads it.

Every time-based decision of a run is made against one clock, so that instances whose own
clocks disagree (a machine whose NTP drifted, a VM resumed) never disagree about a run: a
tick judges deadlines and retry times at the time Postgres gave its load, and computes new
ones from it; the sweeps compare the rows' times with Postgres's ``now()``; and what the poll
loop decides by the clock between two statements (whether a timer is due, how far ahead a due
time may lie) reads this process's clock corrected by its offset from Postgres, measured on
every load. A process 8 s ahead then times out no attempt early and releases no timer early.
"""

from __future__ import annotations

import time
from collections.abc import Callable

# A measurement from a round trip longer than this is not taken (see ``observe``).
_MAX_ROUND_TRIP_MS = 500


class DatabaseClock:
    def __init__(self, wall_ms: Callable[[], int] = lambda: int(time.time() * 1000)) -> None:
        self._wall_ms = wall_ms
        self._offset_ms = 0  # Postgres's clock minus this process's (0 until first measured)

    @property
    def offset_ms(self) -> int:
        return self._offset_ms

    def local_ms(self) -> int:
        """This process's own clock (taken before a statement that reads Postgres's)."""
        return self._wall_ms()

    def observe(self, database_ms: int, sent_ms: int, received_ms: int) -> None:
        """Postgres's ``now()`` of a statement sent at ``sent_ms`` and answered at
        ``received_ms`` by this process's clock: the statement started within that round
        trip, so its middle is taken, within half the round trip. A slow round trip says
        nothing reliable (a statement held behind a frozen connection started on the server
        long after it was sent) and is ignored."""
        if received_ms - sent_ms > _MAX_ROUND_TRIP_MS:
            return
        # One int store: safe to read from any thread.
        self._offset_ms = database_ms - (sent_ms + received_ms) // 2

    def now_ms(self) -> int:
        return self._wall_ms() + self._offset_ms
