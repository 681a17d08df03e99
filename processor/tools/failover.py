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
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
import psycopg

from processor.client import start_runs
from processor.core.routing import TIERS
from processor.core.workflow import WorkflowDef, parse_workflow
from processor.io.config.settings import Settings, child_env, load_settings
from processor.io.kafka.topics import create_topics, delete_topics
from processor.io.postgres import run_counts
from processor.io.postgres.workflows import register_workflow
from processor.tools.chaos_steps import execution_log_env
from processor.tools.failover_steps import HOLD_VARIABLE, LOG, STEP_TYPE

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


class _Child:
    """A `ductor` subprocess logging JSON lines to a file of its own."""

    def __init__(self, args: list[str], env: dict[str, str], log_path: Path) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "processor", *args],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def lines(self) -> list[dict[str, Any]]:
        found = []
        for raw in self.log_path.read_bytes().splitlines():
            try:
                found.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                continue
        return found

    def owned(self) -> int:
        owned = 0
        for line in self.lines():
            if line.get("msg") == "partitions assigned":
                owned += int(line["count"])
            elif line.get("msg") == "partitions released":
                owned -= int(line["count"])
        return owned

    def assignments(self) -> int:
        return sum(1 for line in self.lines() if line.get("msg") == "partitions assigned")

    def check(self) -> None:
        code = self.proc.poll()
        if code is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-10:]
            raise RuntimeError(f"{self.log_path.stem} exited with {code}:\n" + "\n".join(tail))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._log.close()


def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        pause.wait(0.05)


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
    children: list[_Child] = []
    try:
        with psycopg.connect(s.pg_dsn, autocommit=True) as conn:
            register_workflow(conn, workflow())
            LOG.install(conn)
            return _measure(s, conn, log_dir, tag, runs, named, restart, children)
    finally:
        for child in children:
            child.stop()
        delete_topics(s)


def _measure(
    s: Settings,
    conn: psycopg.Connection[Any],
    log_dir: Path,
    tag: str,
    runs: int,
    named: bool,
    restart: bool,
    children: list[_Child],
) -> Failover:
    env = child_env(s) | execution_log_env(s)

    def start(args: list[str], name: str, extra: dict[str, str] | None = None) -> _Child:
        child = _Child(args, env | (extra or {}), log_dir / f"{tag}-{name}.log")
        children.append(child)
        return child

    def worker_env(name: str, hold: bool) -> dict[str, str]:
        given = {"DUCTOR_WORKER_NAME": f"failover-{tag}-{name}"} if named else {}
        return given | ({HOLD_VARIABLE: str(_HOLD_S)} if hold else {})

    worker = ["worker", "--app", APP, "--concurrency"]
    processor = start(["process"], "processor")
    a = start([*worker, "1"], "worker-a", worker_env("a", hold=True))
    b = start([*worker, "4"], "worker-b", worker_env("b", hold=False))
    every = 3 * s.step_partitions  # a queue's topics: one per tier

    watched = [processor, a, b]

    def alive() -> bool:
        for child in watched:
            child.check()
        return True

    _wait(
        lambda: alive() and a.owned() > 0 and b.owned() > 0 and a.owned() + b.owned() == every,
        60,
        "both workers to hold partitions",
    )
    prefix = f"failover-{tag}-"
    ids = [f"{prefix}{i}" for i in range(runs)]
    # On every tier: a tier's steps topic is one of the queue's three, and an assignor that
    # balances the partitions of all three together (cooperative-sticky) may give one worker
    # a whole topic.
    for i, tier in enumerate(TIERS):
        start_runs(s, workflow().name, ids[i :: len(TIERS)], tier=tier)
    executed = _quiet(conn, prefix, a, alive)
    if executed >= runs:
        raise RuntimeError("the worker to kill had no task queued: start more runs")
    a_pid = a.proc.pid
    watched.remove(a)
    a.proc.send_signal(signal.SIGKILL)
    killed_at = _now(conn)
    assigned_before = b.assignments()
    a2 = None
    if restart:
        a2 = start([*worker, "1"], "worker-a-again", worker_env("a", hold=False))
        watched.append(a2)
    _wait(
        lambda: alive() and run_counts.count_ended(conn, ids) == runs,
        _WAIT_S,
        "every run to end",
    )
    statuses = run_counts.statuses(conn, ids)
    row = conn.execute(
        f"SELECT min(started_at), max(started_at) FROM {LOG.table}"
        " WHERE starts_with(run_id, %s) AND started_at > %s AND pid <> %s",
        (prefix, killed_at, a_pid),
    ).fetchone()
    assert row is not None and row[0] is not None
    first, last = row
    return Failover(
        group=s.worker_group_id,
        protocol=s.group_protocol,
        session_timeout_ms=s.worker_session_timeout_ms,
        named=named,
        restart=restart,
        runs=runs,
        queued=runs - executed,
        first_s=(first - killed_at).total_seconds(),
        last_s=(last - killed_at).total_seconds(),
        succeeded=sum(1 for v in statuses.values() if v == "succeeded"),
        failed=sum(1 for v in statuses.values() if v != "succeeded"),
        survivor_assignments=b.assignments() - assigned_before,
        restarted_assigned=a2 is not None and a2.owned() > 0,
    )


def _executed(conn: psycopg.Connection[Any], prefix: str) -> int:
    row = conn.execute(
        f"SELECT count(DISTINCT run_id) FROM {LOG.table} WHERE starts_with(run_id, %s)",
        (prefix,),
    ).fetchone()
    return int(row[0]) if row else 0


def _quiet(conn: psycopg.Connection[Any], prefix: str, a: _Child, alive: Callable[[], bool]) -> int:
    """Wait until worker A runs its one step and B has run every task of its own (no
    execution for ``_QUIET_S``); the runs executed by then."""
    deadline = time.monotonic() + _WAIT_S
    pause = threading.Event()
    seen, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        alive()
        count = _executed(conn, prefix)
        if count != seen:
            seen, since = count, time.monotonic()
        elif count > 0 and time.monotonic() - since >= _QUIET_S and _by(conn, prefix, a) > 0:
            return count
        pause.wait(0.1)
    raise TimeoutError("the workers did not settle: B still runs tasks, or A runs none")


def _by(conn: psycopg.Connection[Any], prefix: str, child: _Child) -> int:
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
