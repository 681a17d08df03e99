"""The chaos run's checks and figures: what the audit trail, the runs and the processes' logs
say after the run, and the report printed at the end (processor/tools/chaos.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import psycopg

from processor.core.workflow import WorkflowDef
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
from processor.tools.chaos_fleet import (
    KILL_AFTER_COMMIT,
    KILL_PROCESSOR,
    KILL_WORKER,
    PROCESSOR,
    WORKER,
    Fleet,
)
from processor.tools.chaos_hostile import HostileVerdict

BROKER, POSTGRES, FREEZE = "broker restart", "postgres restart", "postgres freeze"
LOCK = "outside lock"  # a run's row held FOR UPDATE by a transaction not ours
_KILL_KINDS = (KILL_PROCESSOR, KILL_WORKER, KILL_AFTER_COMMIT)
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


@dataclass(frozen=True)
class Window:
    """A fault as it happened: a kill (start == end) or an outage, in wall-clock seconds."""

    kind: str  # BROKER, POSTGRES, FREEZE, LOCK or one of the kill kinds of chaos_fleet
    what: str  # the process killed, the run held ("" for an outage)
    start: float
    end: float


@dataclass
class Totals:
    """The processors' stats summed over every start of every processor."""

    committed: int = 0
    conflicts: int = 0
    relayed: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    unknown_commits: Counter[str] = field(default_factory=Counter)
    dead_letters: Counter[str] = field(default_factory=Counter)
    force_fails: Counter[str] = field(default_factory=Counter)

    @staticmethod
    def of(stats: Sequence[dict[str, Any]]) -> Totals:
        t = Totals()
        for s in stats:
            t.committed += s["ticks"].get("committed", 0)
            t.conflicts += s["conflicts"]
            t.relayed += s["relayed"]
            t.errors.update(s["errors"])
            t.unknown_commits.update(s["unknown_commits"])
            t.dead_letters.update(s["dead_letters"])
            t.force_fails.update(s["force_fails"])
        return t


@dataclass
class ChaosReport:
    runs: int
    step_timeout_s: float
    copies: int
    seed: int
    processors: int
    workers: int
    elapsed_s: float
    outcomes: dict[tuple[str, str | None], int]
    kills: Counter[str]
    restarts: int
    windows: list[Window]
    finished_after_s: float | None  # from the end of the last fault to every run ended
    totals: Totals
    writes: int | None  # audit rows checked (None: the check failed)
    timeouts: list[TimedOut]
    never_ran: int  # of them, attempts no worker took (lost tasks: a problem)
    # Attempts whose step ran, and the executions beyond one per attempt (chaos_steps.py).
    attempts_run: int
    extra_executions: int
    # Timed-out attempts by the first fault in flight that can delay a step for real (see
    # _REAL_CAUSES; "no such fault" is a problem).
    timeout_causes: Counter[str]
    problems: list[str]
    lost_starts: int = 0  # runs inserted without a start wakeup: the sweep started them
    ended_while_locked: int = 0  # runs that ended while a row was held from outside
    # Writes to run rows that left the version where it was, by the columns they changed.
    unversioned: Counter[str] = field(default_factory=Counter)
    # The dead-letter topic as its readers see it: one per bad record (io/kafka/dlq.py).
    dead_letters: list[DeadLetter] = field(default_factory=list)
    # The hostile producer's records and the map run (processor/tools/chaos_hostile.py).
    hostile: HostileVerdict | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def lines(self) -> list[str]:
        outages = {
            k: [w for w in self.windows if w.kind == k] for k in (BROKER, POSTGRES, FREEZE, LOCK)
        }
        t = self.totals
        kills = ", ".join(f"{self.kills[k]} {k}" for k in _KILL_KINDS)
        finished = (
            f"{self.finished_after_s:.1f} s after the last fault"
            if self.finished_after_s is not None
            else "NOT ALL (see problems)"
        )
        outcomes = ", ".join(
            f"{n} {status}" + (f" ({reason})" if reason else "")
            for (status, reason), n in sorted(self.outcomes.items(), key=lambda kv: -kv[1])
        )
        rows = [
            (
                "runs",
                f"{self.runs} of the sample workflow (steps time out after"
                f" {self.step_timeout_s:.0f} s), each start wakeup delivered {self.copies} times"
                " onto random partitions",
            ),
            (
                "processes",
                f"{self.processors} processors, {self.workers} workers;"
                f" {self.restarts} restarts after kills",
            ),
            ("kills", f"{sum(self.kills.values())}: {kills}"),
            ("broker", _outage(outages[BROKER], "SIGKILL and restart on its data")),
            ("postgres", _outage(outages[POSTGRES], "immediate restart")),
            ("freeze", _outage(outages[FREEZE], "frozen behind the proxy")),
            (
                "outside lock",
                _outage(outages[LOCK], "a live run's row held FOR UPDATE")
                + (
                    f"; {self.ended_while_locked} other runs ended meanwhile"
                    if outages[LOCK]
                    else ""
                ),
            ),
            (
                "lost starts",
                f"{self.lost_starts} runs inserted without their start wakeup, started by the sweep"
                if self.lost_starts
                else "none",
            ),
            ("duration", f"{self.elapsed_s:.0f} s; every run ended {finished}"),
            ("outcomes", outcomes or "none"),
            (
                "audit",
                f"{self.writes} committed writes checked"
                if self.writes is not None
                else "FAILED (see problems)",
            ),
            (
                "one writer",
                f"{sum(self.unversioned.values())} writes to a run row that did not move its"
                " version" + (f" ({_counts(self.unversioned)})" if self.unversioned else ""),
            ),
            (
                "timeouts",
                f"{len(self.timeouts)} attempts timed out"
                + (
                    f" ({self.never_ran} never reached a worker),"
                    f" in flight during: {_counts(self.timeout_causes)}"
                    if self.timeouts
                    else ""
                ),
            ),
            (
                "executions",
                f"{self.attempts_run} attempts ran; {self.extra_executions} executions beyond"
                f" one per attempt ({_share(self.extra_executions, self.attempts_run)}), each"
                " where a process died or a deadline passed",
            ),
            ("relayed", f"{t.relayed} records sent again from the outbox"),
            ("ticks", f"{t.committed} committed, {t.conflicts} conflicts"),
            ("errors", _counts(t.errors)),
            ("unknown commits", _counts(t.unknown_commits)),
            ("dead letters", _dead_letters(t.dead_letters, self.dead_letters)),
            ("force-fails", _counts(t.force_fails)),
            *(self.hostile.rows() if self.hostile is not None else []),
        ]
        out = [f"Ductor chaos run (real Kafka and Postgres on this machine, seed {self.seed})"]
        out += [f"  {label:16} {value}" for label, value in rows]
        out.append(
            "  (stats of killed processors stop at their last periodic line: up to a second"
            " is missing)"
        )
        if self.problems:
            out.append(f"FAILED: {len(self.problems)} problem(s)")
            out += [f"  - {p}" for p in self.problems]
        else:
            out.append("PASSED: every check held")
        return out


def _dead_letters(sent: Counter[str], letters: list[DeadLetter]) -> str:
    """What the processors sent (a record redone after a kill is sent again) and what the
    topic holds, one per bad record."""
    if not sent and not letters:
        return "none"
    again = sum(letter.copies - 1 for letter in letters)
    held = Counter(letter.reason for letter in letters)
    return (
        f"{_counts(sent)} sent; in the topic {len(letters)} bad records ({_counts(held)}),"
        f" {again} copies sent again after a kill, each counted once"
    )


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.2f} %" if whole else "none"


def _outage(windows: list[Window], what: str) -> str:
    if not windows:
        return "none"
    downs = ", ".join(f"{w.end - w.start:.1f} s" for w in windows)
    return f"{len(windows)} x {what} (unavailable {downs})"


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counter.most_common()) or "none"


def _in_flight(timed_out: TimedOut, timeout_ms: int, window: Window) -> bool:
    """Whether the attempt ran (started, deadline not passed) during the window: a deadline
    is its start plus its timeout (or, judged at once, its dispatch plus its timeout, when
    it started then)."""
    deadline = timed_out.deadline_ms / 1000
    return deadline - timeout_ms / 1000 <= window.end and deadline >= window.start


def check(
    dsn: str,
    *,
    copies: int,
    seed: int,
    prefix: str,
    run_ids: Sequence[str],
    wf: WorkflowDef,
    fleet: Fleet,
    windows: list[Window],
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
    writes: int | None = None
    with connect_durable(dsn) as conn:
        outcomes = outcomes_with_prefix(conn, prefix)
        live = live_runs_with_prefix(conn, prefix, 5)
        try:
            writes = audit.assert_transitions_applied_once(conn, prefix)
            audit.assert_results_applied(conn, run_ids)
        except audit.AuditFailure as exc:
            problems.append(f"audit: {exc}")
        unversioned = audit.unversioned_writes(conn, prefix)
        timeouts = audit.timed_out_attempts(conn, prefix)
        outbox = count_outbox_with_prefix(conn, prefix)
        executions = chaos_steps.executions(conn, prefix)
        reached = chaos_steps.reached_a_worker(conn, prefix)
        ended_while_locked = sum(
            ended_between(conn, prefix, w.start, w.end, w.what) for w in windows if w.kind == LOCK
        )

    wrong = {k: n for k, n in outcomes.items() if k != ("succeeded", None)}
    if wrong or sum(outcomes.values()) != len(run_ids):
        problems.append(f"runs not succeeded: {wrong}, of {sum(outcomes.values())} found")
    problems += [
        f"  live: {run_id} {status} next wakeup {nxt} nodes {nodes}"
        for run_id, status, nodes, nxt in live
    ]
    timeout_ms = {s.name: s.timeout_ms for s in wf.steps}
    stalls = [
        replace(w, end=w.start + session_timeout_s) if w.kind == KILL_WORKER else w for w in windows
    ]
    causes: Counter[str] = Counter()
    never_ran = 0
    for t in timeouts:
        during = {w.kind for w in stalls if _in_flight(t, timeout_ms[t.node], w)}
        real = [c for c in _REAL_CAUSES if c in during]
        causes[real[0] if real else "no such fault"] += 1
        where = (
            f"{t.run_id}/{t.node} #{t.attempt}, deadline {t.deadline_ms / 1000:.3f},"
            f" timed out at {t.at.timestamp():.3f}, in flight during {sorted(during) or 'no fault'}"
        )
        if chaos_steps.never_ran((t.run_id, t.node, t.attempt), t.result_at is not None, reached):
            never_ran += 1  # its task never reached a worker: a lost dispatch
            problems.append(f"attempt timed out and never reached a worker: {where}")
        elif not real:
            recorded = "none" if t.result_at is None else f"{t.result_at.timestamp():.3f}"
            problems.append(
                f"attempt timed out with no outage to explain it: {where},"
                f" result recorded at {recorded}"
            )
    if unversioned:
        problems.append(
            f"writes to run rows that did not move their version (the row has one writer):"
            f" {dict(unversioned)}"
        )
    if outbox:
        problems.append(f"{outbox} outbox rows left after every process stopped")
    for exit_ in fleet.exits:
        problems.append(f"{exit_.name} exited by itself with {exit_.code}:\n{exit_.log_tail}")
    for name, code in stop_codes.items():
        if code != 0:
            problems.append(f"{name} did not stop cleanly on SIGTERM: exit {code}")
    totals = Totals.of(fleet.processor_stats())
    # Nothing but the hostile records is dead-lettered (each checked by chaos_hostile.py).
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
        outcomes=outcomes,
        kills=fleet.kills,
        restarts=fleet.restarts,
        windows=windows,
        finished_after_s=finished_after,
        totals=totals,
        writes=writes,
        timeouts=timeouts,
        never_ran=never_ran,
        attempts_run=len(executions),
        extra_executions=chaos_steps.extra_executions(executions),
        timeout_causes=causes,
        problems=problems,
        lost_starts=lost_starts,
        ended_while_locked=ended_while_locked,
        unversioned=unversioned,
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
