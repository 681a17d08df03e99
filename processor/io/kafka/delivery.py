"""Getting the executor's records to the broker, whatever the broker is doing.

Each record is sent once and reported when the broker acknowledged it. A delivery that fails
(the idempotent producer already retried it for ``message.timeout.ms``) is sent again after
a backoff of its own (0.1 s doubling to 5 s), never at once: a broker that is away, or a
record it refuses for good (too large, not authorised), must not turn into a hot loop. A
refusal that retrying cannot cure is counted apart (``produce_permanent``) and logged each
time it is retried, so it is visible; the record's offset stays held, so nothing is lost or
skipped while someone fixes the cause. A record that can be kept elsewhere (an outbox row's,
which stays in Postgres) is given to its ``on_refused`` after ``PARK_AFTER`` such refusals
in a row, which parks it (engine/executor.py) instead of sending it again forever. An outage
is logged once when it starts and once when it ends.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable
from typing import NamedTuple, Protocol

from confluent_kafka import KafkaError, KafkaException

from processor.core.backoff import retry_delay_s
from processor.core.records import Headers
from processor.io.kafka.clients import DeliveryReport
from processor.io.runtime.outage import Outage

log = logging.getLogger("ductor.delivery")

# Refusals for good in a row after which a record with an ``on_refused`` is handed to it.
PARK_AFTER = 3


class Sender(Protocol):
    """Where records go: the producer (io/kafka/clients.py ``Publisher``), or a test's."""

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: DeliveryReport,
        partition: int | None = None,
        headers: Headers | None = None,
    ) -> None: ...


class BrokerRefusal(NamedTuple):
    """Why the broker refuses a record for good: its error's name (a metric label) and the
    sentence to log and keep."""

    error: str
    reason: str


class _Record:
    """One record on its way to the broker: what to send, what to call once it is there, and
    its failures so far. Its bound ``report`` is the client's delivery callback: one object
    per record, no closures."""

    __slots__ = (
        "delivery",
        "failures",
        "headers",
        "key",
        "on_delivered",
        "on_refused",
        "partition",
        "refusals",
        "topic",
        "value",
    )

    def __init__(
        self,
        delivery: Delivery,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        headers: Headers,
        on_delivered: Callable[[], None],
        on_refused: Callable[[BrokerRefusal], None] | None = None,
    ) -> None:
        self.delivery = delivery
        self.topic = topic
        self.value = value
        self.key = key
        self.partition = partition
        self.headers = headers
        self.on_delivered = on_delivered
        self.on_refused = on_refused
        self.failures = 0
        self.refusals = 0  # refusals for good in a row

    def report(self, err: KafkaError | None, _msg: object = None) -> None:
        if err is None:
            self.delivery.outage.ok()
            self.on_delivered()
        else:
            self.delivery.failed(self, err)


class Delivery:
    def __init__(
        self,
        publisher: Sender,
        errors: Counter[str],
        monotonic: Callable[[], float] = time.monotonic,
        outage: Outage | None = None,
    ) -> None:
        self._publisher = publisher
        self._errors = errors  # genuine failures by kind (the process's stats)
        self._monotonic = monotonic
        self.outage = outage or Outage("kafka", log)
        self._due: list[tuple[float, int, _Record]] = []  # records to send again
        self._order = itertools.count()  # ties in the heap never compare the records
        self._failed_at: float | None = None

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        headers: Headers,
        on_delivered: Callable[[], None],
        on_refused: Callable[[BrokerRefusal], None] | None = None,
    ) -> None:
        """Send a record until the broker has it; then call ``on_delivered`` (once). With
        ``on_refused``, a record the broker refuses for good ``PARK_AFTER`` times in a row is
        handed to it with why, and not sent again."""
        self._send(_Record(self, topic, value, key, partition, headers, on_delivered, on_refused))

    def _send(self, r: _Record) -> None:
        try:
            self._publisher.send(r.topic, r.value, r.key, r.report, r.partition, r.headers)
        except KafkaException as exc:  # refused by the client itself (too large, say)
            r.report(exc.args[0])
        except Exception as unforeseen:  # (a ValueError, a TypeError): never the loop's
            # A refusal for good, as the client's own would be: counted, logged, tried again
            # after its backoff (parked, for an outbox row's record), its offset held.
            why = f"{type(unforeseen).__name__}: {unforeseen}"
            r.report(KafkaError(KafkaError._INVALID_ARG, why))

    def failed(self, record: _Record, err: KafkaError) -> None:
        """A delivery that failed for good in the client: the record goes again after its
        backoff."""
        now = self._monotonic()
        self._failed_at = now
        delay = retry_delay_s(record.failures)
        record.failures = failures = record.failures + 1
        topic = record.topic
        if err.retriable() or err.code() == KafkaError._MSG_TIMED_OUT:
            record.refusals = 0
            self._errors["produce"] += 1
            self.outage.failed(f"a record to {topic} was not delivered: {err.str()}")
        else:
            self._errors["produce_permanent"] += 1
            record.refusals += 1
            if record.on_refused is not None and record.refusals >= PARK_AFTER:
                why = f"{err.name()}: the broker refuses it for {topic}: {err.str()}"
                record.on_refused(BrokerRefusal(err.name(), why))
                return
            log.error(
                "the broker refuses a record to %s: %s; trying again in %.1f s",
                topic,
                err.str(),
                delay,
                extra={"topic": topic, "error": err.name(), "failures": failures},
            )
        heapq.heappush(self._due, (now + delay, next(self._order), record))

    def send_due(self, now: float) -> None:
        """Send again the records whose backoff is over (called every loop turn)."""
        while self._due and self._due[0][0] <= now:
            _at, _order, record = heapq.heappop(self._due)
            self._send(record)

    def next_due_at(self) -> float | None:
        return self._due[0][0] if self._due else None

    def healthy_for(self, seconds: float) -> bool:
        """Whether no delivery failed in the last ``seconds``."""
        failed = self._failed_at
        return failed is None or self._monotonic() - failed > seconds
