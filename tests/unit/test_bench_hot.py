"""The hot-path micro-benchmark runs: its fake load rows follow the load statement's shape
(a column added to ``_LOAD_SQL`` without them once broke every phase with an IndexError)."""

from __future__ import annotations

from processor.tools import bench_hot


def test_every_phase_of_the_hot_path_benchmark_runs_once() -> None:
    phases = bench_hot.phases(3)
    assert set(phases) == {"tick_first", "tick_result", "decode", "encode", "intake", "carry_out"}
    for call, runs in phases.values():
        call()
        assert runs == 3
