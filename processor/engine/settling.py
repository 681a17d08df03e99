"""Steps 4 to 6 of the commit path (engine/executor.py): a plan's records handed to the
producer, each on its partition and with its trace context, and the work settled once the
broker acknowledged every one of them (``Settler``).

``Settling`` is one plan's count of records still on their way; ``Producing`` sends one record
of it. An outbox row's record the broker refuses for good parks the row (io/kafka/delivery.py): the
row is kept, relayed by no one until unparked, and the record counts as settled.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from opentelemetry.trace import Span

from processor.core.offsets import OffsetTracker
from processor.core.outcomes import Outcome
from processor.core.pending import RunWork
from processor.core.plans import Send
from processor.core.stats import Stats
from processor.engine.acknowledged import Acknowledged
from processor.engine.ledger import Ledger
from processor.io.kafka.clients import choose_partition
from processor.io.kafka.delivery import BrokerRefusal, Delivery
from processor.io.runtime.faults import Faults, Point
from processor.io.telemetry.setup import Telemetry
from processor.io.telemetry.spans import context_headers

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
        self.parked: BrokerRefusal | None = None  # why its outbox row is parked

    def delivered(self) -> None:
        self.outstanding -= 1
        if self.outstanding == 0:
            self._settled(self)

    def refused(self, why: BrokerRefusal) -> None:
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
        # An outbox row's record the broker refuses for good is parked (io/kafka/delivery.py).
        refused = settling.refused if settling.outboxed_seq is not None else None
        self._delivery.send(
            send.topic, send.value, send.key, partition, headers, on_delivered, refused
        )


class Settler:
    """Steps 4 to 6 for a plan that settles: its records produced, and once the broker
    acknowledged them all its outbox row due for deletion, its records' offsets free to be
    stored, its span ended."""

    def __init__(
        self,
        producing: Producing,
        acknowledged: Acknowledged,
        tracker: OffsetTracker,
        ledger: Ledger,
        stats: Stats,
        faults: Faults,
    ) -> None:
        self._producing = producing
        self._acknowledged = acknowledged
        self._tracker = tracker
        self._ledger = ledger
        self._faults = faults
        self._parked = Parked(stats)
        # Records whose plans wait for the broker to acknowledge their effects (taken off the
        # book, not done yet): while the broker is away they pile up here.
        self.unacknowledged_records = 0

    def carry_out(
        self, work: Work, outcome: Outcome, sends: tuple[Send, ...], seq: int | None
    ) -> None:
        settling = Settling(work, outcome, len(sends), seq, self._settled, self._parked.park)
        for send in sends:
            self._producing.produce(settling, send)  # 4. produce; 5. acknowledged: delivered
        if settling.outstanding == 0:
            self._settled(settling)
        else:  # its records wait for the broker: they count against the intake's bound
            settling.held = len(work.records)
            self.unacknowledged_records += settling.held

    def send_outboxed(self, rows: list[tuple[str, int, tuple[Send, ...]]]) -> None:
        """Send the records of outbox rows (run id, seq, records): relayed ones, or those a
        force-fail of the watchdog's wrote; each row is deleted once all its records are in."""
        for run_id, seq, sends in rows:
            work: Work = RunWork(run_id)
            committed = Outcome.COMMITTED
            settling = Settling(work, committed, len(sends), seq, self._settled, self._parked.park)
            try:
                for send in sends:
                    self._producing.produce(settling, send)
            except Exception as exc:  # the row stays claimed: relayed again once we are gone
                self._ledger.isolated("sweep", run_id, exc)
                continue
            if settling.outstanding == 0:
                self._settled(settling)

    def take_parked(self) -> list[tuple[str, int, str]]:
        """Outbox rows to mark parked (the watchdog writes them)."""
        return self._parked.take()

    def _settled(self, settling: Settling) -> None:
        self.unacknowledged_records -= settling.held
        settling.held = 0
        if settling.outboxed_seq is not None and settling.parked is None:
            self._acknowledged.add([(settling.work.run_id, settling.outboxed_seq)])
        if settling.outcome is Outcome.DEAD_LETTERED:
            self._faults.hit(Point.DEAD_LETTERED, settling.work.run_id)
        self.finish(settling.work, settling.outcome)

    def finish(self, work: Work, outcome: Outcome) -> None:
        """6. The work is done: its records' offsets may be stored; its span ends."""
        for record in work.records:
            self._tracker.done(record.tp, record.offset)
        work.records = []
        self._ledger.end_span(work, outcome)


__all__ = ["Parked", "Producing", "Settler", "Settling", "Work"]
