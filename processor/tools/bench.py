"""The benchmark (`make bench`, `ductor bench`): figures from one run on the real broker and DB.

It measures, in the same run so that the ratios hold on a noisy shared machine:

- ceiling: the batched conditional UPDATE alone on the same Postgres (no Kafka);
- instance: committed ticks per second of one `ductor process` on uncontended runs;
- naive: a one-record-at-a-time consumer loop (poll, load, tick, conditional UPDATE, commit
  the offset synchronously), written here as the baseline;
- idle latency: runs of the 4-step workflow started one at a time through the client, start
  to end as the client sees it, and per hop (bench_latency.py);
- hot mix: two instances, workers, duplicated wakeups and a few hot runs at about half of the
  instance's peak rate, with co-partitioning by run on and off: wasted commits (conflicts per
  commit sent) and wakeup-to-commit latency;
- peak RSS of the instance;
- CPU per committed tick of each process (the instances, the workers, the broker, Postgres
  with all its processes) in every phase, over the same window as the phase's rate
  (bench_cpu.py reads it from /proc);
- end to end: runs per second of a 4-step workflow (one step, two in parallel after it, one
  after both; no-op steps) started the way `ductor start` starts them (insert, then produce
  the start wakeups), from the first start wakeup to the last run ended, with 1 processor +
  1 worker and 2 + 2, and the CPU per run of every process;
- scaling: 1, 2 and 4 instances in one group over the same topics;
- builds: where the package's hot paths are compiled (docs/performance.md), the instance and
  latency phases again with every process on the pure-Python modules (DUCTOR_PURE_PYTHON=1),
  and the end-to-end phases in rounds taking turns between the builds (bench_rounds.py),
  side by side with the compiled figures of the same run.

It prints the figures; it asserts nothing about speed (that would make a flaky test).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from processor.io.config.settings import load_settings
from processor.tools.bench_floor import floor_lines
from processor.tools.bench_harness import fresh_database
from processor.tools.bench_latency import measure_idle
from processor.tools.bench_phases import SCALING_PARTITIONS, Bench
from processor.tools.bench_report import report, report_cluster
from processor.tools.bench_rounds import Round, turns
from processor.tools.bench_support import (
    COMPILED,
    PURE,
    PURE_PYTHON_ENV,
    Figures,
    OtlpSink,
    compiled_modules_of_children,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options, for `python -m processor.bench` and `ductor bench` alike."""
    parser.add_argument("--scale", type=float, default=1.0, help="multiply the run counts")
    parser.add_argument(
        "--hot-seconds", type=float, default=15.0, help="length of each hot-mix phase"
    )
    parser.add_argument(
        "--hot-fraction",
        type=float,
        default=0.2,
        help="hot-mix load as a fraction of one instance's peak (default 0.2)",
    )
    parser.add_argument(
        "--e2e-runs",
        type=int,
        default=8000,
        help="runs of the 4-step workflow per end-to-end phase, before --scale (default 8000)",
    )
    parser.add_argument(
        "--no-builds",
        dest="builds",
        action="store_false",
        help="skip the pure-Python phases that compare the builds (run by default where the"
        " package's hot paths are compiled)",
    )
    parser.add_argument(
        "--build-rounds",
        type=_at_least_one,
        default=3,
        help="end-to-end rounds of each build in the comparison of the builds, taken in turns"
        " and compared by their medians (default 3)",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="also run the end-to-end and scaling phases on a local three-broker cluster"
        " (started for the run on ports 29092-29100 from a checkout, stopped after): the cost"
        " of replication, in the same run",
    )


def _at_least_one(text: str) -> int:
    """A count of 1 or more; argparse refuses anything else with exit 2 (usage)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ductor bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    bench = Bench(fresh_database(load_settings()), args.scale)
    bench.setup()
    figures = Figures()
    sink = OtlpSink()
    started = time.monotonic()
    failed = 0
    try:
        _one_instance(bench, figures, sink)
        _hot_mixes(bench, figures, args)
        runs = bench.n(args.e2e_runs)
        _end_to_end_and_scaling(bench, runs, "", figures.e2e, figures.scaling)
        _latency_beside_a_load(bench, figures)
        if args.builds:
            _pure_python(bench, figures, runs, args.build_rounds)
        if args.cluster:
            try:
                _on_cluster(bench, figures, runs)
            except Exception as exc:  # the one broker's figures are still worth reporting
                print(f"the cluster's phases failed: {exc!r}", file=sys.stderr)
                failed = 1
    finally:
        sink.close()
        bench.teardown()
    figures.wall = time.monotonic() - started
    figures.partitions = SCALING_PARTITIONS
    report(figures)
    return failed


def _one_instance(bench: Bench, figures: Figures, sink: OtlpSink) -> None:
    """The phases of one instance (and of none: the services idle, the database alone, the
    naive loop), each on fresh topics."""
    print("measuring the services idle ...", flush=True)
    figures.idle = bench.idle(seconds=3)
    print("measuring the DB-only ceiling ...", flush=True)
    bench.phase("ceiling")
    cost = figures.costs["DB-only ceiling (best round) *"] = bench.ceiling()
    figures.ceiling = cost.rate
    print("measuring one instance on uncontended runs ...", flush=True)
    bench.phase("instance")
    cost, figures.rss = bench.instance()
    figures.costs["one instance, uncontended"] = cost
    figures.instance = cost.rate
    print(
        "measuring one instance with tracing and metrics on (sampling everything) ...",
        flush=True,
    )
    bench.phase("traced")
    cost, _ = bench.instance(sink.env, label="traced")
    figures.costs["same, tracing + metrics, all sampled"] = cost
    figures.traced = cost.rate
    print("measuring one instance with tracing sampled at 10 % ...", flush=True)
    bench.phase("sampled")
    sampled_env = {
        **sink.env,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
    }
    cost, _ = bench.instance(sampled_env, label="sampled")
    figures.costs["same, traces sampled at 10 %"] = cost
    figures.sampled = cost.rate
    print("measuring the naive baseline ...", flush=True)
    bench.phase("naive")
    cost = figures.costs["naive loop *"] = bench.naive()
    figures.naive = cost.rate
    print("idle latency: runs of the 4-step workflow one at a time ...", flush=True)
    bench.phase("idle-latency")
    figures.idle_latency = measure_idle(bench, runs=30)
    figures.floor = floor_lines(bench.settings, tries=200)
    target = figures.instance / 2
    print(f"latency of one instance at ~{target:.0f} ticks/s (half its peak) ...", flush=True)
    bench.phase("latency")
    figures.latency = bench.latency(target, seconds=10)
    figures.costs["one instance at half its peak"] = figures.latency["cost"]


def _hot_mixes(bench: Bench, figures: Figures, args: argparse.Namespace) -> None:
    """Two instances and two workers on hot runs, co-partitioned by run and spread."""
    # The hot mix runs two instances, two workers and the load generator on the same two
    # cores as the broker and Postgres, so it is fed at a fraction of one instance's peak.
    mix = figures.instance * args.hot_fraction
    print(f"hot mix at ~{mix:.0f} ticks/s, co-partitioned by run ...", flush=True)
    bench.phase("hot-on")
    figures.hot_on = bench.hot_mix(mix, by_run=True, seconds=args.hot_seconds)
    figures.costs["hot mix, co-partitioned (2 + 2 workers)"] = figures.hot_on["cost"]
    print(f"hot mix at ~{mix:.0f} ticks/s, spread over partitions ...", flush=True)
    bench.phase("hot-off")
    figures.hot_off = bench.hot_mix(mix, by_run=False, seconds=args.hot_seconds)
    figures.costs["hot mix, spread (2 + 2 workers)"] = figures.hot_off["cost"]


def _end_to_end_and_scaling(
    bench: Bench,
    runs: int,
    label: str,
    e2e: list[dict[str, Any]],
    scaling: list[dict[str, Any]],
) -> None:
    """The end-to-end phases (1 + 1, 2 + 2) and the scaling phases (1, 2, 4 instances), each
    on topics of its own whose names start with ``label``."""
    where = " on the cluster" if label else ""
    for processes in (1, 2):
        print(
            f"end to end{where}: {runs} runs of the 4-step workflow, {processes} processor(s)"
            f" and {processes} worker(s) ...",
            flush=True,
        )
        bench.phase(f"{label}e2e{processes}")
        e2e.append(bench.end_to_end(processes, processes, runs))
    for instances in (1, 2, 4):
        print(f"scaling{where}: {instances} instance(s) in one group ...", flush=True)
        bench.phase(f"{label}scale{instances}", partitions=SCALING_PARTITIONS)
        scaling.append(bench.scaling(instances))


def _latency_beside_a_load(bench: Bench, figures: Figures) -> None:
    """One run at a time again, beside other runs started at a tenth of the end-to-end peak
    of 1 processor + 1 worker."""
    one = figures.e2e[0]
    per_s = 0.1 * one["runs"] / one["cost"].seconds
    print(f"latency beside a load: runs one at a time, {per_s:.0f} others/s ...", flush=True)
    bench.phase("loaded-latency")
    figures.loaded_latency = measure_idle(bench, runs=30, background_per_s=per_s)


def _pure_python(bench: Bench, figures: Figures, runs: int, rounds: int) -> None:
    """The phases that measure the processes' own code again, every spawned process on the
    pure-Python modules: one instance (ticks/s, CPU per tick) and its latency at half its
    peak; then end to end with 1 + 1 and 2 + 2 in ``rounds`` rounds of each build, taken in
    turns (one end-to-end phase moves by ±30 % from the next: bench_rounds.py). Skipped,
    saying so, where the processes run pure Python anyway (an editable install, a pure
    wheel)."""
    figures.builds.compiled = compiled_modules_of_children(bench.build_env)
    if not figures.builds.compiled:
        print("builds: this install has no compiled module; no pure-Python comparison")
        return
    pure_env = {PURE_PYTHON_ENV: "1"}
    if compiled_modules_of_children(pure_env):
        raise RuntimeError(f"{PURE_PYTHON_ENV}=1 still imports compiled modules")
    pure = figures.builds
    bench.build_env = pure_env
    try:
        print("pure Python: one instance on uncontended runs ...", flush=True)
        bench.phase("pure-instance")
        pure.instance, _ = bench.instance(label="pure-inst")
        print("pure Python: latency at half its peak ...", flush=True)
        bench.phase("pure-latency")
        pure.latency = bench.latency(pure.instance.rate / 2, seconds=10)
        builds = {COMPILED: {}, PURE: pure_env}
        for processes in (1, 2):
            taken = pure.e2e.setdefault(processes, [])
            for round_, build in turns(rounds, COMPILED, PURE):
                print(
                    f"builds: end to end, {processes} + {processes}, round {round_ + 1} of"
                    f" {rounds}, {build} ...",
                    flush=True,
                )
                bench.build_env = builds[build]
                bench.phase(f"{build}-e2e{processes}-{round_}")
                done = bench.end_to_end(processes, processes, runs)
                cost = done["cost"]
                taken.append(Round(build, done["runs"], cost.seconds, cost.cpu.seconds))
    finally:
        bench.build_env = {}


def _on_cluster(single: Bench, figures: Figures, runs: int) -> None:
    """The end-to-end and scaling phases again, on three brokers with three replicas."""
    from processor.tools.local_infra import three_brokers  # noqa: PLC0415 (needs the checkout)

    # The one broker's runs go first: the cluster's processors share the database, and their
    # watchdog re-woke a scaling phase's unfinished runs a thousand a second, starving the
    # cluster's own.
    single.forget_runs()
    with three_brokers() as cluster:
        bench = Bench(replace(single.base, bootstrap_servers=cluster.endpoint), single.scale)
        try:
            _end_to_end_and_scaling(bench, runs, "c-", figures.cluster_e2e, figures.cluster_scaling)
            # Printed now as well: the figures are kept should the cluster's teardown fail.
            figures.partitions = SCALING_PARTITIONS
            report_cluster(figures)
        finally:
            bench.teardown()


if __name__ == "__main__":
    sys.exit(main())
