"""The worker's database: one connection, ridden through outages, for reading what its steps
need and recording their results.

Every call retries through a lost connection (reopened with the outage's capped backoff)
until it is done or the worker stops, and then returns ``STOPPED``: a result whose insert was
lost with its connection is inserted again, which is idempotent (keyed by run, node, attempt).
What the database refuses for what a task holds never stops the worker: a task whose data
cannot be read fails its attempt, a result that cannot be stored is recorded as a failed
attempt saying why, and a result for a run that no longer exists is dropped with a log line.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from enum import Enum
from typing import Any, Literal, TypeVar

import psycopg

from processor.core.model import StepOutcome
from processor.core.step_task import StepData, StepTask
from processor.engine.outage import Outage
from processor.engine.steps import storable_text
from processor.io.logs import first_line
from processor.io.step_data import (
    MissingData,
    fetch_step_data,
    insert_step_results,
)
from processor.io.store import connect_durable

log = logging.getLogger("ductor.worker")

T = TypeVar("T")
Outcome = tuple[StepOutcome, Any, str | None]  # a step's outcome, output and error


class _Stopped(Enum):
    STOPPED = "stopped"


STOPPED: Literal[_Stopped.STOPPED] = _Stopped.STOPPED


class WorkerDatabase:
    def __init__(self, dsn: str, outage: Outage, stop: threading.Event) -> None:
        self._dsn = dsn
        self._outage = outage
        self._stop = stop
        self._conn: psycopg.Connection[Any] | None = None
        self.fetched = 0  # tasks whose data was read here (not carried inline)
        self.dropped = 0  # results not recorded: their run no longer exists, or unstorable

    def connect(self) -> None:
        """The first connection, not retried: a worker that never reached its database is
        misconfigured (and exits), one that lost it is in an outage (and waits)."""
        self._conn = connect_durable(self._dsn)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _through_outages(
        self, action: Callable[[psycopg.Connection[Any]], T]
    ) -> T | Literal[_Stopped.STOPPED]:
        while True:
            try:
                if self._conn is None:
                    self._conn = connect_durable(self._dsn)
                result = action(self._conn)
            except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
                # Whether a lost write committed is unknown: every write here is idempotent.
                self.close()
                if self._stop.wait(self._outage.failed(first_line(exc))):
                    return STOPPED
                continue
            except psycopg.Error:
                self._outage.ok()  # it answered: what it refused is the caller's to handle
                raise
            self._outage.ok()
            return result

    # -- reading ---------------------------------------------------------------------------

    def fetch(self, tasks: list[StepTask]) -> list[StepData | MissingData] | None:
        """The tasks' data in one query (None: stopped first)."""
        fetched = self._through_outages(lambda conn: _fetch_isolating(conn, tasks))
        if fetched is STOPPED:
            return None
        self.fetched += len(tasks)
        return fetched

    # -- recording -------------------------------------------------------------------------

    def record_batch(self, tasks: list[StepTask], outcomes: list[Outcome]) -> list[bool] | None:
        """The batch's results in one statement; if the database refuses any of them, nothing
        was written and each is recorded alone (``record`` says what becomes of a refused
        one). Whether each was recorded (False: not, and its run is not to be woken); None:
        stopped first."""
        rows = [
            (t.run_id, t.node, t.attempt, outcome, output, error)
            for t, (outcome, output, error) in zip(tasks, outcomes, strict=True)
        ]
        try:
            done = self._through_outages(lambda conn: insert_step_results(conn, rows))
        except psycopg.Error:
            recorded: list[bool] = []
            for task, outcome in zip(tasks, outcomes, strict=True):
                one = self.record(task, *outcome)
                if one is None:
                    return None
                recorded.append(one)
            return recorded
        return None if done is STOPPED else [True] * len(tasks)

    def record(
        self, task: StepTask, outcome: StepOutcome, output: Any, error: str | None
    ) -> bool | None:
        """One result. True: recorded; False: not (the run no longer exists, or not even a
        bare failure can be stored); None: stopped first."""
        ids = {"run_id": task.run_id, "node": task.node, "attempt": task.attempt}
        try:
            done = self._through_outages(
                lambda conn: insert_step_results(
                    conn, [(task.run_id, task.node, task.attempt, outcome, output, error)]
                )
            )
        except psycopg.errors.ForeignKeyViolation:
            log.warning("dropped a step result: the run no longer exists", extra=ids)
            self.dropped += 1
            return False
        except psycopg.Error as exc:  # the result itself cannot be stored
            if outcome is StepOutcome.FAILED and output is None:
                # Not even a bare failure can be stored: drop it, visibly; the attempt then
                # times out and the coordinator retries it.
                log.error(
                    "dropped a step result that cannot be stored: %s", first_line(exc), extra=ids
                )
                self.dropped += 1
                return False
            # The attempt fails, saying why (a bare failure: this recursion ends here).
            why = storable_text(f"the step's result could not be stored: {first_line(exc)}")
            return self.record(task, StepOutcome.FAILED, None, why)
        return None if done is STOPPED else True


def _fetch_isolating(
    conn: psycopg.Connection[Any], tasks: list[StepTask]
) -> list[StepData | MissingData]:
    """The batch's data in one query; should a task make it fail on what it holds, each task
    alone, so that one bad task fails only its own attempt."""
    try:
        return fetch_step_data(conn, tasks)
    except (psycopg.OperationalError, psycopg.InterfaceError):
        raise
    except psycopg.Error as exc:
        if len(tasks) == 1:
            return [MissingData(f"cannot be read: {first_line(exc)}")]
        return [d for t in tasks for d in _fetch_isolating(conn, [t])]
