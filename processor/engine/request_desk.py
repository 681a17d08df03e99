"""Where the requests read from ``ductor.requests`` (core/requests.py) wait for the request
statement (io/postgres/request_store.py), run on a database thread and connection of its own, so
that a batch of ticks never waits behind it nor it behind one; one statement in flight at a time.
The core answers each request with a plan (core/request_plans.py: a start wakeup, a dead
letter) that the one executor carries out; a record is done, and its offset may pass, once
the broker has what its plan sends. A record whose statement failed is tried again after a
backoff; one whose content makes the statement fail is found by halving the batch and
dead-lettered alone (poison, or ``unexpected_error`` for an exception that is not the
database's: a value that cannot be encoded, a bug), as in the commit path. A request whose
plan cannot be built or carried out is dead-lettered alone too: nothing one request holds
reaches the loop.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from processor.core.decide import reject
from processor.core.outcomes import DeadLetterReason
from processor.core.plans import Rules
from processor.core.records import Inbound
from processor.core.request_plans import Refused, RequestAnswer, request_plan
from processor.core.requests import Request
from processor.core.shapes import TopicPartition
from processor.engine.executor import Executor
from processor.engine.stage_thread import InFlight, StageThread
from processor.io.postgres import connections
from processor.io.postgres.db_errors import item_fault
from processor.io.postgres.request_store import Item, apply_requests
from processor.io.postgres.store import Definitions
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.runtime.outage import Outage
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.logs import describe, first_line

log = logging.getLogger("ductor.requests")

# Requests per statement: a backlog drains in statements of this many.
_PER_STATEMENT = 1000


@dataclass
class _Answered:
    """What a request statement did: the answers, in order, or the error that failed it."""

    answers: list[RequestAnswer] = field(default_factory=list)
    error: psycopg.Error | None = None
    # Requests whose statement raised what nobody foresaw: (run id, the exception), for the
    # loop to count and log (their answers are unexpected_error dead letters).
    isolated: list[tuple[str, Exception]] = field(default_factory=list)


class RequestDesk:
    def __init__(
        self,
        dsn: str,
        executor: Executor,
        rules: Rules,
        wall_ms: Callable[[], int],
        postgres: Outage,
        monotonic: Callable[[], float] = time.monotonic,
        faults: Faults = NO_FAULTS,
        threads: ThreadWatch | None = None,
    ) -> None:
        self._dsn = dsn
        self._executor = executor
        self._rules = rules
        self._wall_ms = wall_ms
        self._postgres = postgres
        self._monotonic = monotonic
        self._faults = faults
        self._conn: psycopg.Connection[Any] | None = None
        self._definitions = Definitions()
        self._runner = StageThread("ductor-requests", threads)
        self._waiting: list[Item] = []
        self._in_flight: tuple[list[Item], InFlight[_Answered]] | None = None
        self._next_try_at = 0.0

    def __len__(self) -> int:
        """Requests taken in and not answered yet (waiting or in flight)."""
        return len(self._waiting) + (len(self._in_flight[0]) if self._in_flight else 0)

    def use_rules(self, rules: Rules) -> None:
        self._rules = rules

    def add(self, record: Inbound, request: Request) -> None:
        self._waiting.append((request, record))

    def next_at(self) -> float | None:
        """When the loop has something to do here (None: nothing waits)."""
        if self._in_flight is not None:
            return self._monotonic() + 0.005
        return self._next_try_at if self._waiting else None

    def advance(self) -> None:
        """One loop turn: carry out the statement that ended, then start the next."""
        if self._in_flight is not None:
            if not self._in_flight[1].done():
                return
            self._carry_out()
        if not self._waiting or self._monotonic() < self._next_try_at:
            return
        batch, self._waiting = self._waiting[:_PER_STATEMENT], self._waiting[_PER_STATEMENT:]
        self._in_flight = (batch, self._runner.submit(lambda: self._apply(batch)))

    def flush(self, timeout_s: float) -> bool:
        """Wait for the statement in flight and carry it out (a rebalance, the shutdown);
        False if it did not end in time (its records are then redone by the next owner)."""
        if self._in_flight is None:
            return True
        if not self._in_flight[1].wait(timeout_s):
            return False
        self._carry_out()
        return True

    def drop_partitions(self, tps: set[TopicPartition]) -> None:
        """Forget the waiting requests of partitions given up: their next owner redoes them."""
        self._waiting = [item for item in self._waiting if item[1].tp not in tps]

    def drop_waiting(self) -> None:
        self._waiting = []

    # -- the database thread ---------------------------------------------------------------

    def _apply(self, batch: list[Item]) -> _Answered:
        answered = _Answered()
        try:
            answered.answers = self._isolating_poison(batch, answered)
        except psycopg.Error as exc:
            self._close()
            return _Answered(error=exc)
        self._faults.hit(Point.AFTER_REQUESTS, [request.run_id for request, _ in batch])
        return answered

    def _isolating_poison(self, batch: list[Item], answered: _Answered) -> list[RequestAnswer]:
        """The batch's answers; a statement that fails on what one request holds (not on the
        connection), or raises what nobody foresaw (its transaction rolled back), is tried
        on each half, down to the request that makes it fail."""
        try:
            self._faults.hit(Point.REQUEST, [request.run_id for request, _ in batch])
            return apply_requests(self._connection(), self._definitions, batch, self._faults)
        except Exception as exc:
            if not item_fault(exc):
                raise
            if len(batch) == 1:
                if isinstance(exc, psycopg.Error):
                    return [Refused(DeadLetterReason.POISON, describe(exc))]
                answered.isolated.append((batch[0][0].run_id, exc))
                return [Refused(DeadLetterReason.UNEXPECTED_ERROR, describe(exc))]
            half = len(batch) // 2
            first = self._isolating_poison(batch[:half], answered)
            return first + self._isolating_poison(batch[half:], answered)

    def _connection(self) -> psycopg.Connection[Any]:
        # Durable: a request's offset passes once its row is written, so the row must not be
        # lost by a crash of the database afterwards (the server's default may not be so).
        if self._conn is None or self._conn.closed:
            self._conn = connections.connect_durable(self._dsn)
        return self._conn

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- the loop thread -------------------------------------------------------------------

    def _carry_out(self) -> None:
        assert self._in_flight is not None
        batch, in_flight = self._in_flight
        self._in_flight = None
        answered = in_flight.result()
        if answered.error is not None:
            delay_s = self._postgres.failed(f"request statement: {first_line(answered.error)}")
            self._next_try_at = self._monotonic() + delay_s
            self._waiting = batch + self._waiting  # tried again, first, in their order
            return
        self._postgres.ok()
        for run_id, exc in answered.isolated:
            self._executor.isolated("request", run_id, exc)
        now_ms = self._wall_ms()
        for (request, record), answer in zip(batch, answered.answers, strict=True):
            try:
                self._faults.hit(Point.REQUEST_PLAN, request.run_id)
                plan = request_plan(record, request.run_id, answer, now_ms, self._rules)
            except Exception as exc:  # this request's alone: its record is a dead letter
                self._executor.isolated("request", request.run_id, exc)
                reason = DeadLetterReason.UNEXPECTED_ERROR
                plan = reject(record, reason, describe(exc), self._rules)
            self._executor.carry_out_now(record, plan)

    def close(self) -> None:
        """At the end: a statement still in flight is abandoned (its records are redone)."""
        if self._in_flight is None:
            self._close()
