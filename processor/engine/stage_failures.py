"""How the executor answers a database stage that failed, or whose commit lost its answer
(engine/executor.py): how long its runs wait before they are tried again, what is counted and
logged, and whether the database is taken for down (an outage, reported once while it lasts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg

from processor.core.backoff import retry_delay_s
from processor.core.batch_values import ReadBackResult
from processor.core.decide import retry_after
from processor.core.plans import Plan
from processor.core.stats import Stats
from processor.engine.ledger import Ledger
from processor.io.postgres.db_errors import TRANSIENT, classify
from processor.io.runtime.outage import Outage
from processor.io.telemetry.logs import first_line

log = logging.getLogger("ductor.executor")


class StageFailures:
    def __init__(
        self, stats: Stats, ledger: Ledger, outage: Outage, drop_connection: Callable[[], None]
    ) -> None:
        self._stats = stats
        self._ledger = ledger
        self._outage = outage  # shared with the watchdog's
        self._drop_connection = drop_connection
        self.database_ok = True  # False after a batch failed on a database error
        self._refused_streak = 0  # stages in a row that failed on a transient fault
        self._unknown_streak = 0  # stages in a row whose commit lost its connection

    def failed(self, exc: Exception, runs: int) -> int:
        """The database failed a stage: nothing was decided for these runs. A genuine error,
        counted every time; returns after how many ms to try again (the loop keeps running
        meanwhile). A statement that lost a lock or its time (a deadlock, a lock timeout, the
        statement timeout) is logged each time, and retried after a backoff that grows while
        it recurs; anything else is an outage of the database, logged once while it lasts.
        An exception nobody foresaw that is no run's own (the stage isolates every run's) is
        logged each time and retried after the same growing backoff."""
        self._stats.errors[type(exc).__name__] += 1
        if not isinstance(exc, psycopg.Error):
            self._ledger.isolated("tick", f"a batch of {runs} run(s), retried", exc)
            delay_s = retry_delay_s(self._refused_streak)
            self._refused_streak += 1
            return int(delay_s * 1000)
        fault = classify(exc)
        if fault in TRANSIENT:
            delay_s = retry_delay_s(self._refused_streak)
            self._refused_streak += 1
            log.error(
                "a batch of %d run(s) failed (%s): %s; retried in %.1f s",
                runs,
                fault.value,
                first_line(exc),
                delay_s,
                extra={"fault": fault.value, "runs": runs},
            )
            return int(delay_s * 1000)
        delay_s = self._outage.failed(f"{first_line(exc)} ({runs} run(s) will be retried)")
        self.database_ok = False
        self._drop_connection()
        return int(delay_s * 1000)

    def undecided(self) -> None:
        """A stage failed before its commit answered: no commit lost its answer."""
        self._unknown_streak = 0

    def back(self) -> None:
        self._refused_streak = 0
        self.database_ok = True
        self._outage.ok()

    def commit_answered(self, read_back: ReadBackResult | None, sent: int) -> None:
        """The commit answered (``read_back`` None), or its answer was lost with its
        connection and reading the rows back told which runs it moved (counted apart:
        neither a conflict nor a lost transition)."""
        if read_back is None:
            self._unknown_streak = 0
            return
        self._unknown_streak += 1
        not_landed = read_back.not_landed
        landed = sent - len(not_landed)
        self._stats.unknown_commits["landed"] += landed
        self._stats.unknown_commits["not_landed"] += len(not_landed)
        self._stats.errors[type(read_back.error).__name__] += 1
        log.warning(
            "the connection was lost during a commit; read back: %d run(s) landed, %d did not",
            landed,
            len(not_landed),
            extra={"landed": landed, "not_landed": len(not_landed)},
        )

    def not_landed(self, read_back: ReadBackResult, plans: list[Plan]) -> list[Plan]:
        """The runs a lost commit did not move are tried again at once the first time; when
        commits keep losing their connection, after the outage's growing backoff."""
        not_landed = read_back.not_landed
        if self._unknown_streak <= 1 or not not_landed:
            return plans
        retry_ms = int(retry_delay_s(self._unknown_streak - 2) * 1000)
        return [retry_after(p, retry_ms) if p.run_id in not_landed else p for p in plans]


__all__ = ["StageFailures"]
