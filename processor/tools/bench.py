"""The benchmark (`make bench`, `ductor bench`): figures from one run on the real broker and DB.

It measures, in the same run so that the ratios hold on a noisy shared machine:

- ceiling: the batched conditional UPDATE alone on the same Postgres (no Kafka);
- instance: committed ticks per second of one `ductor process` on uncontended runs;
- naive: a one-record-at-a-time consumer loop (poll, load, tick, conditional UPDATE, commit
  the offset synchronously), written here as the baseline;
- hot mix: two instances, workers, duplicated wakeups and a few hot runs at about half of the
  instance's peak rate, with co-partitioning by run on and off: wasted attempts (conflicts per
  commit attempt) and wakeup-to-commit latency;
- peak RSS of the instance.

It prints the figures; it asserts nothing about speed (that would make a flaky test).
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from processor.core.envelope import Wakeup
from processor.core.model import WorkflowDef, parse_workflow
from processor.core.routing import TopicNames
from processor.io.config import Settings, load_settings, settings_env
from processor.io.kafka import choose_partition, produce, producer_config
from processor.io.migrate import migrate
from processor.io.runs_admin import (
    count_ended,
    count_ticked,
    count_ticked_with_prefix,
    delete_runs_with_prefix,
    insert_runs,
    register_workflow,
    vacuum_runs,
)
from processor.io.topics import create_topics, desired_topics
from processor.tools.bench_baselines import ceiling_rate, naive_rate
from processor.tools.bench_support import (
    Figures,
    OtlpSink,
    final_stats,
    paced,
    peak_rss,
    report,
    stop,
)

REPO = Path(__file__).resolve().parents[2]


def _workflow(name: str, steps: int, chain: bool = False) -> WorkflowDef:
    """`steps` fast steps: a chain, or a diamond-ish fan (first, middle..., last)."""
    defs: list[dict[str, Any]] = []
    for i in range(steps):
        if chain:
            deps = [f"s{i - 1}"] if i else []
        elif i == 0:
            deps = []
        elif i == steps - 1:
            deps = [f"s{j}" for j in range(1, steps - 1)] or ["s0"]
        else:
            deps = ["s0"]
        defs.append({"name": f"s{i}", "type": "fast", "depends_on": deps, "timeout_ms": 30000})
    return parse_workflow({"name": name, "version": 1, "steps": defs})


class Bench:
    def __init__(self, base: Settings, scale: float) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.base = base
        self.phases: list[Settings] = []
        self.settings = self.phase("setup")
        self.scale = scale
        self.conn = psycopg.connect(base.pg_dsn, autocommit=True)
        self.one = _workflow("bench-one", 1)
        self.quad = _workflow("bench-quad", 4)
        self.chain = _workflow("bench-chain", 40, chain=True)

    def n(self, base: int) -> int:
        return max(100, int(base * self.scale))

    @property
    def names(self) -> TopicNames:
        return TopicNames(self.settings.topic_prefix)

    def phase(self, label: str) -> Settings:
        """Fresh topics and group for a phase, and no live runs left from the previous one:
        a phase's workers must not pick up another phase's step tasks, nor its watchdog
        re-wake another phase's runs."""
        settings = replace(
            self.base,
            topic_prefix=f"bench-{self.tag}-{label}",
            group_id=f"bench-{self.tag}-{label}",
            wakeup_partitions=6,
            delay_partitions=6,
            step_partitions=4,
        )
        self.phases.append(settings)
        self.settings = settings
        if label != "setup":
            create_topics(settings)
            delete_runs_with_prefix(self.conn, f"b{self.tag}-")
        return settings

    def setup(self) -> None:
        migrate(self.base.pg_dsn)
        # Earlier runs leave dead rows behind; start from a vacuumed, analysed table.
        vacuum_runs(self.conn)
        for wf in (self.one, self.quad, self.chain):
            register_workflow(self.conn, wf)

    def teardown(self) -> None:
        delete_runs_with_prefix(self.conn, f"b{self.tag}-")
        admin = AdminClient(self.base.kafka_common())
        existing = admin.list_topics(timeout=10).topics
        topics = [
            t
            for s in self.phases
            for t in [*desired_topics(s), f"{s.topic_prefix}.naive"]
            if t in existing
        ]
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            try:
                future.result(timeout=30)
            except Exception as exc:  # cleanup is best effort: report, do not mask the figures
                print(f"  (could not delete a bench topic: {exc})", file=sys.stderr)
        self.conn.close()

    def ids(self, kind: str, count: int) -> list[str]:
        return [f"b{self.tag}-{kind}-{i}" for i in range(count)]

    def insert(self, wf: WorkflowDef, ids: Sequence[str]) -> None:
        for start in range(0, len(ids), 5000):
            insert_runs(self.conn, wf, [(r, {}) for r in ids[start : start + 5000]], "t1")

    # -- ceiling -------------------------------------------------------------------------------

    def ceiling(self, rounds: int = 3) -> float:
        """Ticks per second of the batched conditional UPDATE alone (states precomputed): the
        best of a few rounds, since a ceiling is what the database can do when nothing (an
        autovacuum, a checkpoint) gets in its way."""
        return max(self._ceiling_round(f"ceil{r}") for r in range(rounds))

    def _ceiling_round(self, label: str) -> float:
        ids = self.ids(label, self.n(10000))
        self.insert(self.one, ids)
        return ceiling_rate(self.conn, ids, self.settings.batch_size, self.names)

    # -- one instance --------------------------------------------------------------------------

    def instance(
        self, extra_env: dict[str, str] | None = None, label: str = "inst"
    ) -> tuple[float, int]:
        """Committed ticks per second of one `ductor process` on uncontended runs, and its
        peak RSS in bytes. The backlog is produced first; the rate is taken between 10 % and
        90 % of the commits so that start-up and the tail do not count."""
        ids = self.ids(label, self.n(20000))
        self.insert(self.one, ids)
        self.produce_starts(ids, duplicates=1, by_run=True)
        child = self.spawn(["process"], extra_env or {}, f"{label}-process")
        try:
            rate = self.rate_between(ids, 0.1, 0.9, timeout=300)
            rss = peak_rss(child.pid)
        finally:
            stop(child)
        return rate, rss

    def rate_between(self, ids: list[str], low: float, high: float, timeout: float) -> float:
        prefix = ids[0].rsplit("-", 1)[0] + "-"
        marks: dict[float, float] = {}
        deadline = time.monotonic() + timeout
        while len(marks) < 2:
            done = count_ticked_with_prefix(self.conn, prefix)
            now = time.monotonic()
            for fraction in (low, high):
                if fraction not in marks and done >= fraction * len(ids):
                    marks[fraction] = now
            if now > deadline:
                raise RuntimeError(f"only {done} of {len(ids)} runs ticked within {timeout} s")
            time.sleep(0.05)  # the benchmark samples progress; this is not a test
        return (high - low) * len(ids) / max(1e-6, marks[high] - marks[low])

    # -- latency at a paced load -------------------------------------------------------------------

    def latency(self, ticks_per_s: float, seconds: float) -> dict[str, Any]:
        """Wakeup-to-commit latency of one instance fed at a steady ``ticks_per_s``."""
        ids = self.ids("lat", int(ticks_per_s * seconds))
        warmup = self.ids("lat-warmup", 1)
        self.insert(self.one, ids + warmup)
        child = self.spawn(["process"], {}, "latency-process")
        producer = Producer(producer_config(self.settings, "bench-latency"))
        try:
            self.produce_starts(warmup, duplicates=1, by_run=True)
            self.wait_ticked(warmup, timeout=60)  # the instance is assigned and warm
            paced(
                seconds,
                len(ids),
                lambda i: self.produce_start(producer, ids[i], 1, True),
                lambda: None,
            )
            producer.flush(30)
            self.wait_ticked(ids, timeout=120)
        finally:
            stop(child)
        stats = final_stats(self.log_path("latency-process"))
        e2e = stats["latency_ms"]["end_to_end"]
        return {"rate": ticks_per_s, "p50": e2e["p50"] or 0.0, "p99": e2e["p99"] or 0.0}

    def wait_ticked(self, ids: list[str], timeout: float) -> None:
        self.wait_count(ids, count_ticked, timeout, "ticked")

    def wait_terminal(self, ids: list[str], timeout: float) -> None:
        self.wait_count(ids, count_ended, timeout, "ended")

    def wait_count(
        self,
        ids: list[str],
        count: Callable[[psycopg.Connection[Any], Sequence[str]], int],
        timeout: float,
        what: str,
    ) -> None:
        """Until ``count`` says every run of ``ids`` is there."""
        deadline = time.monotonic() + timeout
        while True:
            done = count(self.conn, ids)
            if done == len(ids):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {done} of {len(ids)} runs {what} within {timeout} s")
            time.sleep(0.1)  # the benchmark samples progress; this is not a test

    # -- naive baseline ------------------------------------------------------------------------

    def naive(self) -> float:
        """The baseline: one record at a time, load, tick, conditional UPDATE, sync commit."""
        ids = self.ids("naive", self.n(3000))
        self.insert(self.one, ids)
        return naive_rate(self.settings, self.conn, ids, f"bench-naive-{self.tag}")

    # -- hot mix -------------------------------------------------------------------------------

    def hot_mix(self, target_ticks_per_s: float, by_run: bool, seconds: float) -> dict[str, Any]:
        """Two instances and two workers at a paced rate, every start wakeup produced three
        times, plus a few hot runs hammered with extra wakeups."""
        label = "hot-on" if by_run else "hot-off"
        env = {"DUCTOR_PARTITION_BY_RUN": "true" if by_run else "false"}
        ticks_per_run = 5  # start, then one per result of the 4-step fan, the last one ends it
        runs_per_s = max(1.0, target_ticks_per_s / ticks_per_run)
        ids = self.ids(f"{label}-q", int(runs_per_s * seconds))
        hot_ids = self.ids(f"{label}-h", 10)
        self.insert(self.quad, ids)
        self.insert(self.chain, hot_ids)
        children = [self.spawn(["process"], env, f"{label}-process-{i}") for i in range(2)]
        children += [
            self.spawn(["worker", "--threads", "8"], env, f"{label}-worker-{i}") for i in range(2)
        ]
        producer = Producer(producer_config(self.settings, "bench-load"))
        try:
            self.produce_starts(hot_ids, duplicates=1, by_run=by_run)
            paced(
                seconds,
                len(ids),
                lambda i: self.produce_start(producer, ids[i], duplicates=3, by_run=by_run),
                lambda: self.produce_start(
                    producer, random.choice(hot_ids), duplicates=1, by_run=by_run
                ),
            )
            producer.flush(30)
            self.wait_terminal(ids, timeout=120)
        finally:
            for child in children:
                stop(child)
        stats = [final_stats(self.log_path(f"{label}-process-{i}")) for i in range(2)]
        conflicts = sum(s["conflicts"] for s in stats)
        attempts = sum(s["commit_attempts"] for s in stats)
        e2e = [s["latency_ms"]["end_to_end"] for s in stats]
        return {
            "wasted": conflicts / attempts if attempts else 0.0,
            "conflicts": conflicts,
            "attempts": attempts,
            "errors": sum(sum(s["errors"].values()) for s in stats),
            "p50": max(x["p50"] or 0 for x in e2e),
            "p99": max(x["p99"] or 0 for x in e2e),
            "runs": len(ids),
            "rate": target_ticks_per_s,
        }

    # -- plumbing ------------------------------------------------------------------------------

    def produce_starts(self, ids: Sequence[str], duplicates: int, by_run: bool) -> None:
        producer = Producer(producer_config(self.settings, "bench-load"))
        for run_id in ids:
            self.produce_start(producer, run_id, duplicates, by_run)
        producer.flush(60)

    def produce_start(self, producer: Producer, run_id: str, duplicates: int, by_run: bool) -> None:
        topic = self.names.wakeup("t1")
        wakeup = Wakeup(run_id, "start", produced_at=int(time.time() * 1000))
        for _ in range(duplicates):
            partition = choose_partition(run_id, self.settings.wakeup_partitions, by_run)
            produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
            producer.poll(0)

    def log_path(self, name: str) -> Path:
        return Path(f"/tmp/ductor-bench-{self.tag}-{name}.log")

    def spawn(
        self, args: list[str], extra_env: dict[str, str], name: str
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.update(settings_env(replace(self.settings, log_format="json")))
        env.update(extra_env)
        log = self.log_path(name).open("wb")
        return subprocess.Popen(
            [sys.executable, "-m", "processor", *args], env=env, stdout=log, stderr=log
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ductor bench", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    bench = Bench(load_settings(), args.scale)
    bench.setup()
    figures = Figures()
    sink = OtlpSink()
    try:
        print("measuring the DB-only ceiling ...", flush=True)
        bench.phase("ceiling")
        figures.ceiling = bench.ceiling()
        print("measuring one instance on uncontended runs ...", flush=True)
        bench.phase("instance")
        figures.instance, figures.rss = bench.instance()
        print(
            "measuring one instance with tracing and metrics on (sampling everything) ...",
            flush=True,
        )
        bench.phase("traced")
        figures.traced, _ = bench.instance(sink.env, label="traced")
        print("measuring one instance with tracing sampled at 10 % ...", flush=True)
        bench.phase("sampled")
        sampled_env = {
            **sink.env,
            "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
            "OTEL_TRACES_SAMPLER_ARG": "0.1",
        }
        figures.sampled, _ = bench.instance(sampled_env, label="sampled")
        print("measuring the naive baseline ...", flush=True)
        bench.phase("naive")
        figures.naive = bench.naive()
        target = figures.instance / 2
        print(f"latency of one instance at ~{target:.0f} ticks/s (half its peak) ...", flush=True)
        bench.phase("latency")
        figures.latency = bench.latency(target, seconds=10)
        # The hot mix runs two instances, two workers and the load generator on the same two
        # cores as the broker and Postgres, so it is fed at a fraction of one instance's peak.
        mix = figures.instance * args.hot_fraction
        print(f"hot mix at ~{mix:.0f} ticks/s, co-partitioned by run ...", flush=True)
        bench.phase("hot-on")
        figures.hot_on = bench.hot_mix(mix, by_run=True, seconds=args.hot_seconds)
        print(f"hot mix at ~{mix:.0f} ticks/s, spread over partitions ...", flush=True)
        bench.phase("hot-off")
        figures.hot_off = bench.hot_mix(mix, by_run=False, seconds=args.hot_seconds)
    finally:
        sink.close()
        bench.teardown()
    report(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
