"""Units of work and their effects: what a run's records are waiting for, and the records a
tick produces (wakeups, step tasks, dead letters), each acknowledged before the work is done.

A ``RunWork`` holds the coalesced records of one run. It is *done* once its outcome is decided
and every record it produced was acknowledged by the broker; then its records' offsets may be
stored and its consumer span ends with the outcome.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError
from opentelemetry.trace import Span

from processor.core.dead_letters import dead_letter_headers
from processor.core.envelope import Wakeup
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import Outcome
from processor.core.records import Headers, Inbound
from processor.core.routing import TopicNames
from processor.core.stats import Stats
from processor.io.kafka import Outbox, choose_partition
from processor.io.telemetry import Telemetry, end_ok, log_ids

log = logging.getLogger("ductor.effects")


@dataclass
class RunWork:
    """Everything waiting for one run: coalesced records and the in-process attempt count."""

    run_id: str
    records: list[Inbound] = field(default_factory=list)
    attempts: int = 0
    ready_at: float = 0.0  # monotonic seconds
    outstanding: int = 0  # effects produced and not yet acknowledged
    outcome: str = Outcome.NOOP
    span: Span | None = None  # the CONSUMER span, open until the work is done

    def lineage(self) -> Wakeup:
        """The envelope whose requeue history this work continues: the most requeued one."""
        wakeups = [r.wakeup for r in self.records if r.wakeup is not None]
        return max(wakeups, key=lambda w: (w.requeue_count, w.attempt))


class Effects:
    def __init__(
        self,
        *,
        outbox: Outbox,
        names: TopicNames,
        partitions: dict[str, int],
        partition_by_run: bool,
        tracker: OffsetTracker,
        stats: Stats,
        telemetry: Telemetry,
    ) -> None:
        self._outbox = outbox
        self._names = names
        self._partitions = partitions
        self._partition_by_run = partition_by_run
        self._tracker = tracker
        self._stats = stats
        self.telemetry = telemetry

    def started(self, record: Inbound) -> None:
        """A record entered processing: its offset is held back until it is done."""
        self._tracker.started(record.tp, record.offset)

    def start_span(self, work: RunWork) -> None:
        """Open the work's CONSUMER span (when tracing) from its records' producer contexts."""
        if work.span is not None or not self.telemetry.tracing or not work.records:
            return
        records = [(r.tp[0], r.tp[1], r.offset, r.key, r.headers) for r in work.records]
        work.span = self.telemetry.start_consumer_span(work.records[0].tp[0], records, work.run_id)

    def send_wakeup(self, work: RunWork, topic: str, wakeup: Wakeup) -> None:
        partition = choose_partition(work.run_id, self._partitions[topic], self._partition_by_run)
        attributes = {
            "ductor.requeue_count": wakeup.requeue_count,
            "ductor.attempt": wakeup.attempt,
            "messaging.kafka.message.key": wakeup.key().decode(),
        }
        self.send(work, topic, wakeup.encode(), wakeup.key(), partition, attributes=attributes)

    def send(
        self,
        work: RunWork,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        partition: int | None = None,
        headers: Headers | None = None,
        attributes: dict[str, Any] | None = None,
    ) -> None:
        """Produce one effect of ``work``; the work waits for its acknowledgement."""
        span: Span | None = None
        all_headers = list(headers or [])
        if self.telemetry.tracing:
            span, trace_headers = self.telemetry.start_producer_span(
                work.span, topic, attributes or {}
            )
            all_headers = [h for h in all_headers if h[0] not in ("traceparent", "tracestate")]
            all_headers += trace_headers
        work.outstanding += 1

        def delivered(err: KafkaError | None) -> None:
            if err is not None:
                # The idempotent producer already retried for message.timeout.ms: the broker
                # is away. Keep trying; the records' offsets stay unstored meanwhile.
                self._stats.errors["produce"] += 1
                log.error("effect not delivered to %s, retrying: %s", topic, err)
                self._outbox.send(topic, value, key, delivered, partition, all_headers)
                return
            if span is not None:
                span.end()
            work.outstanding -= 1
            self.settle(work)

        self._outbox.send(topic, value, key, delivered, partition, all_headers)

    def dead_letter(self, work: RunWork, reason: str, detail: str) -> None:
        """Send every record of ``work`` to the dead-letter topic with its original key, value
        and headers, plus the reason and where it came from; then the work is done."""
        for record in work.records:
            headers = dead_letter_headers(
                record.headers, reason, detail, record.tp[0], record.tp[1], record.offset
            )
            self._stats.dead_letters[reason] += 1
            log.warning(
                "dead-lettered a record",
                extra={
                    "reason": reason,
                    "detail": detail,
                    "topic": record.tp[0],
                    "offset": record.offset,
                    **log_ids(work.span),
                },
            )
            self.send(
                work,
                self._names.dlq,
                record.value,  # a tombstone stays a tombstone
                record.key,
                None,
                headers,
                {"ductor.reason": reason},
            )
        self._stats.ticks[Outcome.DEAD_LETTERED] += 1
        work.outcome = Outcome.DEAD_LETTERED
        self.settle(work)

    def settle(self, work: RunWork) -> None:
        if work.outstanding == 0:
            self.complete(work, work.outcome)

    def complete(self, work: RunWork, outcome: str) -> None:
        """The work is done: its records may be stored; its span ends with the outcome."""
        for record in work.records:
            self._tracker.done(record.tp, record.offset)
        work.records = []
        if work.span is not None:
            attributes: dict[str, Any] = {"attempts": work.attempts}
            end_ok(work.span, outcome, **attributes)
            work.span = None

    def poll(self) -> None:
        self._outbox.poll(0)
