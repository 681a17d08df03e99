"""How long a dead worker's queued tasks wait: from a worker's SIGKILL to the first execution
of its tasks elsewhere, on the real services (`python -m processor.tools.failover`).

One processor and two workers of one queue (`ductor` subprocesses, topics and group of their
own). Worker A has one slot and holds each step (``FAILOVER_HOLD_S``), so the tasks of its
partitions queue behind it; worker B runs its own at once and goes idle. Then A is killed
with SIGKILL (and, with ``--restart``, started again at once, as a supervisor would, without
the hold). Every execution is written before the step does anything (failover_steps.py), with
Postgres's time: the figure is the first execution after the kill (Postgres's time of the kill
too), the last, and whether every run succeeded. With ``--named`` the workers have names
(``DUCTOR_WORKER_NAME``: static group membership), and the survivor's assignments after the
kill are counted (a restarted named worker takes its partitions back without moving B's).

What sets the figure: docs/operations/workers.md#membership-and-failover.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from processor.client import start_runs
from processor.core.routing import TIERS
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings, child_env, load_settings
from processor.io.kafka.topics import create_topics, delete_topics
from processor.io.postgres import run_counts
from processor.io.postgres.workflows import register_workflow
from processor.tools.chaos_steps import execution_log_env
from processor.tools.child import DuctorChild
from processor.tools.failover_steps import HOLD_VARIABLE, LOG, STEP_TYPE
from processor.tools.waiting import eventually, polls

APP = "processor.tools.failover_steps:registry"
WORKFLOW: dict[str, Any] = {
    "name": "failover_probe",
    "version": 1,
    "description": "one step, for the failover measurement (processor/tools/failover.py)",
    "steps": [
        {"name": "work", "type": STEP_TYPE, "timeout_ms": 120_000, "retry": {"max_attempts": 3}}
    ],
}
# How long worker A holds each step: past the whole measurement.
_HOLD_S = 300
# B is idle once no execution came for this long (and A holds its one).
_QUIET_S = 1.5
_WAIT_S = 120.0


@dataclass(frozen=True)
class Failover:
    group: str  # the workers' group
    protocol: str
    session_timeout_ms: int
    named: bool
    restart: bool
    runs: int
    queued: int  # tasks the killed worker had not started (its one running step aside)
    first_s: float  # from the kill to the first execution of one of its tasks elsewhere
    last_s: float  # ... to the last
    succeeded: int
    failed: int
    survivor_assignments: int  # times the surviving worker was given partitions after the kill
    restarted_assigned: bool  # the restarted worker holds partitions again

    def lines(self) -> list[str]:
        membership = "named (static)" if self.named else "dynamic"
        how = "killed and started again at once" if self.restart else "killed"
        session = f"{self.session_timeout_ms} ms" if self.session_timeout_ms else "the broker's"
        return [
            f"group protocol {self.protocol}, membership {membership}, worker session timeout"
            f" {session}; worker A {how} with {self.queued} task(s) queued",
            f"from the SIGKILL to the first execution of its tasks elsewhere: {self.first_s:.2f} s",
            f"... to the last: {self.last_s:.2f} s",
            f"runs: {self.succeeded} succeeded, {self.failed} failed of {self.runs}",
            f"the surviving worker was given partitions {self.survivor_assignments} time(s)"
            " after the kill",
        ]


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    if not eventually(predicate, timeout_s):
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def workflow() -> WorkflowDef:
    return parse_workflow(WORKFLOW)


def measure(
    settings: Settings,
    log_dir: Path,
    runs: int = 60,
    partitions: int = 6,
    named: bool = False,
    restart: bool = False,
) -> Failover:
    """Kill a worker with queued tasks once, and measure (see the module's docstring). The
    settings give the services, the group protocol and the workers' session timeout; the
    topics and the group are the measurement's own (deleted after)."""
    tag = uuid.uuid4().hex[:8]
    s = replace(
        settings,
        topic_prefix=f"failover-{tag}",
        group_id=f"failover-{tag}",
        step_partitions=partitions,
        log_format="json",
    )
    create_topics(s)
    children: list[DuctorChild] = []
    try:
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            register_workflow(conn, workflow())
            LOG.install(conn)
            return _measure(s, conn, log_dir, tag, runs, named, restart, children)
    finally:
        for child in children:
            child.stop()
        delete_topics(s)


class _Members:
    """The measurement's `ductor` children, each logging to a file of its own; those
    ``watched`` must keep running (a check raises once one has exited)."""

    def __init__(
        self, s: Settings, log_dir: Path, tag: str, named: bool, children: list[DuctorChild]
    ) -> None:
        self._env = child_env(s) | execution_log_env(s)
        self._log_dir, self._tag, self._named = log_dir, tag, named
        self._children = children
        self.watched: list[DuctorChild] = []

    def start(self, args: list[str], name: str, extra: dict[str, str] | None = None) -> DuctorChild:
        child = DuctorChild(
            args, self._env | (extra or {}), self._log_dir / f"{self._tag}-{name}.log"
        )
        self._children.append(child)
        self.watched.append(child)
        return child

    def worker(self, concurrency: str, name: str, letter: str, hold: bool) -> DuctorChild:
        given = {"DUCTOR_WORKER_NAME": f"failover-{self._tag}-{letter}"} if self._named else {}
        extra = given | ({HOLD_VARIABLE: str(_HOLD_S)} if hold else {})
        return self.start(["worker", "--app", APP, "--concurrency", concurrency], name, extra)

    def alive(self) -> bool:
        return all(child.running() for child in self.watched)


def _start_members(members: _Members, s: Settings) -> tuple[DuctorChild, DuctorChild]:
    """A processor and two workers, A (one slot, its steps held) and B, once both hold
    partitions of the queue."""
    members.start(["process"], "processor")
    a = members.worker("1", "worker-a", "a", hold=True)
    b = members.worker("4", "worker-b", "b", hold=False)
    every = 3 * s.step_partitions  # a queue's topics: one per tier
    _wait(
        lambda: (
            members.alive()
            and a.owned_partitions() > 0
            and b.owned_partitions() > 0
            and a.owned_partitions() + b.owned_partitions() == every
        ),
        60,
        "both workers to hold partitions",
    )
    return a, b


def _measure(
    s: Settings,
    conn: psycopg.Connection[Any],
    log_dir: Path,
    tag: str,
    runs: int,
    named: bool,
    restart: bool,
    children: list[DuctorChild],
) -> Failover:
    members = _Members(s, log_dir, tag, named, children)
    a, b = _start_members(members, s)
    prefix = f"failover-{tag}-"
    ids = _start_on_every_tier(s, [f"{prefix}{i}" for i in range(runs)])
    executed = _quiet(conn, prefix, a, members.alive)
    if executed >= runs:
        raise RuntimeError("the worker to kill had no task queued: start more runs")
    members.watched.remove(a)
    a.proc.send_signal(signal.SIGKILL)
    killed_at = _now(conn)
    assigned_before = b.assignments()
    a2 = members.worker("1", "worker-a-again", "a", hold=False) if restart else None
    _wait(
        lambda: members.alive() and run_counts.count_ended(conn, ids) == runs,
        _WAIT_S,
        "every run to end",
    )
    # The runs may all end on the survivor before the restarted worker's name is free again
    # (its old session's timeout) and it joins: it is given the time to.
    if a2 is not None:
        eventually(lambda: a2.owned_partitions() > 0 or not members.alive(), _WAIT_S)
    first_s, last_s = _moved(conn, prefix, killed_at, a.proc.pid)
    statuses = run_counts.statuses(conn, ids)
    return Failover(
        group=s.worker_group_id,
        protocol=s.group_protocol,
        session_timeout_ms=s.worker_session_timeout_ms,
        named=named,
        restart=restart,
        runs=runs,
        queued=runs - executed,
        first_s=first_s,
        last_s=last_s,
        succeeded=sum(1 for v in statuses.values() if v == "succeeded"),
        failed=sum(1 for v in statuses.values() if v != "succeeded"),
        survivor_assignments=b.assignments() - assigned_before,
        restarted_assigned=a2 is not None and a2.owned_partitions() > 0,
    )


def _moved(
    conn: psycopg.Connection[Any], prefix: str, killed_at: datetime, killed_pid: int
) -> tuple[float, float]:
    """Seconds from the kill to the first and to the last execution elsewhere."""
    row = conn.execute(
        f"SELECT min(started_at), max(started_at) FROM {LOG.table}"
        " WHERE starts_with(run_id, %s) AND started_at > %s AND pid <> %s",
        (prefix, killed_at, killed_pid),
    ).fetchone()
    assert row is not None and row[0] is not None
    first, last = row
    return (first - killed_at).total_seconds(), (last - killed_at).total_seconds()


def _start_on_every_tier(s: Settings, ids: list[str]) -> list[str]:
    """The runs started, spread over the tiers: a tier's steps topic is one of the queue's
    three, and an assignor that balances the partitions of all three together
    (cooperative-sticky) may give one worker a whole topic."""
    for i, tier in enumerate(TIERS):
        start_runs(s, workflow().name, ids[i :: len(TIERS)], tier=tier)
    return ids


def _executed(conn: psycopg.Connection[Any], prefix: str) -> int:
    row = conn.execute(
        f"SELECT count(DISTINCT run_id) FROM {LOG.table} WHERE starts_with(run_id, %s)",
        (prefix,),
    ).fetchone()
    return int(row[0]) if row else 0


def _quiet(
    conn: psycopg.Connection[Any], prefix: str, a: DuctorChild, alive: Callable[[], bool]
) -> int:
    """Wait until worker A runs its one step and B has run every task of its own (no
    execution for ``_QUIET_S``); the runs executed by then."""
    seen, since = -1, 0.0
    for now in polls(_WAIT_S, 0.1):
        alive()
        count = _executed(conn, prefix)
        if count != seen:
            seen, since = count, now
        elif count > 0 and now - since >= _QUIET_S and _by(conn, prefix, a) > 0:
            return count
    raise TimeoutError("the workers did not settle: B still runs tasks, or A runs none")


def _by(conn: psycopg.Connection[Any], prefix: str, child: DuctorChild) -> int:
    row = conn.execute(
        f"SELECT count(*) FROM {LOG.table} WHERE starts_with(run_id, %s) AND pid = %s",
        (prefix, child.proc.pid),
    ).fetchone()
    return int(row[0]) if row else 0


def _now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m processor.tools.failover",
        description="measure how long a killed worker's queued tasks wait for another worker",
    )
    parser.add_argument("--runs", type=int, default=60)
    parser.add_argument("--partitions", type=int, default=6, help="per steps topic (6)")
    parser.add_argument("--named", action="store_true", help="workers with DUCTOR_WORKER_NAME")
    parser.add_argument(
        "--restart", action="store_true", help="start the killed worker again at once"
    )
    parser.add_argument("--times", type=int, default=1, help="measure this many times")
    args = parser.parse_args(argv)
    settings = load_settings()
    log_dir = Path(os.environ.get("TMPDIR") or tempfile.gettempdir()) / "ductor-failover"
    log_dir.mkdir(parents=True, exist_ok=True)
    for _ in range(args.times):
        figures = measure(settings, log_dir, args.runs, args.partitions, args.named, args.restart)
        print("\n".join(figures.lines()), flush=True)
    print(f"(logs in {log_dir})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
