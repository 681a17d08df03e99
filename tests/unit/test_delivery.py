"""Delivery (io/kafka/delivery.py): a record the broker refuses is sent again after a backoff of its
own; one refused for good PARK_AFTER times in a row is handed to its ``on_refused`` (the
executor parks its outbox row) and not sent again; a record without one keeps trying."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError

from processor.io.kafka.clients import ClientErrors
from processor.io.kafka.delivery import PARK_AFTER, BrokerRefusal, Delivery

Report = Callable[[KafkaError | None], None]


class FakePublisher:
    """Takes records; the test answers each send's delivery report."""

    def __init__(self) -> None:
        self.sent: list[Report] = []  # sent, not answered yet
        self.sends = 0

    def send(self, topic: str, value: Any, key: Any, report: Report, *rest: Any) -> None:
        self.sent.append(report)
        self.sends += 1


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _deliver_and_refuse(
    refusal: KafkaError, on_refused: Callable[[BrokerRefusal], None] | None, rounds: int
) -> tuple[FakePublisher, list[str]]:
    publisher, clock, errors = FakePublisher(), Clock(), Counter[str]()
    delivery = Delivery(publisher, errors, clock)  # type: ignore[arg-type]
    delivered: list[str] = []
    delivery.send("steps", b"v", b"k", None, [], lambda: delivered.append("ok"), on_refused)
    for _ in range(rounds):
        if not publisher.sent:
            clock.now += 10.0
            delivery.send_due(clock.now)
            if not publisher.sent:
                break
        publisher.sent.pop()(refusal)
    return publisher, delivered


def test_a_record_refused_for_good_is_handed_over_after_park_after_refusals() -> None:
    why: list[BrokerRefusal] = []
    publisher, delivered = _deliver_and_refuse(
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), why.append, rounds=PARK_AFTER + 3
    )
    assert len(why) == 1 and why[0].error == "MSG_SIZE_TOO_LARGE"
    assert why[0].reason.startswith("MSG_SIZE_TOO_LARGE: the broker refuses it for steps")
    assert publisher.sends == PARK_AFTER and not delivered  # not sent again, nor delivered


def test_without_a_keeper_it_keeps_trying() -> None:
    publisher, _ = _deliver_and_refuse(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None, 10)
    assert publisher.sends == 10


def test_a_broker_away_never_parks() -> None:
    why: list[BrokerRefusal] = []
    publisher, _ = _deliver_and_refuse(KafkaError(KafkaError._MSG_TIMED_OUT), why.append, 10)
    assert why == [] and publisher.sends == 10


def test_a_fatal_client_error_stops_the_service_once_and_others_do_not() -> None:
    stops: list[str] = []
    errors = ClientErrors(lambda: stops.append("stop"))
    errors(KafkaError(KafkaError._ALL_BROKERS_DOWN))  # retried by librdkafka itself
    assert errors.fatal is None and stops == []
    errors(KafkaError(KafkaError._FENCED, "fenced", fatal=True))
    errors.failed("and another")
    assert errors.fatal is not None and "fenced" in errors.fatal and stops == ["stop"]


class RaisingPublisher(FakePublisher):
    """A client that raises what nobody foresaw on every send (a ValueError for one record)."""

    def send(self, topic: str, value: Any, key: Any, report: Report, *rest: Any) -> None:
        self.sends += 1
        raise ValueError("a record the client cannot take")


def test_a_send_that_raises_what_nobody_foresaw_is_a_refusal_never_the_loops() -> None:
    """It is counted and retried after its backoff like a refusal for good, and an publisher
    row's record is handed to its on_refused (parked) after PARK_AFTER of them: the caller
    (the loop) never sees the exception."""
    publisher, clock, errors = RaisingPublisher(), Clock(), Counter[str]()
    delivery = Delivery(publisher, errors, clock)  # type: ignore[arg-type]
    why: list[BrokerRefusal] = []
    delivered: list[str] = []
    delivery.send("steps", b"v", b"k", None, [], lambda: delivered.append("ok"), why.append)
    for _ in range(PARK_AFTER + 2):
        clock.now += 10.0
        delivery.send_due(clock.now)
    assert publisher.sends == PARK_AFTER and errors["produce_permanent"] == PARK_AFTER
    assert len(why) == 1 and "ValueError: a record the client cannot take" in why[0].reason
    assert delivered == []  # (its on_refused settles its work: the executor's parking)
