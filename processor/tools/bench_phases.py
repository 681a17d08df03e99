"""The benchmark's phases (`Bench`, on the harness of bench_harness.py): what it measures of
each; bench.py runs them in order and reports.
"""

from __future__ import annotations

import os
import random
import time
from typing import Any

from confluent_kafka import Producer

from processor.client import wake
from processor.io.kafka.configs import producer_config
from processor.io.kafka.logs import with_logger
from processor.tools.bench_baselines import ceiling_rate, naive_rate
from processor.tools.bench_cpu import CpuUse
from processor.tools.bench_harness import Harness
from processor.tools.bench_support import Cost, final_stats, paced, peak_rss, stop
from processor.tools.waiting import polls

# Partitions per wakeup and delay topic in the scaling phases: 1, 2 and 4 instances each get
# the same share (the range assignor gives the first members one more when it does not divide).
SCALING_PARTITIONS = 8


class Bench(Harness):
    """The benchmark's phases, each measured on fresh topics (bench.py runs them in order)."""

    # -- idle ----------------------------------------------------------------------------------

    def idle(self, seconds: float) -> CpuUse:
        """What the broker and Postgres spend with nothing of ours running (the machine's
        other users show in its busy time): the floor under the figures of slow phases."""
        meter = self.meter([])
        meter.start()
        time.sleep(seconds)  # a measurement window, not a wait for a condition
        return meter.stop()

    # -- ceiling -------------------------------------------------------------------------------

    def ceiling(self, rounds: int = 3) -> Cost:
        """Ticks per second of the batched conditional UPDATE alone (states precomputed): the
        best of a few rounds, since a ceiling is what the database can do when nothing (an
        autovacuum, a checkpoint) gets in its way. Its CPU is the best round's; the
        "instance" there is the benchmark's own process, the client of the UPDATEs."""
        return max((self._ceiling_round(f"ceil{r}") for r in range(rounds)), key=lambda c: c.rate)

    def _ceiling_round(self, label: str) -> Cost:
        ids = self.ids(label, self.n(10000))
        self.insert(self.one, ids)
        meter = self.meter([os.getpid()], polling=False)
        rate, cpu = ceiling_rate(self.conn, ids, self.settings.batch_size, self.names, meter)
        return Cost(len(ids), len(ids) / rate, cpu)

    # -- one instance --------------------------------------------------------------------------

    def instance(
        self, extra_env: dict[str, str] | None = None, label: str = "inst"
    ) -> tuple[Cost, int]:
        """Committed ticks per second of one `ductor process` on uncontended runs, and its
        peak RSS in bytes. The backlog is produced first; the rate is taken between 10 % and
        90 % of the commits so that start-up and the tail do not count."""
        ids = self.ids(label, self.n(20000))
        self.insert(self.one, ids)
        self.produce_starts(ids, duplicates=1, by_run=True)
        child = self.spawn(["process"], extra_env or {}, f"{label}-process")
        try:
            meter = self.meter([child.pid])
            cost = self.rate_between(ids, 0.1, 0.9, timeout=300, meter=meter)
            rss = peak_rss(child.pid)
        finally:
            stop(child)
        return cost, rss

    # -- latency at a paced load -------------------------------------------------------------------

    def latency(self, ticks_per_s: float, seconds: float) -> dict[str, Any]:
        """Wakeup-to-commit latency of one instance fed at a steady ``ticks_per_s``."""
        ids = self.ids("lat", int(ticks_per_s * seconds))
        warmup = self.ids("lat-warmup", 1)
        self.insert(self.one, ids + warmup)
        child = self.spawn(["process"], {}, "latency-process")
        producer = Producer(with_logger(producer_config(self.settings, "bench-latency")))
        try:
            self.produce_starts(warmup, duplicates=1, by_run=True)
            self.wait_ticked(warmup, timeout=60)  # the instance is assigned and warm
            meter = self.meter([child.pid])
            meter.start()
            started = time.monotonic()
            paced(
                seconds,
                len(ids),
                lambda i: self.produce_start(producer, ids[i], 1, True),
                lambda: None,
            )
            producer.flush(30)
            self.wait_ticked(ids, timeout=120)
            cost = Cost(len(ids), time.monotonic() - started, meter.stop())
        finally:
            stop(child)
        stats = final_stats(self.log_path("latency-process"))
        e2e = stats["latency_ms"]["end_to_end"]
        return {
            "rate": ticks_per_s,
            "p50": e2e["p50"] or 0.0,
            "p99": e2e["p99"] or 0.0,
            # Within it: the record's way to the instance (the producer, the broker, the
            # fetch), the tick's own computation and its batch's commit statement; the rest is
            # the record's wait in the instance for its batch.
            "parts": {k: stats["latency_ms"][k] for k in ("arrival", "tick", "commit")},
            "cost": cost,
        }

    # -- naive baseline ------------------------------------------------------------------------

    def naive(self) -> Cost:
        """The baseline: one record at a time, load, tick, conditional UPDATE, sync commit.
        It runs in the benchmark's own process, which is the "instance" of its CPU figures."""
        ids = self.ids("naive", self.n(3000))
        self.insert(self.one, ids)
        meter = self.meter([os.getpid()], polling=False)
        rate, cpu = naive_rate(self.settings, self.conn, ids, f"bench-naive-{self.tag}", meter)
        return Cost(len(ids), len(ids) / rate, cpu)

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
            self.spawn(["worker", "--concurrency", "8"], env, f"{label}-worker-{i}")
            for i in range(2)
        ]
        producer = Producer(with_logger(producer_config(self.settings, "bench-load")))
        prefix = f"b{self.tag}-{label}-"
        try:
            # The steady state is measured, as in the end-to-end phases: the load starts once
            # both groups are stable with every member holding partitions (the rebalances of
            # four processes joining would otherwise land in the window and its tail).
            self.wait_group(self.settings.group_id, 2, coordinator=True)
            self.wait_group(self.settings.worker_group_id, 2, coordinator=False)
            self.produce_starts(hot_ids, duplicates=1, by_run=by_run)
            meter = self.meter(
                [c.pid for c in children[:2]], [c.pid for c in children[2:]], polling=True
            )
            before = self.committed(prefix)
            meter.start()
            started = time.monotonic()
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
            cpu = meter.stop()
            wall = time.monotonic() - started
            cost = Cost(self.committed(prefix) - before, wall, cpu)
        finally:
            for child in children:
                stop(child)
        stats = [final_stats(self.log_path(f"{label}-process-{i}")) for i in range(2)]
        return {**_mix_figures(stats), "runs": len(ids), "rate": target_ticks_per_s, "cost": cost}

    # -- end to end ----------------------------------------------------------------------------

    def end_to_end(self, processors: int, workers: int, runs: int) -> dict[str, Any]:
        """Runs per second of the 4-step workflow (s0; s1 and s2 after it; s3 after both; the
        sample registry's no-op `fast` steps) with ``processors`` instances and ``workers``
        workers, from the first start wakeup produced to the last run ended, with the CPU of
        every process over that time.

        The runs are inserted first, as `ductor start` inserts them, and the clock starts
        when their start wakeups are produced, as `ductor start` then does (``wake``). The
        insert comes before the processes start so that their statements are planned on the
        table as it will be (plans made on a nearly empty table and kept by a connection
        scan the whole table later: docs/performance.md)."""
        label = f"e2e{processors}"
        ids = self.ids(f"{label}-run", runs)
        warmup = self.ids(f"{label}-warmup", 20)
        self.insert(self.quad, ids + warmup)
        children = [self.spawn(["process"], {}, f"{label}-process-{i}") for i in range(processors)]
        children += [
            self.spawn(["worker", "--concurrency", "8"], {}, f"{label}-worker-{i}")
            for i in range(workers)
        ]
        prefix = f"b{self.tag}-{label}-run-"
        try:
            # Every instance and worker has joined its group and holds partitions, and the
            # whole path (connections, topics, step functions) is warm.
            self.wait_group(self.settings.group_id, processors, coordinator=True)
            self.wait_group(self.settings.worker_group_id, workers, coordinator=False)
            wake(self.settings, warmup, "t1", "start")
            self.wait_terminal(warmup, timeout=60)
            meter = self.meter(
                [c.pid for c in children[:processors]], [c.pid for c in children[processors:]]
            )
            meter.start()
            started = time.monotonic()
            wake(self.settings, ids, "t1", "start")  # what `ductor start` does after inserting
            for _ in polls(600, 0.05):
                if (done := self.count_ended_with_prefix(prefix)) >= runs:
                    break
            else:
                raise RuntimeError(f"end to end: only {done} of {runs} runs ended in 600 s")
            cpu = meter.stop()
            wall = time.monotonic() - started
            ticks = self.committed(prefix)
            succeeded = self.count_succeeded_with_prefix(prefix)
        finally:
            for child in children:
                stop(child)
        return {
            "processors": processors,
            "workers": workers,
            "runs": runs,
            "succeeded": succeeded,
            "cost": Cost(ticks, wall, cpu),
        }

    # -- scaling -------------------------------------------------------------------------------

    def scaling(self, instances: int) -> dict[str, Any]:
        """Committed ticks per second of ``instances`` instances in one group over the same
        topics on uncontended one-step runs, between 10 % and 90 % of the commits, once
        every instance holds its partitions (the backlog is produced after that)."""
        label = f"scale{instances}"
        ids = self.ids(label, self.n(60000))
        self.insert(self.one, ids)
        children = [self.spawn(["process"], {}, f"{label}-process-{i}") for i in range(instances)]
        try:
            self.wait_group(self.settings.group_id, instances, coordinator=True)
            meter = self.meter([c.pid for c in children])
            self.produce_starts(ids, duplicates=1, by_run=True)
            cost = self.rate_between(ids, 0.1, 0.9, timeout=300, meter=meter)
        finally:
            for child in children:
                stop(child)
        return {"instances": instances, "cost": cost}


def _mix_figures(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """The hot mix's conflicts, errors and latency, from its two instances' final stats."""
    conflicts = sum(s["conflicts"] for s in stats)
    sent = sum(s["commits_sent"] for s in stats)
    e2e = [s["latency_ms"]["end_to_end"] for s in stats]
    return {
        "wasted": conflicts / sent if sent else 0.0,
        "conflicts": conflicts,
        "commits": sent,
        "errors": sum(sum(s["errors"].values()) for s in stats),
        "p50": max(x["p50"] or 0 for x in e2e),
        "p99": max(x["p99"] or 0 for x in e2e),
    }
