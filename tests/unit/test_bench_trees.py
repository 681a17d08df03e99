"""The comparison of two trees' end-to-end rounds (processor/tools/bench_trees.py): medians of
each tree's rounds, CPU per run over the groups measured, and the options it refuses."""

from __future__ import annotations

import pytest

from processor.tools.bench_trees import TreeRun, compare, main


def _run(tree: str, seconds: float, cpu: float | None = 1.0) -> TreeRun:
    return TreeRun(tree, 1000, seconds, {"instance": cpu, "worker": 0.5, "broker": None})


def test_the_ratio_is_of_the_medians_of_each_trees_rounds() -> None:
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


def test_a_tree_without_rounds_is_refused() -> None:
    with pytest.raises(ValueError, match="each tree"):
        compare([_run("new", 1.0)], "new", "old")


@pytest.mark.parametrize("bad", [["--rounds", "0"], ["--runs", "0"], ["--processes", "0"]])
def test_options_below_one_are_refused_before_anything_runs(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["HEAD", *bad])
    assert stopped.value.code == 2
