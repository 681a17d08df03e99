"""A service's start waits out a dependency that does not answer (io/runtime/outage.py's
``until_available``): tried again after the outage's backoff, one line when the outage starts
and one when it ends, the caller's turn kept going meanwhile, a stop honoured, and any failure
that is not an outage raised. What an outage is, the classifiers of each dependency say."""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException
from psycopg import errors

from processor.io.kafka.clients import broker_unreachable
from processor.io.kafka.errors import MissingTopic
from processor.io.postgres.db_errors import database_unreachable
from processor.io.runtime.outage import Outage, until_available

_LOG = logging.getLogger("test.start")


class Attempts:
    """Fails with each of ``failures`` in turn, then succeeds."""

    def __init__(self, *failures: Exception) -> None:
        self.failures = list(failures)
        self.made = 0

    def __call__(self) -> None:
        self.made += 1
        if self.failures:
            raise self.failures.pop(0)


def _transport() -> KafkaException:
    return KafkaException(KafkaError(KafkaError._TRANSPORT, "Failed to get metadata"))


def test_the_start_waits_out_an_outage_in_one_pair_of_lines(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="test.start")
    attempt = Attempts(_transport(), _transport())
    turns: list[int] = []
    outage = Outage("kafka", _LOG)
    available = until_available(
        outage, attempt, broker_unreachable, threading.Event(), lambda: turns.append(attempt.made)
    )
    assert available and attempt.made == 3 and not outage.active and outage.count == 1
    assert [r.__dict__["outage"] for r in caplog.records] == ["started", "ended"]
    assert caplog.records[0].__dict__["problem"] == "Failed to get metadata"
    assert caplog.records[1].__dict__["failures"] == 2
    # Turns before each try and during the backoff (0.1 s, then 0.2 s), not only at the tries.
    assert len(turns) > attempt.made and turns[0] == 0


def test_a_failure_that_is_no_outage_is_raised_at_once() -> None:
    missing = MissingTopic("topic t does not exist")
    attempt = Attempts(_transport(), missing)
    with pytest.raises(MissingTopic):
        until_available(
            Outage("kafka", _LOG), attempt, broker_unreachable, threading.Event(), lambda: None
        )
    assert attempt.made == 2


def test_a_stop_ends_the_wait() -> None:
    stop = threading.Event()
    attempt = Attempts(*[_transport()] * 100)
    outage = Outage("kafka", _LOG)

    def turn() -> None:
        if attempt.made == 2:
            stop.set()  # as SIGTERM would, during the second backoff

    assert not until_available(outage, attempt, broker_unreachable, stop, turn)
    assert attempt.made == 2 and outage.active
    # Stopped before: not even one try.
    assert not until_available(outage, attempt, broker_unreachable, stop, lambda: None)
    assert attempt.made == 2


@pytest.mark.parametrize(
    ("exc", "outage"),
    [
        (_transport(), True),
        (KafkaException(KafkaError(KafkaError._TIMED_OUT, "Timed out")), True),
        (TimeoutError(), True),  # an admin request's future without an answer
        # The broker answered: a refusal, not an outage.
        (KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)), False),
        (MissingTopic("topic t does not exist"), False),
        (ValueError("a bug"), False),
    ],
)
def test_an_unreachable_broker_is_an_outage(exc: Exception, outage: bool) -> None:
    assert (broker_unreachable(exc) is not None) is outage


@pytest.mark.parametrize(
    ("exc", "outage"),
    [
        (psycopg.OperationalError("connection failed: Connection refused"), True),
        (errors.AdminShutdown("terminating connection due to administrator command"), True),
        (errors.UndefinedTable('relation "eec_instance" does not exist'), False),
        (KafkaException(KafkaError(KafkaError._TRANSPORT)), False),
    ],
)
def test_an_unreachable_database_is_an_outage(exc: Exception, outage: bool) -> None:
    problem = database_unreachable(exc)
    assert (problem is not None) is outage
    if problem is not None:
        assert problem == str(exc).splitlines()[0]
