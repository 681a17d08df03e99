"""The options bench_trees refuses before it runs anything (its comparison of rounds is
tests/unit/test_bench_rounds.py's)."""

from __future__ import annotations

import pytest

from processor.tools.bench_trees import main


@pytest.mark.parametrize("bad", [["--rounds", "0"], ["--runs", "0"], ["--processes", "0"]])
def test_options_below_one_are_refused_before_anything_runs(bad: list[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        main(["HEAD", *bad])
    assert stopped.value.code == 2
