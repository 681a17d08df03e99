"""The benchmark's harness (`Harness`): fresh topics and group per phase, the runs it
inserts, the processes it spawns and how it samples their progress and their CPU; the phases
built on it are bench_phases.py's."""

from __future__ import annotations

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

from processor.core.envelope import Wakeup
from processor.core.routing import DEFAULT_QUEUE, TopicNames
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
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
)
from processor.tools.child import popen_ductor
from processor.tools.databases import drop_database
from processor.tools.waiting import polls


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


class Harness:
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

    def rate_between(
        self, ids: list[str], low: float, high: float, timeout: float, meter: CpuMeter
    ) -> Cost:
        """The committed ticks per second between ``low`` and ``high`` of the runs ticked
        (one tick each), and the CPU ``meter`` saw over that window."""
        prefix = ids[0].rsplit("-", 1)[0] + "-"
        marks: dict[float, tuple[float, int]] = {}
        cpu: CpuUse | None = None
        for _ in polls(timeout, 0.05):
            done = count_ticked_with_prefix(self.conn, prefix)
            now = time.monotonic()
            if low not in marks and done >= low * len(ids):
                marks[low] = (now, done)
                meter.start()
            elif low in marks and high not in marks and done >= high * len(ids):
                marks[high] = (now, done)
                cpu = meter.stop()
                break
        else:
            raise RuntimeError(f"only {done} of {len(ids)} runs ticked within {timeout} s")
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
        for _ in polls(timeout, 0.1):
            done = count(self.conn, ids)
            if done == len(ids):
                return
        raise RuntimeError(f"only {done} of {len(ids)} runs {what} within {timeout} s")

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
        seen = "no answer"
        for _ in polls(timeout, 0.2):
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
        raise RuntimeError(
            f"group {group}: {seen}, not {members} members holding {wanted} within {timeout} s"
        )

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
        return popen_ductor(args, env, self.log_path(name))
