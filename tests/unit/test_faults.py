"""Fault specs for child processes (DUCTOR_TEST_FAULTS): what parses, what is refused."""

from __future__ import annotations

import pytest

from processor.io.runtime.faults import Faults, Point


def test_kill_and_term_are_armed_at_named_points() -> None:
    faults = Faults.from_spec("after_commit=kill@3, starting=term")
    assert faults.armed == [Point.AFTER_COMMIT, Point.STARTING]


@pytest.mark.parametrize(
    "spec", ["nowhere=kill", "starting=stop", "starting=term@0", "after_commit=kill@x"]
)
def test_a_malformed_spec_is_refused_with_what_is_expected(spec: str) -> None:
    with pytest.raises(ValueError, match=r"unknown fault point|expected"):
        Faults.from_spec(spec)


def test_ignore_forces_the_bad_branch_the_nth_time_only() -> None:
    faults = Faults.from_spec("assigned=ignore@2")
    assert [faults.forces(Point.ASSIGNED) for _ in range(4)] == [False, True, False, False]
    assert not Faults.from_spec("starting=term").forces(Point.ASSIGNED)


def test_raise_throws_a_plain_exception_for_the_chosen_run_only() -> None:
    faults = Faults.from_spec("tick=raise:r-7,thread=raise:ductor-sweep")
    assert faults.armed == [Point.THREAD, Point.TICK] and faults.at(Point.TICK)
    faults.hit(Point.TICK, ["r-1", "r-2"])  # a batch without it: nothing
    faults.hit(Point.TICK, "r-70")
    for reached in (["r-1", "r-7"], "r-7", {"r-7"}):
        with pytest.raises(Exception, match="injected fault at tick for r-7") as raised:
            faults.hit(Point.TICK, reached)
        assert type(raised.value) is Exception  # nothing can catch it by its type
    faults.hit(Point.REQUEST, "r-7")  # another point: not armed
    assert not faults.at(Point.REQUEST)


def test_a_raise_without_its_target_is_refused() -> None:
    with pytest.raises(ValueError, match="raise:<run id>"):
        Faults.from_spec("tick=raise:")
