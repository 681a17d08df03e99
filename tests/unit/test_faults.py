"""Fault specs for child processes (DUCTOR_TEST_FAULTS): what parses, what is refused."""

from __future__ import annotations

import pytest

from processor.io.faults import Faults, Point


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
