"""Getting the executor's records to the broker, whatever the broker is doing.

Each record is sent once and reported when the broker acknowledged it. A delivery that fails
(the idempotent producer already retried it for ``message.timeout.ms``) is sent again after
a backoff of its own (0.1 s doubling to 5 s), never at once: a broker that is away, or a
record it refuses for good (too large, not authorised), must not turn into a hot loop. A
refusal that retrying cannot cure is counted apart (``produce_permanent``) and logged each
time it is retried, so it is visible; the record's offset stays held, so nothing is lost or
skipped while someone fixes the cause. An outage is logged once when it starts and once when
it ends.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import time
from collections.abc import Callable

from confluent_kafka import KafkaError, KafkaException

from processor.core.backoff import retry_delay_s
from processor.core.records import Headers
from processor.core.stats import Stats
from processor.engine.outage import Outage
from processor.io.kafka import Outbox

log = logging.getLogger("ductor.delivery")


class Delivery:
    def __init__(
        self, outbox: Outbox, stats: Stats, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self._outbox = outbox
        self._stats = stats
        self._monotonic = monotonic
        self.outage = Outage("kafka", log)
        self._due: list[tuple[float, int, Callable[[], None]]] = []  # records to send again
        self._order = itertools.count()  # ties in the heap never compare the callables
        self._failed_at: float | None = None

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None,
        headers: Headers,
        on_delivered: Callable[[], None],
    ) -> None:
        """Send a record until the broker has it; then call ``on_delivered`` (once)."""
        failures = 0

        def delivered(err: KafkaError | None) -> None:
            nonlocal failures
            if err is None:
                self.outage.ok()
                on_delivered()
                return
            now = self._monotonic()
            self._failed_at = now
            delay = retry_delay_s(failures)
            failures += 1
            if err.retriable() or err.code() == KafkaError._MSG_TIMED_OUT:
                self._stats.errors["produce"] += 1
                self.outage.failed(f"a record to {topic} was not delivered: {err.str()}")
            else:
                self._stats.errors["produce_permanent"] += 1
                log.error(
                    "the broker refuses a record to %s: %s; trying again in %.1f s",
                    topic,
                    err.str(),
                    delay,
                    extra={"topic": topic, "error": err.name(), "failures": failures},
                )
            heapq.heappush(self._due, (now + delay, next(self._order), send))

        def send() -> None:
            try:
                self._outbox.send(topic, value, key, delivered, partition, headers)
            except KafkaException as exc:  # refused by the client itself (too large, say)
                delivered(exc.args[0])

        send()

    def send_due(self, now: float) -> None:
        """Send again the records whose backoff is over (called every loop turn)."""
        while self._due and self._due[0][0] <= now:
            _at, _order, send = heapq.heappop(self._due)
            send()

    def next_due_at(self) -> float | None:
        return self._due[0][0] if self._due else None

    def healthy_for(self, seconds: float) -> bool:
        """Whether no delivery failed in the last ``seconds``."""
        failed = self._failed_at
        return failed is None or self._monotonic() - failed > seconds
