"""The chaos run's checks: what the audit trail, the runs and the processes' logs say after
the run (processor/tools/chaos.py), gathered into the report of chaos_report.py."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import psycopg

from processor.core.workflow_def import WorkflowDef
from processor.io.kafka.dlq import DeadLetter
from processor.io.postgres.connections import connect_durable
from processor.io.postgres.run_counts import (
    count_outbox_with_prefix,
    like_prefix,
    live_runs_with_prefix,
    outcomes_with_prefix,
)
from processor.tools import audit, chaos_steps
from processor.tools.audit import TimedOut
from processor.tools.chaos_fleet import KILL_WORKER, PROCESSOR, WORKER, ChaosFleet
from processor.tools.chaos_hostile_check import HostileVerdict
from processor.tools.chaos_report import FREEZE, LOCK, ChaosReport, FaultWindow, Totals

# Faults that can make a step attempt time out for real. A step's timeout counts from the
# moment a worker starts it (core/tick.py, rule 4), so only what holds a started execution's
# result past its start plus its timeout can: while Postgres is frozen nothing records a
# result; a SIGKILLed worker's running steps are run again (as reruns, their timeout counted
# anew) only once another worker has its step partitions, after the group's session timeout
# (10 s on the local broker, the sample steps' timeout), so a worker kill counts from the
# kill to the end of that session. Time in a queue times nothing out: a broker away holds
# tasks in their queue (or the outbox) and results' wakeups, never a started step's result
# (recorded in Postgres, and applied before any deadline at the next tick). Nor must a
# processor's crash or a Postgres restart cost an attempt: the outbox relays a dead instance's
# effects within seconds.
_REAL_CAUSES = (FREEZE, KILL_WORKER)


def _in_flight(timed_out: TimedOut, timeout_ms: int, window: FaultWindow) -> bool:
    """Whether the attempt ran (started, deadline not passed) during the window: a deadline
    is its start plus its timeout (or, judged at once, its dispatch plus its timeout, when
    it started then)."""
    deadline = timed_out.deadline_ms / 1000
    return deadline - timeout_ms / 1000 <= window.end and deadline >= window.start


@dataclass(frozen=True)
class _Found:
    """What the database says after the run."""

    outcomes: dict[tuple[str, str | None], int]
    live: list[tuple[str, str, Any, datetime | None]]
    writes: int | None
    unversioned: Counter[str]
    timeouts: list[TimedOut]
    outbox: int
    executions: Counter[tuple[str, str, int]]
    reached: set[chaos_steps.Attempt]
    ended_while_locked: int


def _read(
    dsn: str, prefix: str, run_ids: Sequence[str], windows: list[FaultWindow], problems: list[str]
) -> _Found:
    writes: int | None = None
    with connect_durable(dsn) as conn:
        outcomes = outcomes_with_prefix(conn, prefix)
        live = live_runs_with_prefix(conn, prefix, 5)
        try:
            writes = audit.assert_transitions_applied_once(conn, prefix)
            audit.assert_results_applied(conn, run_ids)
        except audit.AuditFailure as exc:
            problems.append(f"audit: {exc}")
        return _Found(
            outcomes=outcomes,
            live=live,
            writes=writes,
            unversioned=audit.unversioned_writes(conn, prefix),
            timeouts=audit.timed_out_attempts(conn, prefix),
            outbox=count_outbox_with_prefix(conn, prefix),
            executions=chaos_steps.executions(conn, prefix),
            reached=chaos_steps.reached_a_worker(conn, prefix),
            ended_while_locked=sum(
                ended_between(conn, prefix, w.start, w.end, w.what)
                for w in windows
                if w.kind == LOCK
            ),
        )


def _timeout_causes(
    found: _Found,
    wf: WorkflowDef,
    windows: list[FaultWindow],
    session_timeout_s: float,
    problems: list[str],
) -> tuple[Counter[str], int]:
    """Each timed-out attempt by the first fault in flight that explains it, and how many
    never reached a worker; an attempt nothing explains is a problem."""
    timeout_ms = {s.name: s.timeout_ms for s in wf.steps}
    stalls = [
        replace(w, end=w.start + session_timeout_s) if w.kind == KILL_WORKER else w for w in windows
    ]
    causes: Counter[str] = Counter()
    never_ran = 0
    for t in found.timeouts:
        during = {w.kind for w in stalls if _in_flight(t, timeout_ms[t.node], w)}
        real = [c for c in _REAL_CAUSES if c in during]
        causes[real[0] if real else "no such fault"] += 1
        where = (
            f"{t.run_id}/{t.node} #{t.attempt}, deadline {t.deadline_ms / 1000:.3f},"
            f" timed out at {t.at.timestamp():.3f}, in flight during {sorted(during) or 'no fault'}"
        )
        key = (t.run_id, t.node, t.attempt)
        if chaos_steps.never_ran(key, t.result_at is not None, found.reached):
            never_ran += 1  # its task never reached a worker: a lost dispatch
            problems.append(f"attempt timed out and never reached a worker: {where}")
        elif not real:
            recorded = "none" if t.result_at is None else f"{t.result_at.timestamp():.3f}"
            problems.append(
                f"attempt timed out with no outage to explain it: {where},"
                f" result recorded at {recorded}"
            )
    return causes, never_ran


def _run_problems(found: _Found, run_ids: Sequence[str]) -> list[str]:
    """Runs that did not succeed, and those not yet ended."""
    problems = []
    wrong = {k: n for k, n in found.outcomes.items() if k != ("succeeded", None)}
    if wrong or sum(found.outcomes.values()) != len(run_ids):
        problems.append(f"runs not succeeded: {wrong}, of {sum(found.outcomes.values())} found")
    problems += [
        f"  live: {run_id} {status} next wakeup {nxt} nodes {nodes}"
        for run_id, status, nodes, nxt in found.live
    ]
    return problems


def _process_problems(
    found: _Found, fleet: ChaosFleet, stop_codes: dict[str, int | None]
) -> list[str]:
    """Rows written without their version, effects left over, processes that ended badly."""
    problems = []
    if found.unversioned:
        problems.append(
            f"writes to run rows that did not move their version (the row has one writer):"
            f" {dict(found.unversioned)}"
        )
    if found.outbox:
        problems.append(f"{found.outbox} outbox rows left after every process stopped")
    for exit_ in fleet.exits:
        problems.append(f"{exit_.name} exited by itself with {exit_.code}:\n{exit_.log_tail}")
    for name, code in stop_codes.items():
        if code != 0:
            problems.append(f"{name} did not stop cleanly on SIGTERM: exit {code}")
    return problems


def _dead_letter_problems(
    totals: Totals, dead_letters: Sequence[DeadLetter], hostile: HostileVerdict | None
) -> list[str]:
    """Nothing but the hostile records is dead-lettered (each checked by chaos_hostile_check.py)."""
    problems = []
    hostile_letters = hostile.letters if hostile is not None else set()
    others = [d for d in dead_letters if (d.partition, d.offset) not in hostile_letters]
    if others or (totals.dead_letters and hostile is None):
        problems.append(
            f"records dead-lettered but the hostile ones: {dict(totals.dead_letters)} sent,"
            f" {len(others)} other bad records in the topic, the first:"
            f" {[(d.reason, d.source_topic, d.detail) for d in others[:3]]}"
        )
    if hostile is not None:
        problems += hostile.problems
    return problems


def check(
    dsn: str,
    *,
    copies: int,
    seed: int,
    prefix: str,
    run_ids: Sequence[str],
    wf: WorkflowDef,
    fleet: ChaosFleet,
    windows: list[FaultWindow],
    session_timeout_s: float,
    stop_codes: dict[str, int | None],
    elapsed_s: float,
    ended_at: float | None,
    problems: list[str],
    lost_starts: int = 0,
    dead_letters: Sequence[DeadLetter] = (),
    hostile: HostileVerdict | None = None,
) -> ChaosReport:
    """Every check of the run, with its figures; failed checks are added to ``problems``."""
    found = _read(dsn, prefix, run_ids, windows, problems)
    problems += _run_problems(found, run_ids)
    causes, never_ran = _timeout_causes(found, wf, windows, session_timeout_s, problems)
    problems += _process_problems(found, fleet, stop_codes)
    totals = Totals.of(fleet.processor_stats())
    problems += _dead_letter_problems(totals, dead_letters, hostile)
    last_fault = max((w.end for w in windows), default=None)
    finished_after = (
        ended_at - last_fault if ended_at is not None and last_fault is not None else None
    )
    if ended_at is None:
        problems.append("not every run ended within the bound after the last fault")
    return ChaosReport(
        runs=len(run_ids),
        step_timeout_s=max(s.timeout_ms for s in wf.steps) / 1000,
        copies=copies,
        seed=seed,
        processors=sum(1 for m in fleet.members if m.kind == PROCESSOR),
        workers=sum(1 for m in fleet.members if m.kind == WORKER),
        elapsed_s=elapsed_s,
        outcomes=found.outcomes,
        kills=fleet.kills,
        restarts=fleet.restarts,
        windows=windows,
        finished_after_s=finished_after,
        totals=totals,
        writes=found.writes,
        timeouts=found.timeouts,
        never_ran=never_ran,
        attempts_run=len(found.executions),
        extra_executions=chaos_steps.extra_executions(found.executions),
        timeout_causes=causes,
        problems=problems,
        lost_starts=lost_starts,
        ended_while_locked=found.ended_while_locked,
        unversioned=found.unversioned,
        dead_letters=list(dead_letters),
        hostile=hostile,
    )


def ended_between(
    conn: psycopg.Connection[Any], prefix: str, start: float, end: float, held: str
) -> int:
    """Runs of the chaos run, other than ``held``, that ended between two wall-clock times."""
    row = conn.execute(
        "SELECT count(*) FROM eec_workflow_run WHERE run_id LIKE %s AND run_id <> %s"
        " AND status = 'succeeded'"
        " AND last_transition_at BETWEEN to_timestamp(%s) AND to_timestamp(%s)",
        (like_prefix(prefix), held, start, end),
    ).fetchone()
    return int(row[0]) if row else 0
