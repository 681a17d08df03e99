"""The worker's database: connections on threads of their own, so the loop never waits for
Postgres. The loop hands them work (claims, results, checks) and goes on; each thread takes
whatever has gathered since its last statement and does each kind in one statement, so claims
and results are written in groups as small or large as the load makes them, and answers on
the loop's queue. The claims' thread also keeps the worker's heartbeat in the instance
registry.

Outages are ridden through: a lost connection is reopened with the outage's capped backoff
and the same statement run again. Every write here may be redone: a result insert is
idempotent, and a claim that landed before its answer was lost finds the attempt started by
this very worker, which core/claims.py takes for this worker's own claim. What the database
refuses for what a task holds never stops the worker: a task whose data cannot be read fails
its attempt, a result that cannot be stored is recorded as a failed attempt saying why, and a
result for a run that no longer exists is dropped with a log line. So does an exception nobody
foresaw (a value that cannot be encoded, a bug): the task it was met on is tried alone, and
fails its attempt; it never ends a lane's thread.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import psycopg

from processor.core.claims import ClaimFacts, verdict
from processor.core.model import StepOutcome
from processor.core.step_task import StepData, StepTask
from processor.io.postgres.connections import connect, connect_durable, ping
from processor.io.postgres.instances import Presence
from processor.io.postgres.step_attempts import (
    Report,
    claim_attempts,
    not_current,
    permit_starts,
    report_executions,
    unclaim_attempts,
)
from processor.io.postgres.step_data import MissingData, insert_step_results
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.runtime.outage import Outage, SharedOutage
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.logs import describe, first_line
from processor.worker.lane_batches import claim_ids, gather_claims, result_row
from processor.worker.lanes import STOPPED, Lane, Stopped
from processor.worker.messages import (
    Answer,
    Claimed,
    NotCurrent,
    Permitted,
    Recorded,
    RecordResults,
    Request,
    TaskClaim,
    ToRecord,
)
from processor.worker.steps import AttemptResult
from processor.worker.tasks import Task

log = logging.getLogger("ductor.worker")


@dataclass(frozen=True)
class ClaimRules:
    max_starts: int  # executions an attempt may begin in all (1 + the crash reruns)
    gone_after_s: float  # a worker silent this long is gone (DUCTOR_INSTANCE_TIMEOUT_S)


class WorkerDatabase:
    """Two lanes, each a connection on a thread of its own, so that neither kind of work
    waits behind the other: *claims* (and the worker's heartbeat, its checks of running
    attempts, the claims it gives back) and *results*. A claim is committed without waiting
    for the disk (``synchronous_commit`` off): only a crash of Postgres itself can lose one,
    and then an attempt may run once more. A result is committed durably: the worker lets its
    task go once the result is recorded, and a result lost afterwards would cost the attempt
    its deadline."""

    def __init__(
        self,
        dsn: str,
        instance_id: str,
        rules: ClaimRules,
        outage: Outage,
        answers: Callable[[Answer], None],
        presence: Presence,
        faults: Faults = NO_FAULTS,
        threads: ThreadWatch | None = None,
        isolated: Counter[str] | None = None,
    ) -> None:
        self._faults = faults
        # Exceptions nobody foresaw, isolated to their tasks by the lanes (the worker's stats).
        self.isolated: Counter[str] = Counter() if isolated is None else isolated
        self._dsn = dsn
        self._instance_id = instance_id
        self._rules = rules
        self._answer = answers
        self._presence = presence  # whether this worker may judge others gone
        shared = self._outage = SharedOutage(outage, ("claims", "results"))
        self._claims = Lane(
            "claims",
            lambda: connect(dsn),
            self._serve_claims,
            shared,
            tick=lambda: self._ping_if_doubted(self._claims),
            threads=threads,
        )
        self._results = Lane(
            "results",
            lambda: connect_durable(dsn),
            self._serve_results,
            shared,
            tick=lambda: self._ping_if_doubted(self._results),
            threads=threads,
        )
        # Statements by kind: how many, for how many tasks, and the seconds they took.
        self.statements: dict[str, list[float]] = {}
        self.fetched = 0  # tasks whose data was read here (not carried inline)
        self.dropped = 0  # results not recorded: their run no longer exists, or unstorable

    # -- the loop's side --------------------------------------------------------------------

    def start(self) -> None:
        """The lanes' threads; each connects on its first statement, through outages like
        any other (the worker's start waited until the database answered)."""
        self._claims.start()
        self._results.start()

    def ask(self, request: Request) -> None:
        """Hand ``request`` to its lane: results to the results lane, the rest to the claims
        lane (answers come back on the loop's queue: messages.py)."""
        if isinstance(request, RecordResults):
            self._results.put(request)
        else:
            self._claims.put(request)

    def close(self, timeout_s: float) -> None:
        """Finish what was asked within ``timeout_s`` (giving up on an outage), and close."""
        deadline = time.monotonic() + timeout_s
        self._results.close(timeout_s)
        self._claims.close(max(0.0, deadline - time.monotonic()))
        for lane in (self._claims, self._results):
            if not lane.thread.is_alive():
                lane.close_connection()

    def give_up(self) -> None:
        """Stop retrying through an outage (a stopping worker that must not wait for it)."""
        self._claims.give_up.set()
        self._results.give_up.set()

    def statements_done(self) -> dict[str, dict[str, int]]:
        """The statements so far, by kind: how many, for how many tasks, how long (ms)."""
        return {
            kind: {"count": int(n), "tasks": int(rows), "ms": round(seconds * 1000)}
            for kind, (n, rows, seconds) in self.statements.items()
        }

    # -- the lanes' threads -----------------------------------------------------------------

    def _serve_claims(self, batch: list[Request]) -> bool:
        """What gathered on the claims lane, one statement per kind, in this order: the
        permit (with the claims when there are any, else alone), claims, reruns, checks,
        claims given back, reports."""
        permit, kinds = gather_claims(batch)
        if permit and "claim" not in kinds:
            if self._timed("permit", [permit], self._permit) is STOPPED:
                return False
            permit = 0
        for kind, action in (
            ("claim", lambda tasks: self._claim(tasks, permit=permit)),
            ("rerun", self._claim_reruns),
            ("check", self._check),
            ("unclaim", self._unclaim),
            ("report", self._report),
        ):
            items = kinds.get(kind)
            if items and self._timed(kind, items, action) is STOPPED:
                return False
        return True

    def _serve_results(self, batch: list[Request]) -> bool:
        results = [r for b in batch if isinstance(b, RecordResults) for r in b.results]
        return self._timed("record", results, self._record) is not STOPPED

    def _ping_if_doubted(self, lane: Lane) -> bool:
        """In an outage the other lane saw, this lane's connection tries too (it is most
        likely gone as well), so the outage ends once both are through it."""
        if not self._outage.doubts(lane.name):
            return True
        return lane.through_outages(ping) is not STOPPED

    def _timed(self, kind: str, items: list[Any], action: Callable[[Any], object]) -> object:
        started = time.perf_counter()
        result = action(items)
        counts = self.statements.setdefault(kind, [0, 0, 0.0])
        counts[0] += 1
        counts[1] += len(items)
        counts[2] += time.perf_counter() - started
        return result

    # -- claims -----------------------------------------------------------------------------

    def _claim_reruns(self, tasks: list[Task]) -> Literal[Stopped.STOPPED] | None:
        return self._claim(tasks, reruns=True)

    def _permit(self, through: list[int]) -> Literal[Stopped.STOPPED] | None:
        done = self._claims.through_outages(
            lambda conn: permit_starts(conn, self._instance_id, through[0])
        )
        if done is STOPPED:
            return STOPPED
        self._answer(Permitted(through[0]))
        return None

    def _claim(
        self, tasks: list[Task], reruns: bool = False, permit: int = 0
    ) -> Literal[Stopped.STOPPED] | None:
        # Judged before the statement: an outage during it makes the next claim wait.
        may_judge = self._presence.may_judge()
        steps = [t.step for t in tasks]
        answers = self._claims.through_outages(
            lambda conn: self._claim_isolating(
                conn,
                steps,
                self._instance_id,
                max_starts=self._rules.max_starts,
                may_judge=may_judge,
                gone_after_s=self._rules.gone_after_s,
                reruns=reruns,
                seqs=None if reruns else [t.claim_seq for t in tasks],
                permit=permit,
            )
        )
        if answers is STOPPED:
            return STOPPED
        if permit:
            self._answer(Permitted(permit))
        claimed: list[TaskClaim] = []
        for task, (facts, read, details) in zip(tasks, answers, strict=True):
            decided = verdict(facts, self._rules.max_starts, may_judge)
            if read is not None:
                self.fetched += 1
            data = read if read is not None else task.data
            starts = facts.claimed_starts or facts.starts or 0
            claimed.append(TaskClaim(task, decided, starts, data, details))
        self._answer(Claimed(claimed))
        return None

    # -- results ----------------------------------------------------------------------------

    def _record(self, results: list[ToRecord]) -> Literal[Stopped.STOPPED] | None:
        """The results in one statement; if the database refuses any of them (or writing them
        raises what nobody foresaw), nothing was written and each is recorded alone
        (``_record_one`` says what becomes of a refused one). A result of a run that no longer
        exists is dropped."""
        me = self._instance_id
        try:
            self._faults.hit(Point.TASK_RECORD, [r.task.key.run_id for r in results])
            rows = [result_row(r) for r in results]
            gone = self._results.through_outages(lambda conn: insert_step_results(conn, rows, me))
        except Exception:  # each alone: one result never holds the others
            recorded: list[tuple[Task, bool]] = []
            for result in results:
                one = self._record_one(result)
                if one is STOPPED:
                    return STOPPED
                recorded.append((result.task, one))
            self._answer(Recorded(recorded))
            return None
        if gone is STOPPED:
            return STOPPED
        gone_at = set(gone)
        for i in gone_at:
            self._dropped_gone(results[i].task)
        self._answer(Recorded([(r.task, i not in gone_at) for i, r in enumerate(results)]))
        return None

    def _dropped_gone(self, task: Task) -> None:
        log.warning("dropped a step result: the run no longer exists", extra=claim_ids(task))
        self.dropped += 1

    def _record_one(self, result: ToRecord) -> bool | Literal[Stopped.STOPPED]:
        """One result. True: recorded; False: not (the run no longer exists, or not even a
        bare failure can be stored)."""
        task, outcome = result.task, result.outcome
        me = self._instance_id
        try:
            self._faults.hit(Point.TASK_RECORD, task.key.run_id)
            gone = self._results.through_outages(
                lambda conn: insert_step_results(conn, [result_row(result)], me)
            )
        except Exception as exc:  # the result itself cannot be stored
            if not isinstance(exc, psycopg.Error):
                self._isolated("record", task, exc)
            if outcome.outcome is StepOutcome.FAILED and outcome.output is None:
                # Not even a bare failure can be stored: drop it, visibly; the attempt then
                # times out and the coordinator retries it.
                log.error(
                    "dropped a step result that cannot be stored: %s",
                    first_line(exc),
                    extra=claim_ids(task),
                )
                self.dropped += 1
                return False
            # The attempt fails, saying why (a bare failure: this recursion ends here). A
            # check the database made is final: the same result would be refused again (the
            # run's tags set by steps are at their bound: schemas/migrations/0045_run_tags.sql).
            why = f"the step's result could not be stored: {describe(exc)}"
            final = isinstance(exc, psycopg.errors.CheckViolation)
            return self._record_one(
                result._replace(
                    outcome=AttemptResult.failed(why, retryable=not final), details=None, tags=()
                )
            )
        if gone is STOPPED:
            return STOPPED
        if gone:
            self._dropped_gone(task)
            return False
        return True

    def _isolated(self, stage: str, task: Task | None, exc: Exception) -> None:
        """An exception nobody foresaw, isolated by a lane to one task: counted, logged."""
        self.isolated[stage] += 1
        log.error(
            "%s: an unexpected exception, isolated to a step task: %s",
            stage,
            describe(exc),
            exc_info=exc,
            extra={"stage": stage, **({} if task is None else claim_ids(task))},
        )

    def _claim_isolating(
        self,
        conn: psycopg.Connection[Any],
        steps: list[StepTask],
        worker_id: str,
        seqs: list[int] | None,
        **rules: Any,
    ) -> list[tuple[ClaimFacts, StepData | MissingData | None, Any]]:
        """The group's claim in one statement; should a task make it fail on what it holds
        (its data cannot be read, or reading it raises what nobody foresaw), each task alone,
        so that one bad task fails only its own attempt (its claim then says it runs; the
        data says why it cannot)."""
        try:
            return claim_attempts(conn, steps, worker_id, seqs=seqs, **rules)
        except (psycopg.OperationalError, psycopg.InterfaceError):
            raise
        except Exception as exc:
            if len(steps) == 1:
                if not isinstance(exc, psycopg.Error):
                    self._isolated("claim", None, exc)
                if rules.get("permit"):  # it rode on the statement that failed
                    permit_starts(conn, worker_id, rules["permit"])
                facts = ClaimFacts(True, True, False, False, None, False, True, None)
                return [(facts, MissingData(f"cannot be read: {describe(exc)}"), None)]
            return [
                answer
                for i, step in enumerate(steps)
                for answer in self._claim_isolating(
                    conn, [step], worker_id, None if seqs is None else [seqs[i]], **rules
                )
            ]

    def _report(self, reports: list[Report]) -> Literal[Stopped.STOPPED] | None:
        done = self._claims.through_outages(
            lambda conn: report_executions(conn, reports, self._instance_id)
        )
        return STOPPED if done is STOPPED else None

    def _unclaim(self, tasks: list[Task]) -> Literal[Stopped.STOPPED] | None:
        keys = [t.key for t in tasks]
        done = self._claims.through_outages(
            lambda conn: unclaim_attempts(conn, keys, self._instance_id)
        )
        return STOPPED if done is STOPPED else None

    # -- checks -----------------------------------------------------------------------------

    def _check(self, tasks: list[Task]) -> Literal[Stopped.STOPPED] | None:
        keys = [t.key for t in tasks]
        stale = self._claims.through_outages(lambda conn: not_current(conn, keys))
        if stale is STOPPED:
            return STOPPED
        if stale:
            self._answer(NotCurrent([tasks[i] for i in stale]))
        return None
