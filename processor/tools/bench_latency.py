"""The idle-latency phase of the benchmark: how long one run of the 4-step workflow takes when
nothing else is running, as a user's code sees it, and where that time goes.

One processor and one worker; runs started one at a time through the public client
(``start_run``, then ``wait_for_run``), the next once the previous one's end was seen. Each run
is timed twice: by the client (start called -> end seen) and inside the engine (the row's
creation -> its last transition). The breakdown per hop comes from timestamps the engine
writes anyway:

- ``dispatch``: the step task's record timestamp on the steps topic (set when the processor
  produced it, after its commit);
- ``claim``: ``eec_step_attempt.started_at``, when the worker claimed the attempt;
- ``recorded``: ``eec_step_result.recorded_at``, when the worker's result row was written;
- the run's ``created_at`` and ``last_transition_at``.

The hops of one run of s0 -> (s1, s2) -> s3:

- start -> first dispatch: the start wakeup, the first tick and its commit, the task's send;
- dispatch -> claim: the worker's fetch of the task, its claim statement (per step);
- claim -> recorded: the step's execution and its result's write (per step);
- recorded -> next dispatch: the result's wakeup, the tick, the send (s0 -> s1/s2, and the
  later of s1/s2 -> s3);
- parallel skew: the later of s1 and s2's dispatches minus the earlier;
- last recorded -> ended: the last tick;
- ended -> seen: the client's wait noticing the end.

Postgres's ``now()``, the producer's timestamps and the client's ``time.time()`` read the same
host clock here; on separate hosts the hops would carry their clocks' offsets.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from confluent_kafka import OFFSET_BEGINNING, Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.client import start_run, wait_for_run
from processor.core.step_task import decode_step_task
from processor.io.config.settings import load_settings
from processor.io.kafka.logs import with_logger
from processor.tools.bench_harness import Harness, fresh_database
from processor.tools.bench_support import stop

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


def summarise(runs: Sequence[RunTimes]) -> IdleLatency:
    per_run = [hops_of(run) for run in runs]
    return IdleLatency(
        runs=len(runs),
        client=Percentiles.of([run.seen - run.started for run in runs]),
        engine=Percentiles.of([run.ended - run.created for run in runs]),
        hops={hop: Percentiles.of([h[hop] for h in per_run]) for hop in HOPS},
    )


def report_idle(figures: IdleLatency) -> list[str]:
    """The phase's lines of the report."""
    c, e = figures.client, figures.engine
    lines = [
        f"idle latency, 4-step workflow, {figures.runs} runs one at a time (1 + 1):",
        f"  client start -> end seen  p50 {c.p50:.1f} ms, p90 {c.p90:.1f} ms, p99 {c.p99:.1f} ms",
        f"  engine created -> ended   p50 {e.p50:.1f} ms, p90 {e.p90:.1f} ms, p99 {e.p99:.1f} ms",
        "  per hop (ms, summed over a run's steps)      p50      p90      p99",
    ]
    for hop, p in figures.hops.items():
        lines.append(f"    {hop:<40} {p.p50:>7.1f}  {p.p90:>7.1f}  {p.p99:>7.1f}")
    return lines


def measure_idle(bench: Harness, runs: int, warmup: int = 5) -> IdleLatency:
    """Start ``runs`` runs one at a time with a processor and a worker up; their times."""
    settings = bench.settings
    children = [
        bench.spawn(["process"], {}, "idle-process"),
        bench.spawn(["worker", "--concurrency", "8"], {}, "idle-worker"),
    ]
    workflow = bench.quad.name
    timed: dict[str, tuple[float, float]] = {}
    try:
        bench.wait_group(settings.group_id, 1, coordinator=True)
        bench.wait_group(settings.worker_group_id, 1, coordinator=False)
        for i, run_id in enumerate(bench.ids("idle", warmup + runs)):
            started = time.time() * 1000
            start_run(settings, workflow, run_id)
            wait_for_run(settings, run_id, timeout_s=60)
            if i >= warmup:
                timed[run_id] = (started, time.time() * 1000)
    finally:
        for child in children:
            stop(child)
    dispatched = _dispatch_times(bench, set(timed))
    return summarise(list(_run_times(bench, timed, dispatched)))


def _dispatch_times(bench: Harness, run_ids: set[str]) -> dict[tuple[str, str], float]:
    """When each first attempt's task was produced: the steps topic's record timestamps."""
    topic = bench.names.steps
    consumer = Consumer(
        with_logger(
            {
                **bench.settings.kafka_common(),
                "group.id": f"bench-{bench.tag}-idle-read",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
            }
        )
    )
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        consumer.assign([KafkaTopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
        found: dict[tuple[str, str], float] = {}
        at_end: set[int] = set()
        deadline = time.monotonic() + 60
        while len(at_end) < len(partitions) and time.monotonic() < deadline:
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error() is not None:
                at_end.add(message.partition() or 0)  # end of partition (or an error: stop there)
                continue
            task = decode_step_task(message.value())
            if task.run_id in run_ids and task.attempt == 1:
                found[(task.run_id, task.node)] = float(message.timestamp()[1])
        return found
    finally:
        consumer.close()


def _run_times(
    bench: Harness,
    timed: Mapping[str, tuple[float, float]],
    dispatched: Mapping[tuple[str, str], float],
) -> Iterable[RunTimes]:
    ids = list(timed)
    epoch_ms = "extract(epoch FROM {}) * 1000"
    rows = bench.conn.execute(
        "SELECT run_id, "
        + ", ".join(epoch_ms.format(c) for c in ("created_at", "last_transition_at"))
        + " FROM eec_workflow_run WHERE run_id = ANY(%s)",
        (ids,),
    ).fetchall()
    claims = _per_step(bench, "eec_step_attempt", "started_at", ids)
    results = _per_step(bench, "eec_step_result", "recorded_at", ids)
    for run_id, created, ended in rows:
        started, seen = timed[run_id]
        yield RunTimes(
            started=started,
            seen=seen,
            created=float(created),
            ended=float(ended),
            dispatched={s: dispatched[(run_id, s)] for s in STEPS},
            claimed=claims[run_id],
            recorded=results[run_id],
        )


def _per_step(
    bench: Harness, table: str, column: str, ids: list[str]
) -> dict[str, dict[str, float]]:
    """``column`` of each run's first attempt of each step, in epoch ms."""
    rows = bench.conn.execute(
        f"SELECT run_id, node_id, extract(epoch FROM {column}) * 1000 FROM {table}"
        " WHERE run_id = ANY(%s) AND attempt = 1",
        (ids,),
    ).fetchall()
    found: dict[str, dict[str, float]] = {}
    for run_id, node, at in rows:
        found.setdefault(run_id, {})[node] = float(at)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    """Only this phase (`python -m processor.tools.bench_latency [RUNS]`), on the bench's
    own fresh database: quicker than the whole benchmark while working on latency."""
    args = list(sys.argv[1:] if argv is None else argv)
    runs = int(args[0]) if args else 30
    bench = Harness(fresh_database(load_settings()), 1.0)
    bench.setup()
    try:
        bench.phase("idle")
        figures = measure_idle(bench, runs)
    finally:
        bench.teardown()
    print("\n".join(report_idle(figures)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
