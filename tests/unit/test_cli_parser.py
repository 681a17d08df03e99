"""The command line parses what the README and the docs show."""

from __future__ import annotations

from processor.cli.main import build_parser


def test_bench_takes_the_benchmark_options() -> None:
    args = build_parser().parse_args(["bench", "--scale", "0.5", "--hot-seconds", "3"])
    assert (args.scale, args.hot_seconds, args.hot_fraction) == (0.5, 3.0, 0.2)


def test_start_takes_count_tier_and_run_id() -> None:
    args = build_parser().parse_args(
        ["start", "sample", "--count", "3", "--tier", "t0", "--run-id", "r"]
    )
    assert (args.workflow, args.count, args.tier, args.run_id) == ("sample", 3, "t0", "r")
