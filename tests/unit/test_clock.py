from __future__ import annotations

import time

from processor.io.runtime.clock import SYSTEM_CLOCK, ManualClock


def test_the_system_clock_reads_the_process_clocks() -> None:
    before_s, before_ms = time.monotonic(), time.time_ns() // 1_000_000
    read_s, read_ms = SYSTEM_CLOCK.monotonic(), SYSTEM_CLOCK.wall_ms()
    assert before_s <= read_s <= time.monotonic()
    assert before_ms <= read_ms <= time.time_ns() // 1_000_000


def test_a_manual_clock_moves_both_times_together_and_only_when_told() -> None:
    manual = ManualClock(monotonic_s=10.0, wall_ms=5_000)
    clock = manual.clock
    assert (clock.monotonic(), clock.wall_ms()) == (10.0, 5_000)
    manual.advance(1.5)
    assert (clock.monotonic(), clock.wall_ms()) == (11.5, 6_500)
