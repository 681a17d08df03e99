"""What a Postgres error means for the statement that met it: the one classifier every caller
asks (the commit path, the watchdog, the worker's lanes), instead of deciding again.

Every statement here runs alone on an autocommit connection, so an error the server reports
(one with a SQLSTATE) means the statement was aborted and wrote nothing. Only a connection
that failed under it leaves the outcome unknown: the statement may have committed before the
answer was lost. psycopg raises one class per SQLSTATE, so the classes are caught by class
and code, never by message text.
"""

from __future__ import annotations

from enum import StrEnum

import psycopg
from psycopg import errors

from processor.io.telemetry.logs import first_line


class Fault(StrEnum):
    CONNECTION = "connection"  # the connection failed: a write's outcome is unknown
    LOCK_TIMEOUT = "lock_timeout"  # waited for a row lock past lock_timeout: wrote nothing
    DEADLOCK = "deadlock"  # aborted by Postgres to break a lock cycle: wrote nothing
    CANCELLED = "cancelled"  # statement_timeout (or an operator's cancel): wrote nothing
    ROW = "row"  # refused for what a row holds (bad text, a constraint): another row may pass
    REFUSED = "refused"  # any other refusal of the statement: wrote nothing


# SQLSTATE classes in which the server ends the session: the statement's fate is unknown.
# 08: connection exception; 57P: operator intervention (admin shutdown, crash shutdown).
_SESSION_ENDED = ("08", "57P")


def classify(exc: psycopg.Error) -> Fault:
    if isinstance(exc, errors.LockNotAvailable):
        return Fault.LOCK_TIMEOUT
    if isinstance(exc, errors.DeadlockDetected):
        return Fault.DEADLOCK
    if isinstance(exc, errors.QueryCanceled):
        return Fault.CANCELLED
    if isinstance(exc, psycopg.DataError | psycopg.IntegrityError):
        return Fault.ROW
    state = exc.sqlstate
    if state is None or state.startswith(_SESSION_ENDED) or isinstance(exc, psycopg.InterfaceError):
        return Fault.CONNECTION
    return Fault.REFUSED


def database_unreachable(exc: Exception) -> str | None:
    """What a failed connection or statement says, when it says the database cannot be
    reached (an outage to wait out: the server down, starting, refusing this client); None
    for any other failure. libpq reports every failure to connect without a SQLSTATE, so a
    wrong password is waited out too, saying so in the outage's line."""
    if isinstance(exc, psycopg.Error) and classify(exc) is Fault.CONNECTION:
        return first_line(exc)
    return None


def outcome_unknown(exc: psycopg.Error) -> bool:
    """Whether a write that met ``exc`` may have committed (the connection failed under it)."""
    return classify(exc) is Fault.CONNECTION


# Faults that say nothing about the database's health: one statement lost a race for a lock
# or its time; the same statement a moment later most likely goes through.
TRANSIENT = frozenset({Fault.LOCK_TIMEOUT, Fault.DEADLOCK, Fault.CANCELLED})


def item_fault(exc: Exception) -> bool:
    """Whether a failure met while handling a batch is one of its items' own, to be isolated
    by trying the items apart: a row the database refused for what it holds, or any exception
    that is not the database's at all (an encoding error, a bug met by what one item holds:
    nothing was written, the statement never went). Anything else is the database's: the
    batch is retried whole."""
    return not isinstance(exc, psycopg.Error) or classify(exc) is Fault.ROW
