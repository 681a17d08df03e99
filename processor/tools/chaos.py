"""`make chaos`: the coordinator under crashes and outages, against the real services.

A few thousand runs of the sample workflow are started over the run's duration, each start
wakeup produced three times onto random partitions. Three `ductor process` and two `ductor
worker` subprocesses (both reaching Postgres through a proxy that can freeze it) advance them
while faults come one at a time, at random times: SIGKILLs of processors and of workers (each
started again at once), processors armed to SIGKILL themselves right after a commit and
before its effects are produced (``after_commit=kill@N``), the broker killed with SIGKILL and
started again on its data, Postgres restarted in immediate mode, Postgres frozen behind
the proxy, and a live run's row held FOR UPDATE by an outside transaction (an operator's open
`psql`); a few runs are inserted without their start wakeup (lost starts) for the sweep to
start. Meanwhile a hostile producer (processor/tools/chaos_hostile.py) writes to the requests
topic, which the processors read under a scope (``DUCTOR_REQUESTS_*``): records nested 300
levels and other JSON no door may store, starts of reserved and colliding run ids, forged
cancels and approvals, and the run's own traffic, one run of a map over 10,000 items started
and approved through the topic. Then every run must end.

Checked with the audit trail (processor/tools/audit.py) in the same database: every run
succeeded (so none was force-failed as stuck or for livelock), no transition was applied
twice, no step attempt was dispatched or resolved twice, every succeeded node's result was
recorded and applied, no write to a run row left its version where it was (the row has one
writer: the sweeps' marks and quarantine flags live beside it), every attempt that timed out
reached a worker (no task was lost) and was in flight while a step could really be held back
(Postgres frozen, the broker down, a killed worker's session not yet expired:
processor/tools/chaos_report.py), no process exited by itself, no effect was left in the
outbox, nothing was dead-lettered but the hostile records, each once with the reason it must
get, no forged record signalled a run or made one, and the map run succeeded with every
item's output.

Then a backlog phase (processor/tools/chaos_backlog.py, ``--backlog-runs 0``: none): workers
SIGKILLed under a backlog of 1 s steps with one attempt, and no run failed for queue time.

It needs the services infra/local.py runs (it restarts them), so it runs from a checkout of
the repository (processor/tools/checkout.py); from an installed package it says so and exits 2:

    python -m processor.tools.chaos [--runs N] [--duration S] [--kills N] [--seed N] ...

The figures are printed at the end; the exit code is 0 only if every check passed. Child logs
(JSON lines, one file per start of each process) stay in <infra dir>/chaos/<tag>/.

With ``--cluster`` it runs on a local three-broker cluster started for it (three replicas,
min.insync.replicas 2), and a broker outage SIGKILLs the node leading most of the run's
partitions while the other two serve: ``--cluster --broker-down 60`` is a leader killed under
load and started again on its data a minute later.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from processor.core.workflow import WorkflowDef, parse_workflow
from processor.io.config.settings import Settings, load_settings
from processor.io.config.values import ConfigError
from processor.io.kafka.configs import admin_config
from processor.io.kafka.dlq import DlqError, read_dead_letters
from processor.io.kafka.logs import with_logger
from processor.io.kafka.topics import busiest_broker, create_topics, delete_topics
from processor.io.postgres.connections import connect_durable
from processor.io.postgres.migrate import migrate
from processor.io.postgres.run_counts import count_ended, delete_runs_with_prefix, like_prefix
from processor.io.postgres.workflows import register_workflow
from processor.io.shipped.files import sample_workflow
from processor.tools import audit, chaos_backlog, chaos_steps
from processor.tools.chaos_fleet import PROCESSOR, WORKER, Arming, Fleet
from processor.tools.chaos_hostile import (
    HostilePlan,
    HostileProducer,
    check_hostile,
    map_run_id,
    map_workflow,
    scoped,
)
from processor.tools.chaos_load import Feeder
from processor.tools.chaos_report import (
    BROKER,
    FREEZE,
    LOCK,
    POSTGRES,
    ChaosReport,
    Window,
    check,
)
from processor.tools.checkout import NEEDS_CHECKOUT
from processor.tools.proxy import TcpProxy

if TYPE_CHECKING:
    # Imported by main() only: local_infra is built on the checkout's infra/local.py.
    from processor.tools.local_infra import LocalInfra

_PROGRESS_EVERY_S = 10.0
_WARMUP_S = 3.0
# How long a broker takes to start on its data, and Postgres to restart, on the dev machine
# under load: the kills are spread over the time between the outages.
_BROKER_START_S = 12.0
_POSTGRES_RESTART_S = 1.0


@dataclass(frozen=True)
class ChaosPlan:
    runs: int = 3000
    duration_s: float = 150.0  # faults come within this; the runs are started over 80 % of it
    kills: int = 60  # SIGKILLs of processors and workers (the armed processors' come on top)
    worker_share: float = 1 / 3  # of the kills, the share that kills a worker
    arming: Arming = field(default_factory=Arming)
    broker_restarts: int = 1
    broker_down_s: float = 5.0  # how long the killed broker stays down before its restart
    postgres_restarts: int = 1
    freeze_s: float = 30.0  # 0: no freeze
    lock_s: float = 20.0  # a live run's row held FOR UPDATE from outside this long; 0: none
    lost_starts: int = 30  # runs inserted without their start wakeup
    processors: int = 3
    workers: int = 2
    copies: int = 3  # deliveries of each start wakeup
    # Every step's deadline, well above the group's session timeout (10 s locally: a killed
    # worker's tasks wait that long for another worker) and the freeze, as docs/guarantees.md
    # advises for production; the sample's own 10 s would let worker kills exhaust a step's
    # attempts, a configuration limit rather than the coordinator's.
    step_timeout_s: float = 60.0
    # After the last fault, for every run to end: the map run's 10,000 items end 3 minutes
    # after it on the 2-core dev machine, 8 when other work loads it (load 15: seed 4104).
    finish_timeout_s: float = 600.0
    seed: int = 0
    hostile: HostilePlan = field(default_factory=HostilePlan)


# The variant `make test` runs (tests/integration/test_chaos.py): about a minute.
SHORT = ChaosPlan(
    runs=300,
    duration_s=35.0,
    kills=10,
    arming=Arming(budget=3),
    broker_down_s=2.0,
    freeze_s=5.0,
    lock_s=5.0,
    lost_starts=10,
    finish_timeout_s=90.0,
    # A few dozen hostile records (every kind thrice) and a map of 1,000 items: CI's seconds.
    hostile=HostilePlan(records=51, map_items=1000),
)


@dataclass(frozen=True)
class Fault:
    at_s: float  # from the start of the run
    kind: str  # BROKER, POSTGRES, FREEZE, PROCESSOR or WORKER (a SIGKILL of one)


def expected_s(kind: str, plan: ChaosPlan) -> float:
    """How long a fault of ``kind`` should take (a kill: no time)."""
    if kind == BROKER:
        return plan.broker_down_s + _BROKER_START_S
    if kind == POSTGRES:
        return _POSTGRES_RESTART_S
    if kind == LOCK:
        return plan.lock_s
    return plan.freeze_s if kind == FREEZE else 0.0


def schedule(plan: ChaosPlan, rng: random.Random) -> list[Fault]:
    """The outages evenly spaced over the duration (interleaved: broker, postgres, freeze,
    broker...), and the kills at random times between them."""
    counts = {BROKER: plan.broker_restarts, POSTGRES: plan.postgres_restarts}
    counts[FREEZE] = 1 if plan.freeze_s > 0 else 0
    counts[LOCK] = 1 if plan.lock_s > 0 else 0
    kinds: list[str] = []
    for turn in range(max(counts.values())):
        kinds += [kind for kind, n in counts.items() if turn < n]
    span = plan.duration_s - _WARMUP_S
    outages = [Fault(_WARMUP_S + span * (i + 1) / (len(kinds) + 1), k) for i, k in enumerate(kinds)]
    busy = [(f.at_s, f.at_s + expected_s(f.kind, plan)) for f in outages]
    free: list[tuple[float, float]] = []
    cursor = _WARMUP_S
    for start, end in [*busy, (plan.duration_s, plan.duration_s)]:
        if start > cursor:
            free.append((cursor, start))
        cursor = max(cursor, end)
    total = sum(end - start for start, end in free)
    kills = []
    for _ in range(plan.kills):
        offset = rng.uniform(0, total)
        for start, end in free:
            if offset <= end - start:
                kind = WORKER if rng.random() < plan.worker_share else PROCESSOR
                kills.append(Fault(start + offset, kind))
                break
            offset -= end - start
    return sorted([*outages, *kills], key=lambda f: f.at_s)


class _Chaos:
    """One chaos run: the fleet, the load, the proxy and the faults, and what happened."""

    def __init__(
        self,
        settings: Settings,
        plan: ChaosPlan,
        infra: LocalInfra,
        log_dir: Path,
        out: Callable[[str], None],
    ) -> None:
        self.settings = settings
        self.plan = plan
        self.infra = infra
        self.out = out
        self.prefix = f"{settings.topic_prefix}-"
        self.run_ids = [f"{self.prefix}{i}" for i in range(plan.runs)]
        self.windows: list[Window] = []
        self.proxy = TcpProxy.for_dsn(settings.pg_dsn)
        rng = random.Random(plan.seed)
        self.faults = schedule(plan, rng)
        children = replace(
            scoped(settings, settings.topic_prefix),
            pg_dsn=self.proxy.dsn(settings.pg_dsn),
            stats_log_interval_s=1.0,
            shutdown_timeout_s=10.0,
        )
        self.map_id = map_run_id(settings.topic_prefix)
        self.fleet = Fleet(
            children, log_dir, plan.processors, plan.workers, rng, plan.arming, self._fault
        )
        self.began = time.monotonic()
        self._next_progress = 0.0

    def _fault(self, kind: str, name: str) -> None:
        now = time.time()
        self.windows.append(Window(kind, name, now, now))
        self.out(f"{self._t():6.1f} s  {kind}: {name}")

    def _t(self) -> float:
        return time.monotonic() - self.began

    def run(self, wf: WorkflowDef) -> ChaosReport:
        plan = self.plan
        feeder = Feeder(
            self.settings,
            wf,
            self.run_ids,
            plan.duration_s * 0.8,
            plan.copies,
            random.Random(plan.seed + 1),
            plan.lost_starts,
        )
        hostile = HostileProducer(
            self.settings,
            plan.hostile,
            self.run_ids,
            lambda: feeder.started,
            plan.duration_s * 0.8,
            plan.duration_s * plan.hostile.map_at,
            random.Random(plan.seed + 2),
        )
        self.began = time.monotonic()
        self.fleet.start()
        feeder.start()
        hostile.start()
        problems: list[str] = []
        try:
            late = 0.0  # an outage that took longer than expected moves what follows
            for fault in self.faults:
                self._wait_until(fault.at_s + late, feeder)
                late += max(0.0, self._inflict(fault) - expected_s(fault.kind, plan))
            self.fleet.stop_arming()
            if not feeder.join(plan.finish_timeout_s):
                problems.append(
                    f"the feeder did not start every run: {feeder.started} started,"
                    f" {feeder.acknowledged}/{feeder.expected} wakeups acknowledged,"
                    f" error {feeder.error!r}"
                )
            if not hostile.join(plan.finish_timeout_s):
                problems.append(
                    f"the hostile producer did not write every record: {len(hostile.sent)}"
                    f" sent, {len(hostile.acknowledged)} acknowledged, error {hostile.error!r}"
                )
            ended_at = self._wait_for_the_end(feeder)
        finally:
            feeder.stop()
            hostile.stop()
            codes = self.fleet.stop()
            self.proxy.close()
            self.infra.ensure_running()
        try:
            letters = read_dead_letters(self.settings)
        except DlqError as exc:
            letters = []
            problems.append(f"the dead-letter topic could not be read: {exc}")
        with connect_durable(self.settings.pg_dsn) as conn:
            verdict = check_hostile(conn, hostile, letters, self.run_ids, len(self.fleet.exits))
        return check(
            self.settings.pg_dsn,
            dead_letters=letters,
            copies=plan.copies,
            seed=plan.seed,
            prefix=self.prefix,
            run_ids=self.run_ids,
            wf=wf,
            fleet=self.fleet,
            windows=self.windows,
            session_timeout_s=group_session_timeout_s(self.settings),
            stop_codes=codes,
            elapsed_s=self._t(),
            ended_at=ended_at,
            problems=problems,
            lost_starts=len(feeder.lost),
            hostile=verdict,
        )

    def _wait_until(self, at_s: float, feeder: Feeder) -> None:
        while (left := at_s - self._t()) > 0:
            if self._t() >= self._next_progress:
                self.out(
                    f"{self._t():6.1f} s  runs started {feeder.started}/{len(self.run_ids)},"
                    f" kills {sum(self.fleet.kills.values())}, restarts {self.fleet.restarts}"
                )
                self._next_progress = self._t() + _PROGRESS_EVERY_S
            time.sleep(min(left, 0.5))  # the schedule's own pace: faults come at set times

    def _inflict(self, fault: Fault) -> float:
        """Carry the fault out; returns how long it took."""
        if fault.kind in (PROCESSOR, WORKER):
            self.fleet.sigkill(fault.kind)
            return 0.0
        if fault.kind == LOCK:
            return self._hold_a_row()
        with self.fleet.outage() as starting:
            if starting:
                self.out(f"{self._t():6.1f} s  still starting before the outage: {starting}")
            start = time.time()
            if fault.kind == BROKER:
                self.out(f"{self._t():6.1f} s  broker: SIGKILL, down {self.plan.broker_down_s} s")
                self.infra.kill_kafka()
                time.sleep(self.plan.broker_down_s)  # the outage's chosen length
                self.infra.start_kafka()
            elif fault.kind == POSTGRES:
                self.out(f"{self._t():6.1f} s  postgres: immediate restart")
                self.infra.restart_postgres()  # immediate: recovery from WAL
            else:
                self.out(f"{self._t():6.1f} s  postgres: frozen for {self.plan.freeze_s} s")
                self.proxy.freeze()
                time.sleep(self.plan.freeze_s)  # the outage's chosen length
                self.proxy.restore()
        end = time.time()
        self.windows.append(Window(fault.kind, "", start, end))
        self.out(f"{self._t():6.1f} s  {fault.kind} over after {end - start:.1f} s")
        return end - start

    def _hold_a_row(self) -> float:
        """An operator's transaction on one live run (`SELECT ... FOR UPDATE`, left open for
        ``lock_s``), straight to Postgres: that run waits, the others go on."""
        with psycopg.connect(self.settings.pg_dsn) as conn:  # a transaction, not autocommit
            row = conn.execute(
                "SELECT run_id FROM eec_workflow_run WHERE run_id LIKE %s"
                " AND status IN ('pending', 'running') ORDER BY random() LIMIT 1 FOR UPDATE",
                (like_prefix(self.prefix),),
            ).fetchone()
            held = "" if row is None else str(row[0])
            start = time.time()
            self.out(f"{self._t():6.1f} s  outside lock: run {held or '(none live)'} held")
            time.sleep(self.plan.lock_s)  # the lock's chosen length
            conn.rollback()
        end = time.time()
        self.windows.append(Window(LOCK, held, start, end))
        self.out(f"{self._t():6.1f} s  outside lock released after {end - start:.1f} s")
        return end - start

    def _wait_for_the_end(self, feeder: Feeder) -> float | None:
        """Wall clock when every run had ended, or None if they did not within the bound."""
        last_fault = max((w.end for w in self.windows), default=time.time())
        deadline = last_fault + self.plan.finish_timeout_s
        next_progress = 0.0
        mapped = [self.map_id] if self.plan.hostile.map_items else []
        with connect_durable(self.settings.pg_dsn) as conn:
            while True:
                ended = count_ended(conn, self.run_ids)
                now = time.time()
                everything = ended == len(self.run_ids) and feeder.started == len(self.run_ids)
                if everything and count_ended(conn, mapped) == len(mapped):
                    return now
                if now > deadline:
                    return None
                if self._t() >= next_progress:
                    self.out(f"{self._t():6.1f} s  runs ended {ended}/{len(self.run_ids)}")
                    next_progress = self._t() + _PROGRESS_EVERY_S
                time.sleep(0.2)  # polling the database for the end; bounded by the deadline


def group_session_timeout_s(settings: Settings) -> float:
    """The broker's session timeout of consumer-protocol groups: how long a killed member
    keeps its partitions."""
    admin = AdminClient(with_logger(admin_config(settings, "ductor-chaos")))
    broker = next(iter(admin.list_topics(timeout=10).brokers))
    resource = ConfigResource(ConfigResource.Type.BROKER, str(broker))
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    return int(configs["group.consumer.session.timeout.ms"].value) / 1000


def chaos_workflow(step_timeout_s: float) -> WorkflowDef:
    """The sample workflow under a name of its own, with every step's timeout set."""
    raw = sample_workflow()
    raw["name"] = "chaos-sample"
    for step in raw["steps"]:
        step["timeout_ms"] = int(step_timeout_s * 1000)
    return parse_workflow(raw)


def run_chaos(
    settings: Settings,
    plan: ChaosPlan,
    infra: LocalInfra,
    log_dir: Path,
    out: Callable[[str], None] = print,
) -> ChaosReport:
    """One chaos run with the settings' topics (created beforehand) and database; the runs'
    ids start with the topic prefix. Returns the report; its ``problems`` say what failed."""
    wf = chaos_workflow(plan.step_timeout_s)
    with connect_durable(settings.pg_dsn) as conn:
        register_workflow(conn, wf)
        register_workflow(conn, map_workflow(plan.step_timeout_s))
        audit.install(conn)
        chaos_steps.install(conn)
    chaos = _Chaos(settings, plan, infra, log_dir, out)
    out(
        f"chaos: {plan.runs} runs, {len(chaos.faults)} scheduled faults over"
        f" {plan.duration_s:.0f} s (seed {plan.seed}); logs in {log_dir}"
    )
    try:
        return chaos.run(wf)
    finally:
        with connect_durable(settings.pg_dsn) as conn:
            audit.uninstall(conn)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = ChaosPlan()
    p = argparse.ArgumentParser(
        prog="python -m processor.tools.chaos",
        description="The coordinator under crashes and outages (see the module's docstring).",
    )
    p.add_argument("--runs", type=int, default=d.runs, help="runs of the sample workflow")
    p.add_argument(
        "--duration", type=float, default=d.duration_s, help="seconds over which faults come"
    )
    p.add_argument("--kills", type=int, default=d.kills, help="SIGKILLs of processors/workers")
    p.add_argument(
        "--worker-share", type=float, default=d.worker_share, help="share of kills of a worker"
    )
    p.add_argument(
        "--armed",
        type=int,
        default=d.arming.budget,
        help="most processor starts armed to kill themselves right after a commit",
    )
    p.add_argument("--broker-restarts", type=int, default=d.broker_restarts)
    p.add_argument("--broker-down", type=float, default=d.broker_down_s, help="seconds")
    p.add_argument("--postgres-restarts", type=int, default=d.postgres_restarts)
    p.add_argument("--freeze", type=float, default=d.freeze_s, help="seconds (0: none)")
    p.add_argument(
        "--lock", type=float, default=d.lock_s, help="seconds a run's row is held (0: none)"
    )
    p.add_argument(
        "--lost-starts", type=int, default=d.lost_starts, help="runs started without a wakeup"
    )
    p.add_argument("--processors", type=int, default=d.processors)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument(
        "--step-timeout", type=float, default=d.step_timeout_s, help="every step's deadline, s"
    )
    p.add_argument(
        "--hostile",
        type=int,
        default=d.hostile.records,
        help="hostile records to the requests topic",
    )
    p.add_argument(
        "--map-items", type=int, default=d.hostile.map_items, help="items of the map run (0: none)"
    )
    p.add_argument(
        "--backlog-runs",
        type=int,
        default=chaos_backlog.BacklogPlan().runs,
        help="runs of the backlog phase, workers killed under 1 s steps (0: no such phase)",
    )
    p.add_argument("--seed", type=int, help="random seed (default: drawn and printed)")
    p.add_argument("--keep", action="store_true", help="keep the runs and topics afterwards")
    p.add_argument(
        "--cluster",
        action="store_true",
        help="on a local three-broker cluster started for the run; the broker outages stop"
        " the node leading most of the run's partitions",
    )
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        from processor.tools import local_infra  # noqa: PLC0415 (needs the checkout)
    except ModuleNotFoundError as exc:
        if exc.name != "infra":
            raise
        print(f"chaos: the chaos run restarts the services, and {NEEDS_CHECKOUT}", file=sys.stderr)
        return 2
    try:
        base = load_settings()
        infra = local_infra.local_services(base)
    except (ConfigError, local_infra.NotLocalServices) as exc:
        print(f"chaos: {exc}", file=sys.stderr)
        return 2
    if not args.cluster:
        return _chaos(args, base, infra)
    with local_infra.three_brokers() as cluster:
        on_cluster = replace(base, bootstrap_servers=cluster.endpoint)

        def leader_of_most(settings: Settings) -> LocalInfra:
            # The broker outages stop the node that leads most of the run's partitions.
            return infra.with_broker(cluster.node(busiest_broker(settings)))

        return _chaos(args, on_cluster, infra, leader_of_most)


def _chaos(
    args: argparse.Namespace,
    base: Settings,
    infra: LocalInfra,
    broker_for: Callable[[Settings], LocalInfra] | None = None,
) -> int:
    plan = ChaosPlan(
        runs=args.runs,
        duration_s=args.duration,
        kills=args.kills,
        worker_share=args.worker_share,
        arming=replace(ChaosPlan().arming, budget=args.armed),
        broker_restarts=args.broker_restarts,
        broker_down_s=args.broker_down,
        postgres_restarts=args.postgres_restarts,
        freeze_s=args.freeze,
        lock_s=args.lock,
        lost_starts=args.lost_starts,
        processors=args.processors,
        workers=args.workers,
        step_timeout_s=args.step_timeout,
        seed=args.seed if args.seed is not None else random.randrange(1_000_000),
        hostile=replace(ChaosPlan().hostile, records=args.hostile, map_items=args.map_items),
    )
    tag = uuid.uuid4().hex[:6]
    settings = replace(base, topic_prefix=f"chaos-{tag}", group_id=f"chaos-{tag}")
    log_dir = infra.kafka.settings.infra_dir / "chaos" / tag
    migrate(settings.pg_dsn)
    create_topics(settings)
    if broker_for is not None:
        infra = broker_for(settings)
    try:
        report = run_chaos(settings, plan, infra, log_dir)
        after = chaos_backlog.phase(settings, args.backlog_runs, plan.seed, log_dir)
    finally:
        if not args.keep:
            delete_topics(settings)
    print()
    print("\n".join(report.lines() + [line for phase in after for line in phase.lines()]))
    ok = report.ok and all(phase.ok for phase in after)
    if ok and not args.keep:
        with connect_durable(settings.pg_dsn) as conn:
            for prefix in (f"{settings.topic_prefix}-", map_run_id(settings.topic_prefix)):
                delete_runs_with_prefix(conn, prefix)
                audit.clear(conn, prefix)
    else:
        print(f"runs kept: ids start with {settings.topic_prefix}-; logs in {log_dir}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
