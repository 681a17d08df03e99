"""Steps 4 and 5 of the commit path (engine/executor.py): a plan's records handed to the
producer, each on its partition and with its trace context, and the work settled once the
broker acknowledged every one of them.

``Settling`` is one plan's count of records still on their way; ``Producing`` sends one record
of it. An outbox row's record the broker refuses for good parks the row (io/delivery.py): the
row is kept, relayed by no one until unparked, and the record counts as settled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from opentelemetry.trace import Span

from processor.core.outcomes import Outcome
from processor.core.pending import RunWork
from processor.core.plans import Send
from processor.core.stats import Stats
from processor.io.delivery import Delivery, Refusal
from processor.io.kafka import choose_partition
from processor.io.telemetry import Telemetry, context_headers

log = logging.getLogger("ductor.executor")

Work = RunWork[Span]


class Settling:
    """A work whose plan settles once ``outstanding`` records are acknowledged: its bound
    ``delivered`` is what each of them calls back (one object per plan, no closures)."""

    __slots__ = (
        "_park",
        "_settled",
        "held",
        "outboxed_seq",
        "outcome",
        "outstanding",
        "parked",
        "work",
    )

    def __init__(
        self,
        work: Work,
        outcome: Outcome,
        outstanding: int,
        outboxed_seq: int | None,  # its outbox row, deleted once everything is acknowledged
        settled: Callable[[Settling], None],
        park: Callable[[Settling], None],
    ) -> None:
        self.work = work
        self.outcome = outcome
        self.outstanding = outstanding
        self.outboxed_seq = outboxed_seq
        self._settled = settled
        self._park = park
        self.held = 0  # records of the work counted as waiting for the broker meanwhile
        self.parked: Refusal | None = None  # why its outbox row is parked

    def delivered(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0:
            self._settled(self)

    def refused(self, why: Refusal) -> None:
        """The broker refuses one of its records for good: its outbox row is parked (kept,
        relayed by no one until unparked), and the record counts as settled."""
        if self.parked is None:
            self.parked = why
            self._park(self)
        self.delivered()


def _ending(span: Span, delivered: Callable[[], None]) -> Callable[[], None]:
    """``delivered``, ending a relayed record's own PRODUCER span first."""

    def end_then_deliver() -> None:
        span.end()
        delivered()

    return end_then_deliver


class Parked:
    """Outbox rows whose record the broker refuses for good: logged, counted, and kept for
    the watchdog to mark parked."""

    def __init__(self, stats: Stats) -> None:
        self._stats = stats
        self._rows: list[tuple[str, int, str]] = []  # (run id, seq, why)

    def park(self, settling: Settling) -> None:
        run_id, seq, refusal = settling.work.run_id, settling.outboxed_seq, settling.parked
        assert seq is not None and refusal is not None
        why = refusal.reason
        self._stats.parked[refusal.error] += 1
        log.error(
            "parked the outbox row of run %s (transition %d): %s; it is kept, and sent again"
            " once unparked (`ductor outbox unpark`)",
            run_id,
            seq,
            why,
            extra={"run_id": run_id, "seq": seq, "reason": why},
        )
        self._rows.append((run_id, seq, why))

    def take(self) -> list[tuple[str, int, str]]:
        rows, self._rows = self._rows, []
        return rows


class Producing:
    """Hands one record of a settling plan to the producer (4. produce; 5. its delivery
    report calls the settling back)."""

    def __init__(
        self,
        delivery: Delivery,
        partitions: Mapping[str, int],  # filled by the processor once the topics are known
        partition_by_run: bool,
        telemetry: Telemetry,
    ) -> None:
        self._delivery = delivery
        self._partitions = partitions
        self._partition_by_run = partition_by_run
        self._telemetry = telemetry

    def produce(self, settling: Settling, send: Send) -> None:
        work = settling.work
        partition: int | None = None
        if send.by_run is not None:
            count = self._partitions[send.topic]
            partition = choose_partition(send.by_run, count, self._partition_by_run)
        headers = list(send.headers)
        on_delivered = settling.delivered
        if self._telemetry.tracing:
            if work.span is None:  # a relayed record: its own PRODUCER span starts a trace
                span, trace_headers = self._telemetry.start_producer_span(
                    None, send.topic, dict(send.attributes)
                )
                on_delivered = _ending(span, settling.delivered)
            else:
                # The record carries the CONSUMER span's context (its parent downstream); a
                # sampled one notes the send as an event: a tick costs one span, not two.
                if work.span.is_recording():
                    self._telemetry.note_send(work.span, send.topic, send.attributes)
                trace_headers = context_headers(work.span)
            headers = [h for h in headers if h[0] not in ("traceparent", "tracestate")]
            headers += trace_headers
        # An outbox row's record the broker refuses for good is parked (io/delivery.py).
        refused = settling.refused if settling.outboxed_seq is not None else None
        self._delivery.send(
            send.topic, send.value, send.key, partition, headers, on_delivered, refused
        )


__all__ = ["Parked", "Producing", "Settling", "Work"]
