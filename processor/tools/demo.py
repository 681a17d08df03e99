"""`ductor demo`: the whole system on this machine, in one command.

It brings up the local Kafka and Postgres when they are not answering, migrates, creates the
topics, registers the sample workflows, starts a few thousand runs (some deliberately hot,
some meant to fail, some cancelled), runs two processor instances and a worker, shows live
progress, and ends with a table of every run's expected and actual terminal state. It exits 0
only if every run ended as expected.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from processor.core.envelope import Wakeup
from processor.core.model import SignalKind
from processor.core.routing import TopicNames, partition_for
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings, child_env
from processor.io.kafka.clients import produce, topic_partitions
from processor.io.kafka.configs import admin_config, producer_config
from processor.io.kafka.logs import with_logger
from processor.io.kafka.topics import create_topics
from processor.io.postgres.migrate import migrate
from processor.io.postgres.run_counts import statuses_with_prefix
from processor.io.postgres.runs_admin import insert_runs, insert_signal
from processor.io.postgres.workflows import register_workflow
from processor.io.shipped.files import sample_workflow
from processor.io.telemetry.logs import read_stats
from processor.tools.checkout import NEEDS_CHECKOUT, checkout_root
from processor.tools.child import popen_ductor
from processor.tools.waiting import polls

FAILING = parse_workflow(
    {
        "name": "demo-failing",
        "version": 1,
        "steps": [
            {"name": "prepare", "type": "fast"},
            {
                "name": "charge",
                "type": "fail",
                "depends_on": ["prepare"],
                "retry": {"max_attempts": 2, "backoff_ms": 100},
            },
        ],
    }
)
SLOW = parse_workflow(
    {
        "name": "demo-slow",
        "version": 1,
        "steps": [
            {"name": "wait", "type": "slow"},
            {"name": "more", "type": "slow", "depends_on": ["wait"]},
            {"name": "done", "type": "fast", "depends_on": ["more"]},
        ],
    }
)


@dataclass
class DemoPlan:
    """Which runs the demo starts and how each one must end."""

    expected: dict[str, str] = field(default_factory=dict)
    hot: list[str] = field(default_factory=list)
    to_cancel: list[str] = field(default_factory=list)


def silent_service(settings: Settings) -> str | None:
    """The service that does not answer (Postgres is asked first), or None."""
    try:
        with psycopg.connect(settings.pg_dsn, connect_timeout=3):
            pass
    except Exception:
        return f"Postgres at {settings.pg_dsn_redacted}"
    try:
        if (
            AdminClient(with_logger(admin_config(settings, "ductor-demo")))
            .list_topics(timeout=5)
            .brokers
        ):
            return None
    except Exception:
        pass
    return f"Kafka at {settings.bootstrap_servers}"


class ServicesDown(Exception):
    """Kafka or Postgres does not answer and there is no local infra to start (the message
    says what to do)."""


def ensure_infra(settings: Settings) -> None:
    """The services answer, or are started by the checkout's infra/local.py; ServicesDown
    when they do not answer and the package runs without a checkout."""
    silent = silent_service(settings)
    if silent is None:
        print("Kafka and Postgres are answering.")
        return
    root = checkout_root()
    if root is None:
        raise ServicesDown(
            f"{silent} does not answer: start it, or point DUCTOR_BOOTSTRAP_SERVERS and"
            f" DUCTOR_PG_DSN at yours ({NEEDS_CHECKOUT})"
        )
    print("Starting the local Kafka and Postgres (the first time installs them) ...", flush=True)
    started = subprocess.run([sys.executable, str(root / "infra" / "local.py"), "up"], check=False)
    if started.returncode != 0:
        raise ServicesDown(f"infra/local.py up failed with exit code {started.returncode}")


def demo_log_dir() -> Path:
    """Where the demo's processes log: the checkout's .infra/demo, or a new temporary
    directory for an installed package."""
    root = checkout_root()
    if root is None:
        return Path(tempfile.mkdtemp(prefix="ductor-demo-"))
    return root / ".infra" / "demo"


def prepare(settings: Settings, conn: psycopg.Connection[Any], runs: int, tag: str) -> DemoPlan:
    migrate(settings.pg_dsn)
    create_topics(settings)
    sample = parse_workflow(sample_workflow())
    for wf in (sample, FAILING, SLOW):
        register_workflow(conn, wf)
    plan = DemoPlan()
    groups: list[tuple[WorkflowDef, str, int, str]] = [
        (sample, "sample", runs, "succeeded"),
        (sample, "hot", 20, "succeeded"),
        (FAILING, "failing", max(5, runs // 100), "failed"),
        (SLOW, "cancel", max(5, runs // 100), "cancelled"),
    ]
    for wf, kind, count, expected in groups:
        ids = [f"demo-{tag}-{kind}-{i}" for i in range(count)]
        for start in range(0, len(ids), 5000):
            insert_runs(
                conn,
                wf,
                [(r, {}) for r in ids[start : start + 5000]],
                "t0" if kind == "hot" else "t1",
            )
        plan.expected.update(dict.fromkeys(ids, expected))
        if kind == "hot":
            plan.hot = ids
        if kind == "cancel":
            plan.to_cancel = ids
    for run_id in plan.to_cancel:
        insert_signal(conn, run_id, f"demo-{tag}", SignalKind.CANCEL)
    return plan


def wake(settings: Settings, plan: DemoPlan, hot_copies: int) -> None:
    """One start wakeup per run; the hot runs get `hot_copies` wakeups all at once, spread
    over every partition (as producers that do not co-partition would), so both processor
    instances tick them at the same time and lose version races: conflicts, not errors."""
    names = TopicNames(settings.topic_prefix)
    producer = Producer(with_logger(producer_config(settings, "ductor-demo")))
    partitions = topic_partitions(producer, names.wakeup_topics())
    hot = set(plan.hot)
    now_ms = int(time.time() * 1000)
    for run_id in plan.expected:
        tier = "t0" if run_id in hot else "t1"
        topic = names.wakeup(tier)
        wakeup = Wakeup(run_id, "start", produced_at=now_ms)
        for copy in range(hot_copies if run_id in hot else 1):
            partition = (
                copy % partitions[topic]
                if run_id in hot
                else partition_for(run_id, partitions[topic])
            )
            produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
    producer.flush(60)


class HotPoker:
    """Keeps waking the hot runs on every partition while they live, so both instances tick
    them at once: whenever a step result lands, they race to commit it and one loses."""

    def __init__(self, settings: Settings, hot: list[str], period_s: float = 0.02) -> None:
        self._settings = settings
        self._hot = hot
        self._period = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="hot-poker", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        topic = TopicNames(self._settings.topic_prefix).wakeup("t0")
        producer = Producer(with_logger(producer_config(self._settings, "ductor-demo-hot")))
        partitions = topic_partitions(producer, [topic])[topic]
        turn = 0
        while not self._stop.wait(self._period):
            for run_id in self._hot:
                wakeup = Wakeup(run_id, "signal", produced_at=int(time.time() * 1000))
                produce(producer, topic, wakeup.encode(), wakeup.key(), turn % partitions)
                turn += 1
            producer.poll(0)
        producer.flush(10)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


class DemoFleet:
    """The demo's child processes: two processors and a worker, each logging to a file of
    its own in ``log_dir``."""

    def __init__(self, settings: Settings, log_dir: Path) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        env = child_env(replace(settings, log_format="json", stats_log_interval_s=1.0))
        self.logs = {name: log_dir / f"{name}.log" for name in ("process-1", "process-2", "worker")}
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        for name, path in self.logs.items():
            args = ["worker"] if name == "worker" else ["process"]
            self.children[name] = popen_ductor(args, env, path)

    def processor_stats(self) -> list[dict[str, Any]]:
        """The latest stats line of each processor (final if it stopped)."""
        found = (read_stats(path) for name, path in self.logs.items() if name != "worker")
        return [stats for stats in found if stats is not None]

    def dead(self) -> list[str]:
        return [name for name, child in self.children.items() if child.poll() is not None]

    def stop(self) -> None:
        for child in self.children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        for child in self.children.values():
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()


def statuses(conn: psycopg.Connection[Any], tag: str) -> dict[str, str]:
    return statuses_with_prefix(conn, f"demo-{tag}-")


def totals(stats: list[dict[str, Any]]) -> dict[str, int]:
    out = {"committed": 0, "conflicts": 0, "requeues": 0, "errors": 0, "dead_letters": 0}
    for s in stats:
        out["committed"] += s["ticks"].get("committed", 0)
        out["conflicts"] += s["conflicts"]
        out["requeues"] += sum(s["requeues"].values())
        out["errors"] += sum(s["errors"].values())
        out["dead_letters"] += sum(s["dead_letters"].values())
    return out


def bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / total) if total else width
    return "█" * filled + "░" * (width - filled)


def run_demo(
    settings: Settings, runs: int = 3000, timeout_s: float = 300.0, hot_copies: int = 50
) -> int:
    tag = uuid.uuid4().hex[:6]
    ensure_infra(settings)
    conn = psycopg.connect(settings.pg_dsn, autocommit=True)
    plan = prepare(settings, conn, runs, tag)
    print(
        f"Starting {len(plan.expected)} runs ({runs} sample, {len(plan.hot)} hot runs woken"
        f" {hot_copies} times at once and then every 20 ms on every partition,"
        f" {len(plan.to_cancel)} to cancel, some meant to fail)"
    )
    logs = demo_log_dir()
    fleet = DemoFleet(settings, logs)
    started = time.monotonic()
    wake(settings, plan, hot_copies)
    poker = HotPoker(settings, plan.hot)
    tty = sys.stdout.isatty()
    last_print = 0.0
    last_committed, last_at = 0, started
    rate = 0.0
    try:
        for now in polls(timeout_s, 0.25):  # the refresh period of the progress display
            current = statuses(conn, tag)
            ended = sum(1 for s in current.values() if s in {"succeeded", "failed", "cancelled"})
            t = totals(fleet.processor_stats())
            if now - last_at >= 1.0:
                rate = (t["committed"] - last_committed) / (now - last_at)
                last_committed, last_at = t["committed"], now
            line = (
                f"{bar(ended, len(plan.expected))} {ended}/{len(plan.expected)} runs done"
                f" | {rate:6.0f} ticks/s | conflicts {t['conflicts']} | requeues {t['requeues']}"
                f" | errors {t['errors']} | {now - started:5.1f} s"
            )
            if tty:
                print("\r" + line, end="", flush=True)
            elif now - last_print >= 2.0:
                print(line, flush=True)
                last_print = now
            if ended == len(plan.expected):
                break
            if fleet.dead():
                print(f"\nA demo process exited early: {', '.join(fleet.dead())} (see {logs})")
                break
        else:
            print(f"\nGave up after {timeout_s:.0f} s.")
    finally:
        poker.stop()
        fleet.stop()
    elapsed = time.monotonic() - started
    final = statuses(conn, tag)
    conn.close()
    print()
    return summary(plan, final, totals(fleet.processor_stats()), elapsed, logs)


def summary(
    plan: DemoPlan, final: dict[str, str], t: dict[str, int], elapsed: float, logs: Path
) -> int:
    rows: Counter[tuple[str, str, str]] = Counter()
    for run_id, expected in plan.expected.items():
        kind = run_id.split("-")[2]
        rows[(kind, expected, final.get(run_id, "missing"))] += 1
    print()
    print(f"{'runs':10} {'expected':10} {'actual':10} {'count':>7}")
    print("-" * 40)
    for (kind, expected, actual), count in sorted(rows.items()):
        mark = "" if expected == actual else "   <-- unexpected"
        print(f"{kind:10} {expected:10} {actual:10} {count:7}{mark}")
    print("-" * 40)
    print(
        f"{len(plan.expected)} runs in {elapsed:.1f} s: {t['committed']} ticks committed,"
        f" {t['conflicts']} conflicts (expected, not errors), {t['requeues']} requeues,"
        f" {t['errors']} errors, {t['dead_letters']} dead letters"
    )
    print(f"Logs: {logs}/*.log (JSON). Traces: set OTEL_EXPORTER_OTLP_ENDPOINT (or use")
    print("DUCTOR_INFRA=docker for Jaeger at http://localhost:16686) before `make demo`.")
    ok = all(final.get(r) == e for r, e in plan.expected.items())
    print("Every run ended as expected." if ok else "Some runs did not end as expected.")
    return 0 if ok else 1
