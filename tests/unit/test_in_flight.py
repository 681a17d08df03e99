"""The database stage's handle: done, wait and result, as the poll loop uses them."""

from __future__ import annotations

import threading

import pytest

from processor.engine.stage import Timings
from processor.engine.stage_thread import StageThread


def test_a_stage_in_flight_is_not_done_until_it_ends_and_then_gives_its_result() -> None:
    release = threading.Event()
    result = Timings(started_ns=1)

    def stage() -> Timings:
        release.wait(30)
        return result

    in_flight = StageThread().submit(stage)
    assert not in_flight.done()
    assert not in_flight.wait(0.01)
    with pytest.raises(TimeoutError):
        in_flight.result(0.01)
    release.set()
    assert in_flight.wait(30)
    assert in_flight.done() and in_flight.done()  # asking again changes nothing
    assert in_flight.result() is result


def test_a_stage_that_raises_raises_on_the_thread_that_asks() -> None:
    def stage() -> Timings:
        raise RuntimeError("a bug in the stage")

    in_flight = StageThread().submit(stage)
    assert in_flight.wait(30)
    with pytest.raises(RuntimeError, match="a bug in the stage"):
        in_flight.result()


def test_stages_run_one_after_the_other_on_one_thread() -> None:
    """The second stage waits for the first; both run on the same (daemon) thread."""
    release = threading.Event()
    threads: list[threading.Thread] = []

    def slow() -> Timings:
        threads.append(threading.current_thread())
        release.wait(30)
        return Timings(started_ns=1)

    def quick() -> Timings:
        threads.append(threading.current_thread())
        return Timings(started_ns=2)

    runner = StageThread()
    first, second = runner.submit(slow), runner.submit(quick)
    assert not second.wait(0.05)  # queued behind the first
    release.set()
    assert first.result(30).started_ns == 1 and second.result(30).started_ns == 2
    assert threads[0] is threads[1] and threads[0].daemon
    assert threads[0] is not threading.current_thread()
