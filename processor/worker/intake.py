"""How a polled record becomes a task in hand: decoded (or dead-lettered), skipped when the
task in hand covers it or no worker may take it any more, handed back when this worker has no
function for its type (handback.py), else added to the book to be claimed (claiming.py).

An exception nobody foresaw while taking a task in is that task's alone, never the loop's: it
is dead-lettered (``unexpected_error``), logged and counted (``ductor.worker.isolated``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

from processor.core.dead_letters import dead_letter_headers, truncate_dead_letter
from processor.core.outcomes import DeadLetterReason
from processor.core.records import TRACE_HEADERS, normalise_headers
from processor.core.shapes import TopicPartition
from processor.core.step_task import StepTask, decode_step_task
from processor.io.kafka.delivery import Delivery
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.runtime.clock import Clock
from processor.io.runtime.faults import Faults, Point
from processor.io.telemetry.logs import describe
from processor.worker.claiming import Claims
from processor.worker.handback import Foreign, Handback
from processor.worker.stats import WorkerStats
from processor.worker.steps import StepRegistry
from processor.worker.tasks import Task, TaskBook

log = logging.getLogger("ductor.worker")


class Intake:
    def __init__(
        self,
        *,
        book: TaskBook,
        claims: Claims,
        clock: Clock,
        db_clock: DatabaseClock,
        registry: StepRegistry,
        stats: WorkerStats,
        delivery: Delivery,
        dlq_topic: str,
        dlq_max_bytes: int,
        done_offset: Callable[[TopicPartition, int], None],
        faults: Faults,
    ) -> None:
        self._book = book
        self._claims = claims
        self._clock = clock
        self._db_clock = db_clock
        self._registry = registry
        self._stats = stats
        self._delivery = delivery
        self._dlq_topic = dlq_topic
        self._dlq_max_bytes = dlq_max_bytes
        self._done_offset = done_offset
        self._faults = faults
        # Tasks of types this worker has no function for (None: they run here, and fail).
        self.handback: Handback | None = None

    def intake(self, message: Message) -> None:
        """A tracked record becomes a task in hand (or a dead letter, or is skipped)."""
        tp = (message.topic() or "", message.partition() or 0)
        offset = message.offset() or 0
        try:
            # The task's trace context rides on to the wakeup, so one trace follows the run
            # through its step round trips.
            context = normalise_headers(message, TRACE_HEADERS)
            # The deadline is Postgres's time: from here on it is this process's (every
            # check of it, the step's own ``ctx.deadline_ms``, compares with this clock).
            step = decode_step_task(message.value(), self._db_clock.offset_ms)
        except Exception as exc:  # a poison task must never stop the worker
            self._dead_letter(message, tp, offset, exc)
            return
        try:
            self._take(message, tp, offset, context, step)
        except Exception as unforeseen:  # the task's alone: dead-lettered, never the loop's
            isolated(self._stats, "intake", step.run_id, unforeseen)
            held = self._book.get(step.key)
            if held is not None and held.tp == tp and held.offset == offset:
                self._book.remove(held)  # (its claim, if asked, finds it gone)
            self._dead_letter(message, tp, offset, unforeseen, DeadLetterReason.UNEXPECTED_ERROR)

    def _take(
        self,
        message: Message,
        tp: TopicPartition,
        offset: int,
        context: list[tuple[str, bytes]],
        step: StepTask,
    ) -> None:
        self._faults.hit(Point.TASK_INTAKE, step.run_id)
        if self._book.holds(step.key):
            self._skipped(tp, offset, "duplicate")  # the task in hand covers it
            return
        if too_late(step, self._clock.wall_ms()):
            self._skipped(tp, offset, "deadline")
            return
        kind, stamp = message.timestamp()
        produced = None if kind == TIMESTAMP_NOT_AVAILABLE else stamp
        if (
            self.handback is not None
            and self._registry.get(step.step_type, step.step_version) is None
        ):
            self.handback.take(message, tp, offset, step, context, produced)
            return
        self._claims.add(Task(step, tp, offset, context, produced))

    def run_here(self, foreign: Foreign) -> None:
        """A task of a type this worker has no function for, that no other worker can take
        (handback.py): it runs here, and fails as it always did."""
        if self._book.holds(foreign.step.key):
            self._skipped(foreign.tp, foreign.offset, "duplicate")
            return
        self._claims.add(
            Task(foreign.step, foreign.tp, foreign.offset, foreign.context, foreign.produced_ms)
        )

    def _skipped(self, tp: TopicPartition, offset: int, reason: str) -> None:
        self._stats.skipped[reason] += 1
        self._done_offset(tp, offset)

    def _dead_letter(
        self,
        message: Message,
        tp: TopicPartition,
        offset: int,
        exc: Exception,
        reason: DeadLetterReason = DeadLetterReason.WRONG_SCHEMA,
    ) -> None:
        """A task that cannot be run goes to the dead-letter topic with why and where from."""
        if reason is DeadLetterReason.WRONG_SCHEMA:
            detail = f"undecodable step task: {exc}"
        else:
            detail = describe(exc)
        try:
            own = normalise_headers(message)
        except Exception:
            own = []
        headers = dead_letter_headers(own, reason, detail, tp[0], tp[1], offset)
        value, headers = truncate_dead_letter(
            message.key(), message.value(), headers, self._dlq_max_bytes
        )
        log.error(
            "dead-lettered a step task",
            extra={"reason": reason.value, "detail": detail, "topic": tp[0], "offset": offset},
        )
        self._stats.dead_letters += 1
        self._delivery.send(
            self._dlq_topic,
            value,
            message.key(),
            None,
            headers,
            lambda: self._done_offset(tp, offset),
        )


def too_late(step: StepTask, wall_ms: int) -> bool:
    """Whether no worker may take the task any more (core/step_task.py): its schedule-to-start
    bound passed, or the deadline of a task from before start-to-close."""
    until = step.taken_until_ms()
    return until is not None and wall_ms >= until


def isolated(stats: WorkerStats, stage: str, run_id: str, exc: Exception) -> None:
    """An exception nobody foresaw, isolated to a task of run ``run_id``: counted, logged."""
    stats.isolated[stage] += 1
    log.error(
        "%s: an unexpected exception, isolated to a step task of run %s: %s",
        stage,
        run_id,
        describe(exc),
        exc_info=exc,
        extra={"stage": stage, "run_id": run_id},
    )
