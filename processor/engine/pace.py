"""When the processor's loop does what, on the injected clock (io/runtime/clock.py): how long a turn
blocks in poll, how many ready records go to the executor, when consumption pauses for
back-pressure, and when the stats line is due. A unit test drives it with a ManualClock.

The loop never sleeps on a delay: a delay partition whose head is not due is paused (and the
record sought back) until its due time, a conflicted run waits in the executor's book with a
ready time, and the consume timeout is the time to the next of those events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from confluent_kafka import Consumer, Message

from processor.core.flow import TierQueues
from processor.core.records import Inbound
from processor.core.routing import TIERS
from processor.engine.executor import Executor
from processor.engine.flow_control import FlowControl
from processor.engine.request_desk import RequestDesk
from processor.engine.sweeps import Sweeps
from processor.io.kafka.delivery import Delivery
from processor.io.runtime.clock import Clock

# While a batch is in flight and nothing is left to take, the loop waits this long for it at
# most before its next turn (delivery reports, sweeps, new records): a short wait that ends
# when the batch does, instead of a spin that took the GIL from the batch's own thread.
BUSY_WAIT_S = 0.005
IDLE_POLL_S = 0.1
# While records are on their way to the broker, their delivery reports wait for this loop.
DELIVERY_WAIT_S = 0.005


class Sending(Protocol):
    """The producer as the loop's pace sees it (io/kafka/clients.Publisher)."""

    @property
    def in_flight(self) -> int:
        """Records and client events waiting for the loop's poll."""
        ...

    def flush(self, timeout: float) -> int:
        """Send what is queued now and wait for its reports, ``timeout`` at most."""
        ...


class Pace:
    def __init__(
        self,
        *,
        clock: Clock,
        batch_size: int,
        batch_linger_ms: int,
        buffer_limit: int,  # DUCTOR_TIER_BUFFER_LIMIT: records held before a source pauses
        stats_every_s: float,
        queues: TierQueues[Inbound],
        executor: Executor,
        requests: RequestDesk,
        sweeps: Sweeps,
        publisher: Sending,
        delivery: Delivery,
        flow: Callable[[], FlowControl],  # the current member's (a new member has its own)
    ) -> None:
        self._clock = clock
        self._batch = batch_size
        self._linger_s = batch_linger_ms / 1000
        self._limit = buffer_limit
        self._stats_every_s = stats_every_s
        self._queues = queues
        self._executor = executor
        self._requests = requests
        self._sweeps = sweeps
        self._publisher = publisher
        self._delivery = delivery
        self._flow = flow
        self._next_stats = clock.monotonic() + stats_every_s

    def now(self) -> float:
        return self._clock.monotonic()

    def consume(self, consumer: Consumer) -> list[Message]:
        """What the turn takes: what is there; else, while a batch is in flight, nothing after
        a short wait for it; else the first record within the idle timeout and what follows
        it within the linger."""
        messages: list[Message] = consumer.consume(self._batch, 0)
        if messages:
            return messages
        if self._executor.busy:
            # Nothing to take: wait for the batch in flight rather than spin (the client keeps
            # fetching meanwhile); this returns the moment the batch is done.
            self._executor.wait_for_stage(BUSY_WAIT_S)
            return []
        timeout = self.idle_timeout()
        if timeout <= 0:
            return []
        if self._publisher.in_flight:
            # Nothing to take, records on their way: the producer's linger would hold them a
            # while for more to join their batch, and none will come while the loop waits.
            # Send them now (flush ignores the linger) and wait for their acknowledgements
            # here, as the loop would have waited for them in poll. Under load the loop never
            # gets here and the linger batches as before: a cork, not a timer.
            self._publisher.flush(timeout)
            return []
        first = consumer.poll(timeout)
        if first is None:
            return []
        rest: list[Message] = consumer.consume(self._batch - 1, self._linger_s)
        return [first, *rest]

    def idle_timeout(self) -> float:
        """How long the loop may block in poll: until the next due event, at most 100 ms."""
        now = self._clock.monotonic()
        if self._publisher.in_flight:
            return DELIVERY_WAIT_S  # delivery reports wait for this loop
        if len(self._queues) or self._executor.ready_count(now):
            return 0.0
        deadlines = [
            d
            for d in (
                self._executor.next_ready_at(),
                self._delivery.next_due_at(),
                self._flow().next_resume_at(),
                self._sweeps.next_at,
                self._requests.next_at(),
            )
            if d is not None
        ]
        until_next = min(deadlines, default=now + IDLE_POLL_S) - now
        return max(0.0, min(IDLE_POLL_S, until_next))

    def feed(self) -> None:
        """Ready records to the executor, up to a batch, by tier weight; then back-pressure:
        a source whose backlog (or the executor's waiting records) passed the limit pauses
        until it is down to half (engine/flow_control.py)."""
        room = self._batch - self._executor.ready_count(self._clock.monotonic())
        if room > 0:
            for record in self._queues.take(room):
                self._executor.add(record)
        backlog = {source: self._queues.size(source) for source in (*TIERS, "delay")}
        backlog["requests"] = backlog["trigger"] = len(self._requests)
        self._flow().apply_backpressure(backlog, self._executor.waiting_records, self._limit)

    def stats_due(self, now: float) -> bool:
        """Whether the stats line is due at ``now`` (every DUCTOR_STATS_LOG_INTERVAL_S)."""
        if now < self._next_stats:
            return False
        self._next_stats = now + self._stats_every_s
        return True


__all__ = ["BUSY_WAIT_S", "DELIVERY_WAIT_S", "IDLE_POLL_S", "Pace"]
