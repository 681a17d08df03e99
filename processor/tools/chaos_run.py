"""One chaos run (processor/tools/chaos.py says what it does and checks): the fleet, the load,
the proxy and the faults, then the checks of what happened."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.kafka.configs import admin_config
from processor.io.kafka.dlq import read_dead_letters
from processor.io.kafka.errors import DlqError
from processor.io.kafka.logs import with_logger
from processor.io.postgres.connections import connect_durable
from processor.io.postgres.run_counts import count_ended, like_prefix
from processor.io.postgres.workflows import register_workflow
from processor.io.shipped.files import sample_workflow
from processor.tools import audit, chaos_steps
from processor.tools.chaos_checks import check
from processor.tools.chaos_fleet import PROCESSOR, WORKER, ChaosFleet
from processor.tools.chaos_hostile import HostileProducer, map_run_id, map_workflow, scoped
from processor.tools.chaos_hostile_check import check_hostile
from processor.tools.chaos_load import Feeder
from processor.tools.chaos_plan import ChaosPlan, PlannedFault, expected_s, schedule
from processor.tools.chaos_report import BROKER, LOCK, POSTGRES, ChaosReport, FaultWindow
from processor.tools.proxy import TcpProxy
from processor.tools.waiting import polls

if TYPE_CHECKING:
    # Imported by chaos.main() only: local_infra is built on the checkout's infra/local.py.
    from processor.tools.local_infra import LocalInfra


_PROGRESS_EVERY_S = 10.0


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
        self.windows: list[FaultWindow] = []
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
        self.fleet = ChaosFleet(
            children, log_dir, plan.processors, plan.workers, rng, plan.arming, self._fault
        )
        self.began = time.monotonic()
        self._next_progress = 0.0

    def _fault(self, kind: str, name: str) -> None:
        now = time.time()
        self.windows.append(FaultWindow(kind, name, now, now))
        self.out(f"{self._t():6.1f} s  {kind}: {name}")

    def _t(self) -> float:
        return time.monotonic() - self.began

    def run(self, wf: WorkflowDef) -> ChaosReport:
        feeder, hostile = self._load(wf)
        self.began = time.monotonic()
        self.fleet.start()
        feeder.start()
        hostile.start()
        problems: list[str] = []
        try:
            ended_at = self._drive(feeder, hostile, problems)
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
            copies=self.plan.copies,
            seed=self.plan.seed,
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

    def _load(self, wf: WorkflowDef) -> tuple[Feeder, HostileProducer]:
        """The run's starts, and the hostile producer's records beside them."""
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
        return feeder, hostile

    def _drive(self, feeder: Feeder, hostile: HostileProducer, problems: list[str]) -> float | None:
        """The faults at their times, then every record written and every run ended: the
        wall clock when they had (None: not within the bound)."""
        plan = self.plan
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
        return self._wait_for_the_end(feeder)

    def _wait_until(self, at_s: float, feeder: Feeder) -> None:
        while (left := at_s - self._t()) > 0:
            if self._t() >= self._next_progress:
                self.out(
                    f"{self._t():6.1f} s  runs started {feeder.started}/{len(self.run_ids)},"
                    f" kills {sum(self.fleet.kills.values())}, restarts {self.fleet.restarts}"
                )
                self._next_progress = self._t() + _PROGRESS_EVERY_S
            time.sleep(min(left, 0.5))  # the schedule's own pace: faults come at set times

    def _inflict(self, fault: PlannedFault) -> float:
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
        self.windows.append(FaultWindow(fault.kind, "", start, end))
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
        self.windows.append(FaultWindow(LOCK, held, start, end))
        self.out(f"{self._t():6.1f} s  outside lock released after {end - start:.1f} s")
        return end - start

    def _wait_for_the_end(self, feeder: Feeder) -> float | None:
        """Wall clock when every run had ended, or None if they did not within the bound."""
        last_fault = max((w.end for w in self.windows), default=time.time())
        next_progress = 0.0
        mapped = [self.map_id] if self.plan.hostile.map_items else []
        with connect_durable(self.settings.pg_dsn) as conn:
            # Polling the database for the end; bounded by the deadline after the last fault.
            for _ in polls(last_fault + self.plan.finish_timeout_s - time.time(), 0.2):
                ended = count_ended(conn, self.run_ids)
                now = time.time()
                everything = ended == len(self.run_ids) and feeder.started == len(self.run_ids)
                if everything and count_ended(conn, mapped) == len(mapped):
                    return now
                if self._t() >= next_progress:
                    self.out(f"{self._t():6.1f} s  runs ended {ended}/{len(self.run_ids)}")
                    next_progress = self._t() + _PROGRESS_EVERY_S
        return None


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
