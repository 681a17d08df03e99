"""Each record the processor consumes, judged (core/intake.py) and sent where it goes: a
wakeup to its tier's queue (engine/pace.py feeds them to the executor), a request to the
request desk, a hop along the delay ladder or a dead letter straight to the executor, a
not-due head of a delay partition held until it is due (engine/flow_control.py). A record
that raises what nobody foresaw is dead-lettered alone; the loop goes on.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

from confluent_kafka import KafkaError

from processor.core.decide import hop, reject
from processor.core.flow import TierQueues
from processor.core.intake import (
    Accepted,
    Hop,
    NotDue,
    RecordVerdict,
    Reject,
    Requested,
    Skipped,
    admit,
)
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import DeadLetterReason
from processor.core.plans import Rules
from processor.core.records import Inbound, KafkaMessage, MessageError, normalise_headers
from processor.core.routing import TopicNames
from processor.core.scopes import Scope
from processor.core.stats import Stats
from processor.engine.executor import Executor
from processor.engine.flow_control import FlowControl
from processor.engine.request_desk import RequestDesk
from processor.engine.trigger_follow import TriggerFollower
from processor.io.kafka.clients import ClientErrors
from processor.io.runtime.clock import Clock
from processor.io.runtime.faults import Faults, Point
from processor.io.telemetry.logs import describe

log = logging.getLogger("ductor.processor")


class RecordIntake:
    def __init__(
        self,
        *,
        names: TopicNames,
        max_record_bytes: int,
        scope: Scope,
        rules: Rules,
        clock: Clock,
        db_now_ms: Callable[[], int],  # Postgres's clock (io/postgres/db_clock.py)
        tracker: OffsetTracker,
        queues: TierQueues[Inbound],
        executor: Executor,
        requests: RequestDesk,
        triggers: TriggerFollower,
        flow: Callable[[], FlowControl],  # the current member's (a new member has its own)
        client_errors: ClientErrors,
        stats: Stats,
        faults: Faults,
    ) -> None:
        self._names = names
        self._max_record_bytes = max_record_bytes
        self._scope = scope
        self._rules = rules
        self._monotonic = clock.monotonic
        self._db_now_ms = db_now_ms
        self._tracker = tracker
        self._queues = queues
        self._executor = executor
        self._requests = requests
        self._triggers = triggers
        self._flow = flow
        self._client_errors = client_errors
        self._stats = stats
        self._faults = faults
        self._intake_fault = faults.at(Point.INTAKE)  # (asked per record: a bool)

    def use_rules(self, rules: Rules) -> None:
        """Rules learnt once the broker answered (the dead-letter topic's size limit)."""
        self._rules = rules

    def take(self, message: KafkaMessage) -> None:
        """One record taken in; an exception nobody foresaw is the record's alone."""
        try:
            self._take(message)
        except Exception as exc:  # the record's alone: never the loop's
            self._failed(message, exc)

    def _take(self, message: KafkaMessage) -> None:
        error = message.error()
        if error is not None:
            self._client_error(error)
            return
        topic, partition = message.topic(), message.partition()
        assert topic is not None and partition is not None
        tp = (topic, partition)
        offset = message.offset()
        if offset is not None and self._tracker.done_before(tp, offset):
            # Its previous owner did it (a dead letter sent, a tick committed) and committed
            # an offset below it: not done twice (core/offsets.py).
            self._stats.done_before += 1
            return
        if self._flow().waits_for_due_head(tp):
            return  # prefetched behind a not-due head: it will be read again after the resume
        if self._triggers.is_source(topic):
            self._take_trigger(message)
            return
        now_ms = self._db_now_ms()
        verdict = admit(message, self._names, self._max_record_bytes, now_ms, self._scope)
        if isinstance(verdict, NotDue):
            flow = self._flow()
            flow.hold_until_due(tp, verdict.record.offset, self._monotonic(), verdict.wait_ms)
            return
        self._taken(verdict, now_ms)

    def _client_error(self, error: MessageError) -> None:
        if error.code() == KafkaError._FATAL:  # the consumer's own, reported so
            self._client_errors.failed(str(error))
        elif error.code() != KafkaError._PARTITION_EOF:
            self._stats.errors["consume"] += 1
            log.error("consumer error: %s", error)

    def _taken(self, verdict: RecordVerdict, now_ms: int) -> None:
        """From here the record is taken: its offset is held back until it is done."""
        record = verdict.record
        self._tracker.started(record.tp, record.offset)
        if self._intake_fault:
            self._faults.hit(Point.INTAKE, _run_id_of(verdict))
        if isinstance(verdict, Reject):
            plan = reject(record, verdict.reason, verdict.detail, self._rules)
            self._executor.carry_out_now(record, plan)
            return
        self._stats.records += 1
        if isinstance(verdict, Requested):
            self._requests.add(record, verdict.request)
            return
        if isinstance(verdict, Hop):
            plan = hop(record, verdict.target_ms, now_ms, self._names)
            self._executor.carry_out_now(record, plan, traced=False)
            return
        assert isinstance(verdict, Accepted)
        self._queues.push(record.tier, record)

    def _failed(self, message: KafkaMessage, exc: Exception) -> None:
        """Taking a record in raised what nobody foresaw: the record is taken (if it was not
        yet) and dead-lettered with why, so its offset passes and the loop goes on."""
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        self._executor.isolated("intake", f"{topic}[{partition}]@{offset}", exc)
        if topic is None or partition is None or offset is None:
            return  # not a record (the consumer's own event): nothing to take
        record = Inbound((topic, partition), offset, message.key(), message.value(), [], "")
        with contextlib.suppress(Exception):  # (else the dead letter goes without them)
            record.headers = normalise_headers(message)
        self._tracker.started(record.tp, offset)
        plan = reject(record, DeadLetterReason.UNEXPECTED_ERROR, describe(exc), self._rules)
        self._executor.carry_out_now(record, plan)

    def _take_trigger(self, message: KafkaMessage) -> None:
        verdict = self._triggers.admit(message)
        if verdict is None:
            return
        record = verdict.record
        self._tracker.started(record.tp, record.offset)
        if isinstance(verdict, Requested):
            self._requests.add(record, verdict.request)
        elif isinstance(verdict, Skipped):
            self._tracker.done(record.tp, record.offset)  # nothing to do: done at once
        else:
            plan = reject(record, verdict.reason, verdict.detail, self._rules)
            self._executor.carry_out_now(record, plan)


def _run_id_of(verdict: RecordVerdict) -> str:
    """The run a record taken in names, for the intake's fault point ("": none known)."""
    if isinstance(verdict, Requested):
        return verdict.request.run_id
    wakeup = verdict.record.wakeup
    return "" if wakeup is None else wakeup.run_id


__all__ = ["RecordIntake"]
