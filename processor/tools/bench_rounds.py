"""Rounds of one end-to-end phase taken in turns by two contenders (two trees, two builds), and
the ratio of their medians.

A single end-to-end phase lasts 3-5 s on two cores shared with the broker and Postgres, and one
such phase moves by ±30 % from the next: two contenders measured once each gave ratios from 1.05
to 1.73 for the same pair of builds (docs/performance.md). Taken in turns, each going
first every other round (``turns``), and compared by their medians, they give a figure that
holds from one run to the next.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Round:
    """One end-to-end phase of one contender: its wall time and each group's CPU seconds (a
    group whose CPU could not be read is None)."""

    label: str
    runs: int
    seconds: float
    cpu: Mapping[str, float | None]

    @property
    def runs_per_s(self) -> float:
        return self.runs / self.seconds

    def cpu_per_run_us(self, group: str | None = None) -> float:
        """CPU per run over every group measured, or over ``group`` alone."""
        groups = self.cpu.values() if group is None else (self.cpu.get(group),)
        return sum(v for v in groups if v is not None) / self.runs * 1e6


@dataclass(frozen=True)
class Comparison:
    """The medians of each contender's rounds, and this one's against the other's."""

    this_median: float  # runs/s
    other_median: float
    this_cpu_us: float  # CPU per run over every process, median
    other_cpu_us: float
    this_processors_us: float  # CPU per run of the processors alone, median
    other_processors_us: float

    @property
    def medians(self) -> tuple[float, float]:
        """Runs/s: this one's median, the other's."""
        return self.this_median, self.other_median

    @property
    def ratio(self) -> float:
        return self.this_median / self.other_median


def compare(results: Sequence[Round], this: str, other: str) -> Comparison:
    mine = [r for r in results if r.label == this]
    theirs = [r for r in results if r.label == other]
    if not mine or not theirs:
        raise ValueError("each contender needs at least one round")
    return Comparison(
        statistics.median(r.runs_per_s for r in mine),
        statistics.median(r.runs_per_s for r in theirs),
        statistics.median(r.cpu_per_run_us() for r in mine),
        statistics.median(r.cpu_per_run_us() for r in theirs),
        statistics.median(r.cpu_per_run_us("instance") for r in mine),
        statistics.median(r.cpu_per_run_us("instance") for r in theirs),
    )


def turns(rounds: int, first: T, second: T) -> Iterator[tuple[int, T]]:
    """(round, contender) in the order they run: each goes first every other round, so that
    neither always meets the state (the page cache, the broker's logs) the other leaves."""
    for round_ in range(rounds):
        pair = (first, second) if round_ % 2 == 0 else (second, first)
        for contender in pair:
            yield round_, contender
