"""`python -m processor.tools.bench_trees REVISION` runs each tree's own end-to-end phase in
turns, on the real services, and leaves no worktree behind. (Its figures are not asserted:
the benchmark measures, it does not judge.)"""

from __future__ import annotations

import re
import subprocess

import pytest

from processor.io.config.settings import Settings
from processor.tools import bench_trees

pytestmark = pytest.mark.integration


def _worktrees() -> set[str]:
    """The worktrees' paths (not their commits: another worktree of the checkout may commit
    meanwhile)."""
    listed = subprocess.run(
        ["git", "-C", str(bench_trees.CHECKOUT), "worktree", "list", "--porcelain"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return {
        line.removeprefix("worktree ")
        for line in listed.splitlines()
        if line.startswith("worktree ")
    }


def test_two_trees_run_in_turns_and_their_medians_are_compared(
    base_settings: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DUCTOR_PG_DSN", base_settings.pg_dsn)  # this test process's database
    before = _worktrees()
    assert bench_trees.main(["HEAD", "--processes", "1", "--rounds", "2", "--runs", "100"]) == 0
    out = capsys.readouterr().out
    rounds = re.findall(r"^1 \+ 1, round (\d), (HEAD|this checkout): [\d,]+ runs/s", out, re.M)
    # HEAD first in round 1, this checkout first in round 2.
    assert rounds == [
        ("1", "HEAD"),
        ("1", "this checkout"),
        ("2", "this checkout"),
        ("2", "HEAD"),
    ], out
    assert re.search(r"^1 \+ 1: this checkout .* ratio of medians \d+\.\d\d$", out, re.M), out
    assert _worktrees() == before


def test_a_revision_that_does_not_exist_is_named_in_the_error() -> None:
    with pytest.raises(SystemExit, match="no-such-revision"):
        bench_trees.main(["no-such-revision", "--runs", "100"])
