"""The benchmark's harness and phases (`Bench`): fresh topics per phase, the runs it inserts,
the processes it spawns and what it measures of each; bench.py runs them in order and reports.
"""

from __future__ import annotations

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
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from processor.client import wake
from processor.core.envelope import Wakeup
from processor.core.routing import DEFAULT_QUEUE, TopicNames
from processor.core.workflow import WorkflowDef, parse_workflow
from processor.io.config.settings import Settings, child_env
from processor.io.kafka.clients import choose_partition, produce
from processor.io.kafka.configs import admin_config, producer_config
from processor.io.kafka.logs import with_logger
from processor.io.kafka.topics import create_topics, desired_topics
from processor.io.postgres.migrate import migrate
from processor.io.postgres.run_counts import (
    count_ended,
    count_ticked,
    count_ticked_with_prefix,
    delete_runs_with_prefix,
    like_prefix,
    vacuum_runs,
)
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow
from processor.tools.bench_baselines import ceiling_rate, naive_rate
from processor.tools.bench_cpu import (
    CpuMeter,
    CpuUse,
    Group,
    find_brokers,
    find_postmaster,
    other_sessions,
)
from processor.tools.bench_support import (
    Cost,
    final_stats,
    paced,
    peak_rss,
    stop,
)
from processor.tools.databases import drop_database

# Partitions per wakeup and delay topic in the scaling phases: 1, 2 and 4 instances each get
# the same share (the range assignor gives the first members one more when it does not divide).
SCALING_PARTITIONS = 8


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


def fresh_database(base: Settings, wait_s: float = 120.0) -> Settings:
    """``base`` on a database of the benchmark's own (``<database>_bench``), created empty for
    this run. On the database the tests use, the figures depended on its history: tables
    grown and emptied, leftover instance rows; the Postgres CPU per run of one phase was ~30 %
    higher there than on a fresh database, the same code in the same session."""
    dsn = conninfo_to_dict(base.pg_dsn)
    name = f"{dsn.get('dbname') or dsn.get('user') or 'ductor'}_bench"
    with psycopg.connect(base.pg_dsn, autocommit=True) as conn:
        drop_database(conn, name, wait_s)
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    return replace(base, pg_dsn=make_conninfo(base.pg_dsn, dbname=name))


class Bench:
    def __init__(self, base: Settings, scale: float) -> None:
        self.tag = uuid.uuid4().hex[:6]
        self.base = base
        self.phases: list[Settings] = []
        self.settings = self.phase("setup")
        self.scale = scale
        self.conn = psycopg.connect(base.pg_dsn, autocommit=True)
        self.admin = AdminClient(with_logger(admin_config(base, "bench")))
        self.one = _workflow("bench-one", 1)
        self.quad = _workflow("bench-quad", 4)
        self.chain = _workflow("bench-chain", 40, chain=True)
        dsn = conninfo_to_dict(base.pg_dsn)
        self.pg_host = str(dsn.get("host") or "/var/run/postgresql").split(",")[0]
        self.pg_port = int(str(dsn.get("port") or 5432).split(",")[0])
        self.database = str(dsn.get("dbname") or dsn.get("user") or "")
        # What every process the benchmark spawns gets on top of its settings: the build
        # comparison sets DUCTOR_PURE_PYTHON=1 here for its pure-Python phases.
        self.build_env: dict[str, str] = {}

    def n(self, base: int) -> int:
        return max(100, int(base * self.scale))

    @property
    def names(self) -> TopicNames:
        return TopicNames(self.settings.topic_prefix)

    def phase(self, label: str, partitions: int = 6) -> Settings:
        """Fresh topics and group for a phase, and no live runs left from the previous one:
        a phase's workers must not pick up another phase's step tasks, nor its watchdog
        re-wake another phase's runs."""
        settings = replace(
            self.base,
            topic_prefix=f"bench-{self.tag}-{label}",
            group_id=f"bench-{self.tag}-{label}",
            wakeup_partitions=partitions,
            delay_partitions=partitions,
            step_partitions=4,
        )
        self.phases.append(settings)
        self.settings = settings
        if label != "setup":
            create_topics(settings)
            self.forget_runs()
        return settings

    def forget_runs(self) -> None:
        """Delete this bench's runs, which a later phase's watchdog (of this bench or of
        another on the same database) would otherwise find overdue and wake again."""
        delete_runs_with_prefix(self.conn, f"b{self.tag}-")

    def setup(self) -> None:
        migrate(self.base.pg_dsn)
        # Earlier runs leave dead rows behind; start from a vacuumed, analysed table.
        vacuum_runs(self.conn)
        for wf in (self.one, self.quad, self.chain):
            register_workflow(self.conn, wf)

    def teardown(self) -> None:
        try:
            delete_runs_with_prefix(self.conn, f"b{self.tag}-")
        except psycopg.Error as exc:  # best effort, as below: do not mask what failed
            print(f"  (could not delete the bench's runs: {exc})", file=sys.stderr)
        admin = self.admin
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
            chunk = ids[start : start + 5000]
            insert_runs(self.conn, wf, [(r, {}) for r in chunk], "t1")
            # A new run is due at once, for the sweep to start it should its start wakeup be
            # lost; the benchmark inserts long before it wakes its runs (so that the processes
            # plan their statements on the table as it will be), and its runs must start by
            # their wakeups, as they do when `ductor start` inserts and wakes at once.
            self.conn.execute(
                "UPDATE eec_workflow_run SET next_wakeup_at = NULL WHERE run_id = ANY(%s)",
                (chunk,),
            )
        # The rows the previous phase left dead and the ones just inserted would draw an
        # autovacuum into the measured window (a cost of the benchmark's own set-up, not of
        # the ticks): vacuum them now.
        vacuum_runs(self.conn)

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

    def rate_between(
        self, ids: list[str], low: float, high: float, timeout: float, meter: CpuMeter
    ) -> Cost:
        """The committed ticks per second between ``low`` and ``high`` of the runs ticked
        (one tick each), and the CPU ``meter`` saw over that window."""
        prefix = ids[0].rsplit("-", 1)[0] + "-"
        marks: dict[float, tuple[float, int]] = {}
        cpu: CpuUse | None = None
        deadline = time.monotonic() + timeout
        while len(marks) < 2:
            done = count_ticked_with_prefix(self.conn, prefix)
            now = time.monotonic()
            if low not in marks and done >= low * len(ids):
                marks[low] = (now, done)
                meter.start()
            elif low in marks and high not in marks and done >= high * len(ids):
                marks[high] = (now, done)
                cpu = meter.stop()
            if now > deadline:
                raise RuntimeError(f"only {done} of {len(ids)} runs ticked within {timeout} s")
            time.sleep(0.05)  # the benchmark samples progress; this is not a test
        (t0, c0), (t1, c1) = marks[low], marks[high]
        assert cpu is not None
        return Cost(c1 - c0, max(1e-6, t1 - t0), cpu)

    def meter(
        self, instances: Sequence[int], workers: Sequence[int] = (), polling: bool = True
    ) -> CpuMeter:
        """A meter of the processes of a phase: its instances (or the benchmark's own process
        where it is the client), its workers, the broker, and Postgres with every process of
        its cluster but the backends of other databases and, when it only samples progress
        (``polling``), the benchmark's own session."""
        own = [self.conn.info.backend_pid] if polling else []
        # The services' processes, looked up afresh (a restart gives them new pids), when
        # they run on this machine; else their CPU is unknown.
        brokers = find_brokers(self.base.bootstrap_servers)
        postmaster = find_postmaster(self.pg_host, self.pg_port)
        return CpuMeter(
            [
                Group("instance", tuple(instances)),
                Group("worker", tuple(workers)),
                Group("broker", brokers),
                Group(
                    "postgres",
                    (postmaster,) if postmaster else (),
                    tree=True,
                    exclude=other_sessions(self.database, own),
                ),
            ]
        )

    def committed(self, prefix: str) -> int:
        """Transitions committed so far on the runs whose id starts with ``prefix`` (each
        committed tick adds exactly one to its run's ``last_transition_seq``)."""
        row = self.conn.execute(
            "SELECT coalesce(sum(last_transition_seq), 0) FROM eec_workflow_run"
            " WHERE run_id LIKE %s",
            (like_prefix(prefix),),
        ).fetchone()
        return int(row[0]) if row else 0

    def count_ended_with_prefix(self, prefix: str) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM eec_workflow_run WHERE run_id LIKE %s"
            " AND status IN ('succeeded', 'failed', 'cancelled')",
            (like_prefix(prefix),),
        ).fetchone()
        return int(row[0]) if row else 0

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
            "cost": cost,
        }

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
            "cost": cost,
        }

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
            deadline = started + 600
            while (done := self.count_ended_with_prefix(prefix)) < runs:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"end to end: only {done} of {runs} runs ended in 600 s")
                time.sleep(0.05)  # the benchmark samples progress; this is not a test
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

    def count_succeeded_with_prefix(self, prefix: str) -> int:
        row = self.conn.execute(
            "SELECT count(*) FROM eec_workflow_run WHERE run_id LIKE %s AND status = 'succeeded'",
            (like_prefix(prefix),),
        ).fetchone()
        return int(row[0]) if row else 0

    def wait_group(self, group: str, members: int, coordinator: bool, timeout: float = 60) -> None:
        """Until the consumer group is stable with ``members`` members, each holding
        partitions, and every partition of its topics assigned."""
        names = self.names
        topics = names.coordinator_topics() if coordinator else names.step_topics(DEFAULT_QUEUE)
        per_topic = (
            self.settings.wakeup_partitions if coordinator else self.settings.step_partitions
        )
        wanted = len(topics) * per_topic
        deadline = time.monotonic() + timeout
        seen = "no answer"
        while True:
            try:
                description = self.admin.describe_consumer_groups([group])[group].result(30)
            except (TimeoutError, KafkaException) as exc:
                # A new cluster's group coordinator may not answer yet: asked again.
                seen = f"no answer ({type(exc).__name__})"
            else:
                held = [len(m.assignment.topic_partitions) for m in description.members]
                stable = str(description.state).endswith("STABLE")
                if stable and len(held) == members and all(held) and sum(held) == wanted:
                    return
                seen = f"{description.state}, partitions held {held}"
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"group {group}: {seen}, not {members} members holding {wanted}"
                    f" within {timeout} s"
                )
            time.sleep(0.2)  # the benchmark waits for the group; this is not a test

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

    # -- plumbing ------------------------------------------------------------------------------

    def produce_starts(self, ids: Sequence[str], duplicates: int, by_run: bool) -> None:
        producer = Producer(with_logger(producer_config(self.settings, "bench-load")))
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
        env = child_env(replace(self.settings, log_format="json"))
        env.update(self.build_env)
        env.update(extra_env)
        log = self.log_path(name).open("wb")
        return subprocess.Popen(
            [sys.executable, "-m", "processor", *args], env=env, stdout=log, stderr=log
        )
