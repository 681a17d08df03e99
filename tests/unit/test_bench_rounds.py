"""Rounds taken in turns and compared by their medians (processor/tools/bench_rounds.py), as
the build comparison of `make bench` and `make bench-trees` use them."""

from __future__ import annotations

import pytest

from processor.tools.bench_rounds import Round, compare, turns


def _run(label: str, seconds: float, cpu: float | None = 1.0) -> Round:
    return Round(label, 1000, seconds, {"instance": cpu, "worker": 0.5, "broker": None})


def test_the_ratio_is_of_the_medians_of_each_contenders_rounds() -> None:
    rounds = [
        _run("new", 1.0),  # 1,000 runs/s
        _run("old", 0.5),  # 2,000
        _run("new", 0.4),  # 2,500
        _run("old", 2.0),  # 500
        _run("new", 0.5),  # 2,000
        _run("old", 1.0),  # 1,000
    ]
    found = compare(rounds, "new", "old")
    assert (found.this_median, found.other_median) == (2000, 1000)
    assert found.ratio == 2.0
    # 1.5 s of CPU over 1,000 runs; a group whose CPU is unknown is left out, not zero.
    assert found.this_cpu_us == pytest.approx(1500)
    assert found.this_processors_us == pytest.approx(1000)


def test_the_cpu_medians_are_taken_on_their_own() -> None:
    # The round with the median rate is not the one with the median CPU.
    rounds = [_run("a", 1.0, 3.0), _run("a", 2.0, 1.0), _run("a", 3.0, 2.0), _run("b", 1.0)]
    found = compare(rounds, "a", "b")
    assert found.this_median == 500
    assert found.this_processors_us == pytest.approx(2000)
    assert found.this_cpu_us == pytest.approx(2500)


def test_a_group_whose_cpu_is_unknown_counts_nothing() -> None:
    assert _run("a", 1.0, None).cpu_per_run_us("instance") == 0
    assert _run("a", 1.0, None).cpu_per_run_us() == pytest.approx(500)


def test_a_contender_without_rounds_is_refused() -> None:
    with pytest.raises(ValueError, match="each contender"):
        compare([_run("new", 1.0)], "new", "old")


def test_each_contender_goes_first_every_other_round() -> None:
    assert list(turns(3, "a", "b")) == [(0, "a"), (0, "b"), (1, "b"), (1, "a"), (2, "a"), (2, "b")]
    assert list(turns(0, "a", "b")) == []
