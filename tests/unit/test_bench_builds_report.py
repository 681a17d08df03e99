"""The benchmark's comparison of the builds (processor/tools/bench_report.py,
``report_builds``): the end-to-end rows are the medians of each build's rounds, not one round
of each, and every round is shown."""

from __future__ import annotations

import pytest

from processor.tools.bench_cpu import CpuUse
from processor.tools.bench_report import report, report_builds
from processor.tools.bench_rounds import Round
from processor.tools.bench_support import COMPILED, PURE, Cost, Figures


def _round(build: str, seconds: float, instance: float) -> Round:
    cpu = {"instance": instance, "worker": 1.0, "broker": None, "postgres": 2.0}
    return Round(build, 1000, seconds, cpu)


def _figures() -> Figures:
    f = Figures()
    idle = CpuUse({"instance": 1.0}, machine=1.0, wall=1.0)
    f.costs["one instance, uncontended"] = Cost(20_000, 1.0, idle)
    f.latency = {"rate": 10_000, "p99": 20.0}
    f.builds.compiled = ["processor.core.tick"]
    f.builds.instance = Cost(10_000, 1.0, CpuUse({"instance": 1.0}, machine=1.0, wall=1.0))
    f.builds.latency = {"rate": 5_000, "p99": 30.0}
    f.builds.e2e[2] = [
        _round(COMPILED, 1.0, 0.2),  # 1,000 runs/s
        _round(PURE, 0.25, 0.4),  # 4,000: one lucky round does not carry the figure
        _round(PURE, 1.0, 0.4),  # 1,000
        _round(COMPILED, 0.5, 0.2),  # 2,000
        _round(COMPILED, 0.4, 0.2),  # 2,500
        _round(PURE, 2.0, 0.4),  # 500
    ]
    return f


def test_end_to_end_rows_are_the_medians_of_rounds_taken_in_turns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    report_builds(_figures())
    out = capsys.readouterr().out
    runs = next(line for line in out.splitlines() if "end to end 2 + 2: runs/s" in line)
    assert runs.split()[-3:] == ["2000.0", "1000.0", "2.00x"]
    processors = next(line for line in out.splitlines() if "of the processors" in line)
    assert processors.split()[-3:] == ["200.0", "400.0", "2.00x"]
    every = next(line for line in out.splitlines() if "every process" in line)
    assert every.split()[-3:] == ["3200.0", "3400.0", "1.06x"]
    assert (
        "compiled, 3 rounds in turns, runs/s (CPU per run):"
        " 1,000 (3,200 µs) / 2,000 (3,200 µs) / 2,500 (3,200 µs)"
    ) in out
    assert "pure, 3 rounds in turns, runs/s (CPU per run): 4,000 (3,400 µs) / 1,000" in out


def test_no_comparison_is_printed_without_the_pure_phases(
    capsys: pytest.CaptureFixture[str],
) -> None:
    f = _figures()
    f.builds.instance = None
    report_builds(f)
    assert capsys.readouterr().out == ""


def test_the_half_peak_latency_says_what_is_within_it(capsys: pytest.CaptureFixture[str]) -> None:
    """Wakeup to commit at half the peak, and within it the record's way to the instance,
    the tick's and the commit's share."""
    f = Figures(ceiling=30_000, instance=15_000, traced=9_000, sampled=13_000, naive=150)
    parts = {
        "arrival": {"p50": 4.0, "p99": 30.0},
        "tick": {"p50": 0.1, "p99": 0.4},
        "commit": {"p50": 2.0, "p99": 9.5},
    }
    f.latency = {"rate": 7_500, "p50": 15.0, "p99": 40.0, "parts": parts}
    report(f)
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if "wakeup-to-commit at 7500 ticks/s" in line)
    assert lines[at + 1].split(": ", 1)[1] == (
        "arrival p50 4.0 / p99 30.0 ms, tick p50 0.1 / p99 0.4 ms, commit p50 2.0 / p99 9.5 ms;"
        " the rest is the wait for a batch"
    )
