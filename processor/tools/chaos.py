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
processor/tools/chaos_checks.py), no process exited by itself, no effect was left in the
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
import uuid
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from processor.io.config.settings import Settings, load_settings
from processor.io.config.values import ConfigError
from processor.io.kafka.topics import busiest_broker, create_topics, delete_topics
from processor.io.postgres.connections import connect_durable
from processor.io.postgres.migrate import migrate
from processor.io.postgres.run_counts import delete_runs_with_prefix
from processor.tools import audit, chaos_backlog
from processor.tools.chaos_hostile import map_run_id
from processor.tools.chaos_plan import ChaosPlan
from processor.tools.chaos_run import run_chaos
from processor.tools.checkout import NEEDS_CHECKOUT

if TYPE_CHECKING:
    # Imported by main() only: local_infra is built on the checkout's infra/local.py.
    from processor.tools.local_infra import LocalInfra


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
