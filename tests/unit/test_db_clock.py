"""The one clock (io/postgres/db_clock.py): this process's clock corrected by its offset from
Postgres's, measured on round trips short enough to say something."""

from __future__ import annotations

from processor.io.postgres.db_clock import DatabaseClock


class Wall:
    def __init__(self, now_ms: int) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


def test_the_offset_is_taken_at_the_middle_of_the_round_trip() -> None:
    wall = Wall(1_000_000)
    clock = DatabaseClock(wall)
    assert clock.now_ms() == 1_000_000  # nothing measured yet: this process's own clock
    clock.observe(database_ms=992_010, sent_ms=1_000_000, received_ms=1_000_020)
    assert clock.offset_ms == -8_000  # this process runs 8 s ahead
    assert clock.now_ms() == 992_000


def test_a_slow_round_trip_is_not_taken_for_a_skew() -> None:
    """A statement held 30 s behind a frozen connection started on the server 30 s after it
    was sent: taken at face value it would shift every deadline by 30 s (a chaos run's worker
    then skipped 412 tasks as past their deadline)."""
    wall = Wall(1_000_000)
    clock = DatabaseClock(wall)
    clock.observe(database_ms=1_000_005, sent_ms=1_000_000, received_ms=1_000_010)
    clock.observe(database_ms=1_030_000, sent_ms=1_000_000, received_ms=1_030_010)
    assert clock.offset_ms == 0
