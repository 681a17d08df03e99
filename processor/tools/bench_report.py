"""The benchmark's report: its figures printed as tables (processor/tools/bench.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processor.tools.bench_rounds import compare
from processor.tools.bench_support import COMPILED, GROUPS, PURE, PURE_PYTHON_ENV, Cost, Figures
from processor.tools.latency_figures import report_idle


def report(f: Figures) -> None:
    rows = [
        ("DB-only ceiling (batched UPDATE, best of 3)", f"{f.ceiling:10.0f} ticks/s"),
        ("one `ductor process`, uncontended runs", f"{f.instance:10.0f} ticks/s"),
        ("naive one-record-at-a-time loop (baseline)", f"{f.naive:10.0f} ticks/s"),
        ("instance / naive", f"{f.instance / f.naive:10.1f} x   (target >= 10)"),
        ("instance / ceiling", f"{f.instance / f.ceiling:10.2f}     (target >= 0.6)"),
        ("peak RSS of the instance", f"{f.rss / 2**20:10.0f} MiB (target <= 250)"),
        ("same instance, tracing + metrics on, all sampled", f"{f.traced:10.0f} ticks/s"),
        ("telemetry on / off", f"{f.traced / f.instance:10.2f}     (target >= 0.6)"),
        ("same, traces sampled at 10 % (metrics all)", f"{f.sampled:10.0f} ticks/s"),
        (
            "telemetry at 10 % sampling / off",
            f"{f.sampled / f.instance:10.2f}     (target >= 0.85)",
        ),
    ]
    print()
    print("Ductor benchmark (one run, real Kafka and Postgres on this machine)")
    for label, value in rows:
        print(f"  {label:46} {value}")
    if f.latency is not None:
        lat = f.latency
        print(
            f"  wakeup-to-commit at {lat['rate']:.0f} ticks/s (half peak), one instance:"
            f" p50 {lat['p50']:.1f} ms, p99 {lat['p99']:.1f} ms (target p99 <= 50)"
        )
        parts = lat.get("parts", {})
        within = ", ".join(
            f"{name} p50 {p['p50'] or 0:.1f} / p99 {p['p99'] or 0:.1f} ms"
            for name, p in parts.items()
        )
        if within:
            print(f"    within it: {within}; the rest is the wait for a batch")
    if f.idle_latency is not None:
        print("\n".join(f"  {line}" for line in [*report_idle(f.idle_latency), *f.floor]))
    if f.loaded_latency is not None:
        print("\n".join(f"  {line}" for line in report_idle(f.loaded_latency)))
    for name, hot in (("co-partitioned by run", f.hot_on), ("spread over partitions", f.hot_off)):
        if hot is None:
            continue
        print(
            f"  hot mix, {name} ({hot['runs']} runs + 10 hot, 2 instances + 2 workers,"
            f" ~{hot['rate']:.0f} ticks/s):"
        )
        print(
            f"    wasted commits {hot['wasted'] * 100:5.1f} %  ({hot['conflicts']} conflicts"
            f" / {hot['commits']} commits sent; target <= 10 %), errors {hot['errors']}"
        )
        latency = f"p50 {hot['p50']:.1f} ms, p99 {hot['p99']:.1f} ms"
        print(f"    wakeup-to-commit {latency} (target p99 <= 100)")
    report_costs(f)


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _cpu_columns(cost: Cost, units: int) -> str:
    cells = [_us(cost.per_unit_us(g, units)) for g in GROUPS]
    cells += [_us(cost.total_us(units)), _us(cost.machine_us(units))]
    return "".join(f"{c:>9}" for c in cells)


_CPU_HEAD = "".join(f"{h:>9}" for h in ("instance", "worker", "broker", "Postgres", "total"))
_CPU_HEAD += f"{'machine':>9}"


def report_costs(f: Figures) -> None:
    """The CPU tables: per committed tick of every phase, per run end to end, and scaling."""
    if f.costs:
        print()
        print("CPU per committed tick (µs of user + system CPU, over the same window as the rate)")
        if f.idle is not None and f.idle.wall > 0:
            shares = {g: f.idle.seconds.get(g) for g in ("broker", "postgres")}
            cells = [
                f"{name} {'-' if v is None else f'{v / f.idle.wall * 100:.1f} %'}"
                for name, v in (("broker", shares["broker"]), ("Postgres", shares["postgres"]))
            ]
            machine = f.idle.machine / f.idle.wall * 100
            print(
                f"  idle, before the phases ({f.idle.wall:.0f} s; % of one core): "
                f"{', '.join(cells)}, machine {machine:.1f} %"
            )
        print(f"  {'phase':42}{'ticks/s':>9}{_CPU_HEAD}")
        for label, cost in f.costs.items():
            print(f"  {label:42}{cost.rate:9.0f}{_cpu_columns(cost, cost.ticks)}")
        print(
            "  * instance = the benchmark's own process (the UPDATEs' client, the naive loop);"
            " machine = all busy CPU\n    of the machine (the load generator and other users"
            " included)"
        )
    if f.e2e:
        _report_end_to_end(f.e2e, "")
    if f.scaling:
        _report_scaling(f.scaling, f.partitions, "")
    report_cluster(f)
    report_builds(f)
    if f.wall:
        print()
        print(f"whole benchmark: {f.wall / 60:.1f} min")


def report_builds(f: Figures) -> None:
    """Compiled against pure Python, phase by phase, from the same run."""
    pure = f.builds
    if pure.instance is None or f.latency is None:
        return
    print()
    print(
        f"Builds: compiled ({len(pure.compiled)} modules by mypyc) and pure Python"
        f" ({PURE_PYTHON_ENV}=1), same run"
    )
    print(f"  {'phase':44}{'compiled':>10}{'pure':>10}{'ratio':>8}")

    def row(label: str, compiled: float, python: float, higher_is_better: bool = True) -> None:
        ratio = compiled / python if higher_is_better else python / compiled
        print(f"  {label:44}{compiled:10.1f}{python:10.1f}{ratio:7.2f}x")

    inst, pinst = f.costs.get("one instance, uncontended"), pure.instance
    if inst is not None:
        row("one instance: ticks/s", inst.rate, pinst.rate)
        row(
            "  CPU per tick of the instance, µs",
            inst.per_unit_us("instance", inst.ticks) or 0.0,
            pinst.per_unit_us("instance", pinst.ticks) or 0.0,
            higher_is_better=False,
        )
    if pure.latency is not None:
        row(
            f"wakeup-to-commit p99 ms (at {f.latency['rate']:.0f} / {pure.latency['rate']:.0f}/s)",
            f.latency["p99"],
            pure.latency["p99"],
            higher_is_better=False,
        )
    for processes, rounds in pure.e2e.items():
        found = compare(rounds, COMPILED, PURE)
        row(f"end to end {processes} + {processes}: runs/s, median", *found.medians)
        row(
            "  CPU per run of the processors, µs",
            found.this_processors_us,
            found.other_processors_us,
            higher_is_better=False,
        )
        row(
            "  CPU per run, every process, µs",
            found.this_cpu_us,
            found.other_cpu_us,
            higher_is_better=False,
        )
        for build in (COMPILED, PURE):
            each = [
                f"{r.runs_per_s:,.0f} ({r.cpu_per_run_us():,.0f} µs)"
                for r in rounds
                if r.label == build
            ]
            print(
                f"    {build}, {len(each)} rounds in turns, runs/s (CPU per run):"
                f" {' / '.join(each)}"
            )
    print("  ratio: how many times better the compiled build is (for µs and ms: pure / compiled)")


def report_cluster(f: Figures) -> None:
    """The end-to-end and scaling phases on the three-broker cluster, and their ratios to the
    same phases on one broker in the same run."""
    if f.cluster_e2e:
        on = " on a local three-broker cluster (3 replicas, min.insync.replicas 2)"
        _report_end_to_end(f.cluster_e2e, on)
        _report_ratios("runs/s", f.e2e, f.cluster_e2e, lambda e: e["runs"] / e["cost"].seconds)
    if f.cluster_scaling:
        _report_scaling(f.cluster_scaling, f.partitions, " on the three-broker cluster")
        _report_ratios("ticks/s", f.scaling, f.cluster_scaling, lambda r: r["cost"].rate)


def _report_end_to_end(rows: list[dict[str, Any]], where: str) -> None:
    runs = rows[0]["runs"]
    print()
    print(
        f"End to end{where}: {runs} runs of a 4-step workflow (s0; s1 + s2 in parallel; s3; no-op"
        " steps),\n  from the first start wakeup (as `ductor start` produces them) to the last"
        " run ended (CPU: µs per run)"
    )
    print(f"  {'processes':26}{'runs/s':>7}{'wall s':>8}{'ticks/run':>10}{_CPU_HEAD}")
    for e in rows:
        cost = e["cost"]
        name = f"{e['processors']} processor{'s' * (e['processors'] > 1)}"
        name += f" + {e['workers']} worker{'s' * (e['workers'] > 1)}"
        failed = "" if e["succeeded"] == e["runs"] else f"  ({e['succeeded']} succeeded)"
        print(
            f"  {name:26}{e['runs'] / cost.seconds:7.0f}{cost.seconds:8.1f}"
            f"{cost.ticks / e['runs']:10.2f}{_cpu_columns(cost, e['runs'])}{failed}"
        )


def _report_scaling(rows: list[dict[str, Any]], partitions: int, where: str) -> None:
    print()
    print(
        f"Scaling{where}: instances in one group over the same topics ({partitions} partitions"
        " per wakeup topic), one-step runs\n  (CPU: µs per committed tick; cores ="
        " CPU of one instance / wall time, on average)"
    )
    head = "".join(f"{h:>9}" for h in ("instance", "broker", "Postgres", "total", "machine"))
    print(f"  {'instances':>9}{'ticks/s':>9}{'per inst':>9}{head}{'cores':>7}")
    for row in rows:
        cost = row["cost"]
        n = row["instances"]
        cells = [_us(cost.per_unit_us(g, cost.ticks)) for g in ("instance", "broker")]
        cells += [_us(cost.per_unit_us("postgres", cost.ticks)), _us(cost.total_us(cost.ticks))]
        cells.append(_us(cost.machine_us(cost.ticks)))
        cores = cost.cores("instance")
        per_core = "-" if cores is None else f"{cores / n:.2f}"
        print(
            f"  {n:9}{cost.rate:9.0f}{cost.rate / n:9.0f}"
            + "".join(f"{c:>9}" for c in cells)
            + f"{per_core:>7}"
        )


def _report_ratios(
    unit: str,
    single: list[dict[str, Any]],
    cluster: list[dict[str, Any]],
    rate: Callable[[dict[str, Any]], float],
) -> None:
    """The cluster's figure over the single broker's, phase by phase, from the same run."""
    cells = [f"{rate(c) / rate(s):.2f}" for s, c in zip(single, cluster, strict=False)]
    print(f"  {unit} on the cluster / on one broker, same run: {', '.join(cells)}")
