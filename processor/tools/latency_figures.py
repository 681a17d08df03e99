"""The idle-latency phase's figures (bench_latency.py measures them): one run's hops from
its recorded times, percentiles over runs, and the report's lines. Arithmetic only, apart from the
harness: bench_support's figures and the report import it without the harness."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# The hops, in the order a run passes them; the per-step ones are summed over a run's steps
# where a run passes them more than once (claims, executions), as a user waits for each.
HOPS = (
    "start -> first dispatch",
    "dispatch -> claim",
    "claim -> result recorded",
    "result -> next dispatch",
    "parallel dispatch skew",
    "last result -> run ended",
    "run ended -> client saw it",
)
STEPS = ("s0", "s1", "s2", "s3")  # the bench's 4-step workflow (bench_harness._workflow)


@dataclass(frozen=True)
class RunTimes:
    """What was recorded of one run, in epoch milliseconds."""

    started: float  # the client called start_run
    seen: float  # wait_for_run returned
    created: float
    ended: float
    dispatched: Mapping[str, float]
    claimed: Mapping[str, float]
    recorded: Mapping[str, float]


@dataclass
class Percentiles:
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, samples: Sequence[float]) -> Percentiles:
        ordered = sorted(samples)

        def at(q: float) -> float:
            return ordered[min(len(ordered) - 1, int(len(ordered) * q))]

        return cls(statistics.median(ordered), at(0.9), at(0.99))


@dataclass
class IdleLatency:
    runs: int
    client: Percentiles  # start_run called -> wait_for_run returned
    engine: Percentiles  # the row's creation -> its last transition
    hops: dict[str, Percentiles] = field(default_factory=dict)
    background_per_s: float = 0.0  # other runs started meanwhile, per second


def hops_of(run: RunTimes) -> dict[str, float]:
    """One run's hops in milliseconds (per-step hops summed over the run's steps)."""
    d, c, r = run.dispatched, run.claimed, run.recorded
    first_of_pair, second_of_pair = sorted((d["s1"], d["s2"]))
    return {
        "start -> first dispatch": d["s0"] - run.created,
        "dispatch -> claim": sum(c[s] - d[s] for s in STEPS),
        "claim -> result recorded": sum(r[s] - c[s] for s in STEPS),
        "result -> next dispatch": (first_of_pair - r["s0"]) + (d["s3"] - max(r["s1"], r["s2"])),
        "parallel dispatch skew": second_of_pair - first_of_pair,
        "last result -> run ended": run.ended - r["s3"],
        "run ended -> client saw it": run.seen - run.ended,
    }


def summarise(runs: Sequence[RunTimes], background_per_s: float = 0.0) -> IdleLatency:
    per_run = [hops_of(run) for run in runs]
    return IdleLatency(
        runs=len(runs),
        client=Percentiles.of([run.seen - run.started for run in runs]),
        engine=Percentiles.of([run.ended - run.created for run in runs]),
        hops={hop: Percentiles.of([h[hop] for h in per_run]) for hop in HOPS},
        background_per_s=background_per_s,
    )


def report_idle(figures: IdleLatency) -> list[str]:
    """The phase's lines of the report."""
    c, e = figures.client, figures.engine
    load = figures.background_per_s
    where = f"latency beside {load:.0f} runs/s" if load else "idle latency"
    lines = [
        f"{where}, 4-step workflow, {figures.runs} runs one at a time (1 + 1):",
        f"  client start -> end seen  p50 {c.p50:.1f} ms, p90 {c.p90:.1f} ms, p99 {c.p99:.1f} ms",
        f"  engine created -> ended   p50 {e.p50:.1f} ms, p90 {e.p90:.1f} ms, p99 {e.p99:.1f} ms",
        "  per hop (ms, summed over a run's steps)      p50      p90      p99",
    ]
    for hop, p in figures.hops.items():
        lines.append(f"    {hop:<40} {p.p50:>7.1f}  {p.p90:>7.1f}  {p.p99:>7.1f}")
    return lines
