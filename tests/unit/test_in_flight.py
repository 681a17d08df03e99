"""The database stage's handle: done, wait and result, as the poll loop uses them."""

from __future__ import annotations

import threading

import pytest

from processor.engine.stage import InFlight, StageResult


def test_a_stage_in_flight_is_not_done_until_it_ends_and_then_gives_its_result() -> None:
    release = threading.Event()
    result = StageResult(started_ns=1, acknowledged=[])

    def stage() -> StageResult:
        release.wait(30)
        return result

    in_flight = InFlight(stage)
    assert not in_flight.done()
    assert not in_flight.wait(0.01)
    with pytest.raises(TimeoutError):
        in_flight.result(0.01)
    release.set()
    assert in_flight.wait(30)
    assert in_flight.done() and in_flight.done()  # asking again changes nothing
    assert in_flight.result() is result


def test_a_stage_that_raises_raises_on_the_thread_that_asks() -> None:
    def stage() -> StageResult:
        raise RuntimeError("a bug in the stage")

    in_flight = InFlight(stage)
    assert in_flight.wait(30)
    with pytest.raises(RuntimeError, match="a bug in the stage"):
        in_flight.result()
