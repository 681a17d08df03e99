"""The one classifier of Postgres errors: what a statement that met one wrote."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors

from processor.io.postgres.db_errors import TRANSIENT, Fault, classify, outcome_unknown


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        (errors.LockNotAvailable("canceling statement due to lock timeout"), Fault.LOCK_TIMEOUT),
        (errors.DeadlockDetected("deadlock detected"), Fault.DEADLOCK),
        (errors.QueryCanceled("canceling statement due to statement timeout"), Fault.CANCELLED),
        (errors.UntranslatableCharacter("\\u0000 cannot be converted"), Fault.ROW),
        (errors.ForeignKeyViolation("violates foreign key"), Fault.ROW),
        (psycopg.OperationalError("server closed the connection unexpectedly"), Fault.CONNECTION),
        (psycopg.InterfaceError("the connection is closed"), Fault.CONNECTION),
        (
            errors.AdminShutdown("terminating connection due to administrator command"),
            Fault.CONNECTION,
        ),
        (errors.ConnectionFailure("connection failure"), Fault.CONNECTION),
        (errors.UndefinedTable("relation does not exist"), Fault.REFUSED),
    ],
)
def test_each_error_says_what_the_statement_wrote(exc: psycopg.Error, fault: Fault) -> None:
    assert classify(exc) is fault
    # Only a connection that failed under a write leaves its outcome unknown.
    assert outcome_unknown(exc) is (fault is Fault.CONNECTION)


def test_lost_races_for_a_lock_or_time_are_transient_and_nothing_else_is() -> None:
    assert {Fault.LOCK_TIMEOUT, Fault.DEADLOCK, Fault.CANCELLED} == TRANSIENT
