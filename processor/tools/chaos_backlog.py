"""`make chaos`, backlog phase: workers SIGKILLed (and started again at once, as a supervisor
would) under a backlog of steps with a short timeout and one attempt.

Every run of a one-step workflow (the sample's ``fast`` step, counted by chaos_steps.py;
``timeout_ms`` 1 s, ``max_attempts`` 1) is started at once, so most wait in their queue far
longer than their timeout while workers are killed over the backlog (``kill_at``) and a killed
one's partitions wait for the group to give them to another. A step's timeout counts from its
start (core/tick.py, rule 4), so no run may fail for its time in a queue. A run may fail only
for an attempt its worker's kill cut short: its attempt started (claimed within its worker's
start permit, which runs about a slot's worth of claims ahead of the steps running:
io/postgres/step_attempts.py) and a kill came before its start plus its timeout; or its worker was
killed and the rerun, in a child process of its own, did not end in time either; or its
worker was killed each time it started it (core/claims.py). The report says how many had not
begun their step yet.

The report's check, per failed run: not a timeout (problem), a timeout of an attempt no
worker started or judged before its start plus its timeout (failed for queue time: problem),
one a kill explains, or one nothing explains (problem). Besides: every run ended, every
succeeded run's step ran, some steps waited longer than their timeout (else the phase tested
nothing), no process exited by itself or failed to stop on SIGTERM.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from processor.client import start_runs
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.connections import connect_durable
from processor.io.postgres.run_counts import count_ended
from processor.io.postgres.step_attempts import UNSTARTED
from processor.io.postgres.workflows import register_workflow
from processor.tools import chaos_steps
from processor.tools.chaos_fleet import WORKER, Arming, ChaosFleet
from processor.tools.waiting import polls

WORKFLOW = "chaos-backlog"
NODE = "only"
# How a failed run is counted (``classify``).
QUEUE = "failed for queue time"
KILLED = "failed: a kill cut its execution short"
UNEXPLAINED = "timed out with no kill to explain it"
OTHER = "failed for another reason"
_PROBLEMS = (QUEUE, UNEXPLAINED, OTHER)
_PROGRESS_EVERY_S = 10.0
_EXAMPLES = 3  # runs named per problem
_START_BATCH = 500  # runs started per call (one statement and one batch of wakeups each)


@dataclass(frozen=True)
class BacklogPlan:
    runs: int = 3000
    timeout_ms: int = 1000
    kills: int = 8  # worker SIGKILLs at most, spread over the backlog (``kill_at``)
    kill_gap_s: float = 1.0  # at least this far apart
    processors: int = 1
    workers: int = 2
    finish_timeout_s: float = 240.0  # for every run to end, from the start of the phase
    seed: int = 0


@dataclass(frozen=True)
class RunFacts:
    """What the database says of one run's only step, wall-clock seconds."""

    run_id: str
    status: str
    reason: str | None
    started: float | None  # its attempt's start (None: no worker started it)
    ended_at: float  # the run's last transition (its end)
    waited: float | None  # from the run's creation to its attempt's start
    # Executions its attempt began (io/postgres/step_attempts.py): more than 1, a worker that
    # started it was killed and another ran it again, and ``started`` is that rerun's start (the row
    # keeps the last start; the coordinator's deadline counted from the first).
    starts: int = 1


def classify(run: RunFacts, timeout_ms: int, kills: Sequence[float]) -> str | None:
    """How a run ended, as the report counts it: None for succeeded, else one of QUEUE,
    KILLED, UNEXPLAINED or OTHER."""
    if run.status == "succeeded":
        return None
    if run.status == "failed" and _DIED in (run.reason or ""):
        return KILLED  # its worker was killed each time it started (core/claims.py)
    if run.status != "failed" or "attempt 1 timed out after" not in (run.reason or ""):
        return OTHER
    if run.started is None:
        return QUEUE  # timed out without a start: its queue time counted
    if run.starts > 1 and any(k <= run.ended_at + _CLOCK_SLACK_S for k in kills):
        # Started by a worker a kill took, then run again (in a child process of its own,
        # whose start counts towards the timeout): its first start, which its deadline
        # counted from, is not kept, but a kill cut that execution short.
        return KILLED
    close = run.started + timeout_ms / 1000
    if run.ended_at < close - _CLOCK_SLACK_S:
        return QUEUE  # judged before its start plus its timeout: counted from before
    if any(run.started - _CLOCK_SLACK_S <= k <= close + _CLOCK_SLACK_S for k in kills):
        return KILLED
    return UNEXPLAINED


# The failure of an attempt whose worker died every time it started it (core/claims.py).
_DIED = "the worker running this step died"

# The workers' and Postgres's clocks are this machine's; a few ms of rounding apart at most.
_CLOCK_SLACK_S = 0.05


@dataclass
class BacklogReport:
    plan: BacklogPlan
    elapsed_s: float
    kinds: Counter[str]  # failed runs by kind (classify); "succeeded" for the others
    waited_longer: int  # attempts started more than their timeout after their run's start
    longest_wait_s: float
    kills: int
    # Of the runs a kill failed, those whose step had not begun: claims the killed worker held
    # within its start permit (a slot's worth ahead of what runs: io/postgres/step_attempts.py),
    # which count as started, waiting for a slot of that worker.
    killed_unrun: int
    restarts: int
    rerun: int  # attempts whose step ran more than once (a kill mid-execution)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        p = self.plan
        failed = ", ".join(f"{n} {k}" for k, n in self.kinds.most_common() if k != "succeeded")
        rows = [
            (
                "runs",
                f"{p.runs} of one step (timeout_ms {p.timeout_ms}, one attempt), started at"
                f" once; {self.kinds['succeeded']} succeeded",
            ),
            (
                "processes",
                f"{p.processors} processors, {p.workers} workers; {self.kills} worker"
                f" SIGKILLs, {self.restarts} restarts",
            ),
            (
                "queue",
                f"{self.waited_longer} steps waited longer than their timeout before their"
                f" start (longest {self.longest_wait_s:.1f} s)",
            ),
            (
                "failed",
                (failed or "none")
                + (
                    f" ({self.killed_unrun} of them claimed, their step not begun yet)"
                    if self.kinds[KILLED]
                    else ""
                ),
            ),
            ("queue time", f"{self.kinds[QUEUE]} runs failed for their time in a queue"),
            ("reruns", f"{self.rerun} attempts ran again after their worker's kill"),
            ("duration", f"{self.elapsed_s:.0f} s"),
        ]
        out = ["Ductor chaos run, backlog phase (workers killed under a backlog of 1 s steps)"]
        out += [f"  {label:16} {value}" for label, value in rows]
        if self.problems:
            out.append(f"FAILED: {len(self.problems)} problem(s)")
            out += [f"  - {problem}" for problem in self.problems]
        else:
            out.append("PASSED: no run failed for its time in a queue")
        return out


def backlog_workflow(timeout_ms: int) -> WorkflowDef:
    return parse_workflow(
        {
            "name": WORKFLOW,
            "version": 1,
            "steps": [
                {
                    "name": NODE,
                    "type": "fast",
                    "timeout_ms": timeout_ms,
                    "retry": {"max_attempts": 1, "backoff_ms": 50},
                }
            ],
        }
    )


def phase(settings: Settings, runs: int, seed: int, log_dir: Path) -> list[BacklogReport]:
    """The phase as `make chaos` runs it after its main run, on its topics (none if ``runs``
    is 0); its runs' ids start with the topic prefix too, so they are deleted with the
    others."""
    if not runs:
        return []
    plan = BacklogPlan(runs=runs, seed=seed)
    prefix = f"{settings.topic_prefix}-backlog-"
    return [run_backlog(settings, plan, log_dir / "backlog", prefix)]


def run_backlog(
    settings: Settings,
    plan: BacklogPlan,
    log_dir: Path,
    prefix: str,
    out: Callable[[str], None] = print,
) -> BacklogReport:
    """The phase with the settings' topics (created beforehand) and database; its runs' ids
    start with ``prefix``."""
    wf = backlog_workflow(plan.timeout_ms)
    with connect_durable(settings.pg_dsn) as conn:
        register_workflow(conn, wf)
        chaos_steps.install(conn)
    run_ids = [f"{prefix}{i}" for i in range(plan.runs)]
    kills: list[float] = []
    rng = random.Random(plan.seed)
    children = replace(settings, stats_log_interval_s=1.0, shutdown_timeout_s=10.0)

    def killed(kind: str, name: str) -> None:
        kills.append(time.time())
        out(f"{time.monotonic() - began:6.1f} s  {kind}: {name}")

    fleet = ChaosFleet(
        children, log_dir, plan.processors, plan.workers, rng, Arming(budget=0), killed
    )
    out(f"chaos backlog: {plan.runs} runs, {plan.kills} worker kills; logs in {log_dir}")
    began = time.monotonic()
    fleet.start()
    problems: list[str] = []
    try:
        for i in range(0, len(run_ids), _START_BATCH):
            start_runs(settings, WORKFLOW, run_ids[i : i + _START_BATCH], {})
        if not _kill_and_wait(fleet, plan, run_ids, prefix, settings.pg_dsn, began, out):
            problems.append(
                f"not every run ended within {plan.finish_timeout_s:.0f} s of the phase's start"
            )
    finally:
        codes = fleet.stop()
    elapsed = time.monotonic() - began
    with connect_durable(settings.pg_dsn) as conn:
        facts = run_facts(conn, prefix)
        executions = chaos_steps.executions(conn, prefix)
    report = check(plan, facts, kills, executions, len(run_ids), elapsed, problems)
    report.restarts = fleet.restarts
    for exit_ in fleet.exits:
        problems.append(f"{exit_.name} exited by itself with {exit_.code}:\n{exit_.log_tail}")
    problems += [f"{n} did not stop cleanly on SIGTERM: exit {c}" for n, c in codes.items() if c]
    return report


def _kill_and_wait(
    fleet: ChaosFleet,
    plan: BacklogPlan,
    run_ids: list[str],
    prefix: str,
    dsn: str,
    began: float,
    out: Callable[[str], None],
) -> bool:
    """Workers SIGKILLed as ``kill_at`` says, until every run ended; False if they did not
    within the bound."""
    done = 0
    next_kill = 0.0
    next_progress = 0.0
    with connect_durable(dsn) as conn:
        # Polling the database for the end; bounded by the phase's deadline.
        for now in polls(began + plan.finish_timeout_s - time.monotonic(), 0.2):
            if (ended := count_ended(conn, run_ids)) >= len(run_ids):
                return True
            due = done < plan.kills and now >= next_kill
            if due and kill_at(done, plan) <= claimed(conn, prefix) < plan.runs:
                fleet.sigkill(WORKER)
                done += 1
                next_kill = now + plan.kill_gap_s
            if now >= next_progress:
                out(f"{now - began:6.1f} s  runs ended {ended}/{len(run_ids)}")
                next_progress = now + _PROGRESS_EVERY_S
    return False


def kill_at(done: int, plan: BacklogPlan) -> int:
    """How many steps workers must have claimed before the kill after ``done`` kills: the
    first once they claim, the others evenly over the backlog, so that kills come while
    steps wait, however fast this machine works through them (the runs' ends lag behind: a
    processor ends them in large batches). None comes once every step was claimed: on a
    quick machine fewer than ``kills`` come, and the report says how many."""
    return max(1, done * plan.runs // plan.kills)


def claimed(conn: psycopg.Connection[Any], prefix: str) -> int:
    """How many of the phase's step attempts workers claimed."""
    row = conn.execute(
        "SELECT count(*) FROM eec_step_attempt WHERE starts_with(run_id, %s)", (prefix,)
    ).fetchone()
    return int(row[0]) if row else 0


def run_facts(conn: psycopg.Connection[Any], prefix: str) -> list[RunFacts]:
    """Each run of the phase with its only step's attempt as the workers recorded it (a
    claim beyond its worker's start permit is no start)."""
    rows = conn.execute(
        f"""
        SELECT r.run_id, r.status, r.failure_reason,
               CASE WHEN a.run_id IS NULL OR {UNSTARTED.format(a="a")} THEN NULL
                    ELSE a.started_at END,
               r.last_transition_at, r.created_at, coalesce(a.starts, 0)
          FROM eec_workflow_run r
          LEFT JOIN eec_step_attempt a
            ON a.run_id = r.run_id AND a.node_id = %s AND a.attempt = 1
         WHERE starts_with(r.run_id, %s)
        """,
        (NODE, prefix),
    ).fetchall()
    return [_facts(*row) for row in rows]


def _facts(
    run_id: str,
    status: str,
    reason: str | None,
    started: datetime | None,
    ended_at: datetime,
    created: datetime,
    starts: int,
) -> RunFacts:
    start = None if started is None else started.timestamp()
    waited = None if start is None else start - created.timestamp()
    return RunFacts(run_id, status, reason, start, ended_at.timestamp(), waited, starts)


def check(
    plan: BacklogPlan,
    facts: Sequence[RunFacts],
    kills: Sequence[float],
    executions: Counter[tuple[str, str, int]],
    expected: int,
    elapsed_s: float,
    problems: list[str],
) -> BacklogReport:
    """The phase's checks and figures; failed checks are added to ``problems``."""
    kinds: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    unrun = 0
    for run in facts:
        kind = classify(run, plan.timeout_ms, kills)
        kinds[kind or "succeeded"] += 1
        if kind in _PROBLEMS:
            examples.setdefault(kind, []).append(
                f"{run.run_id} ({run.status}: {run.reason}; started {_at(run.started)},"
                f" ended {run.ended_at:.3f})"
            )
        ran = executions[(run.run_id, NODE, 1)] > 0
        if kind is None and not ran:
            examples.setdefault("succeeded without running its step", []).append(run.run_id)
        if kind == KILLED and not ran:
            unrun += 1
    for kind, runs in examples.items():
        problems.append(f"{len(runs)} runs {kind}, e.g. {'; '.join(runs[:_EXAMPLES])}")
    if len(facts) != expected:
        problems.append(f"{len(facts)} runs found of {expected} started")
    waits = [run.waited for run in facts if run.waited is not None]
    longer = sum(1 for w in waits if w > plan.timeout_ms / 1000)
    if facts and not longer:
        problems.append("no step waited longer than its timeout: the backlog tested nothing")
    if not kills:
        problems.append("no worker was killed while steps waited: the phase tested nothing")
    return BacklogReport(
        plan=plan,
        elapsed_s=elapsed_s,
        kinds=kinds,
        waited_longer=longer,
        longest_wait_s=max(waits, default=0.0),
        kills=len(kills),
        killed_unrun=unrun,
        restarts=0,
        rerun=sum(1 for n in executions.values() if n > 1),
        problems=problems,
    )


def _at(t: float | None) -> str:
    return "never" if t is None else f"{t:.3f}"
