"""Every plan the executor carries out is counted, traced and logged here, once.

The counters are ``Stats`` (read by the metrics, the stats log line, tests, demo and bench);
the spans are the work's CONSUMER span and its tries' events (io/telemetry/setup.py). A conflict
is counted and traced apart from errors: an event on the span, never an error status.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from opentelemetry.trace import Span

from processor.core.outcomes import DeadLetterReason, ForceFailReason, Outcome
from processor.core.pending import RunWork
from processor.core.plans import DeadLettered, ForceFailed, Plan, Requeue, payload_of
from processor.core.stats import Stats
from processor.io.telemetry.logs import describe, first_line
from processor.io.telemetry.setup import Telemetry
from processor.io.telemetry.spans import end_error, end_ok, log_ids

log = logging.getLogger("ductor.executor")

Work = RunWork[Span]

_ALSO_ERRORS = {
    DeadLetterReason.CHECKSUM_MISMATCH: "the row was changed out of band",
    DeadLetterReason.POISON: "a batched statement fails on this run: isolated from its batch",
}
Interval = tuple[int, int]  # start and end, epoch ns


class Ledger:
    def __init__(
        self,
        stats: Stats,
        telemetry: Telemetry,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self._stats = stats
        self._telemetry = telemetry
        self._wall_ms = wall_ms

    # -- counting ----------------------------------------------------------------------------

    def record(self, work: Work, plan: Plan) -> None:
        """Count the plan: the outcome of the tick's try, then the work's when it differs."""
        stats = self._stats
        if plan.tick_outcome is not None:
            stats.ticks[plan.tick_outcome] += 1
        if plan.outcome is not plan.tick_outcome:
            stats.ticks[plan.outcome] += 1
        if plan.tick_outcome is Outcome.CONFLICT:
            stats.conflicts += 1
            stats.hot_runs[work.run_id] += 1
        elif plan.tick_outcome is Outcome.COMMITTED:
            self._sample_end_to_end(work)
        payload = plan.payload
        if isinstance(payload, Requeue):
            stats.requeues[payload.rung_ms] += 1
            if work.span is not None:
                work.span.set_attribute("ductor.requeue_count", payload.requeue_count)
        elif isinstance(payload, ForceFailed):
            self.force_failed(work.run_id, payload.reason, work.span)
        elif isinstance(payload, DeadLettered):
            self._dead_lettered(work, payload.reason, payload.detail)
        elif plan.outcome is Outcome.LOCKED and work.locked == 0:
            log.warning(
                "run %s: another transaction holds its row; its commit waits apart from its"
                " batch, retried with a backoff while the lock lasts",
                work.run_id,
                extra={"run_id": work.run_id, **log_ids(work.span)},
            )

    def force_failed(self, run_id: str, reason: ForceFailReason, span: Span | None) -> None:
        self._stats.force_fails[reason] += 1
        log.warning(
            "run %s force-failed: %s",
            run_id,
            reason.value,
            extra={"run_id": run_id, "reason": reason.value, **log_ids(span)},
        )
        if span is not None:
            span.set_attribute("ductor.reason", reason.value)

    def quarantined(self, plans: list[Plan], error: Exception | None) -> None:
        """Runs flagged so the sweeps skip them (their rows cannot be used), each once."""
        for plan in plans:
            letters = payload_of(plan, DeadLettered)
            self._stats.quarantined[letters.reason] += 1
            log.warning(
                "run %s quarantined: the sweeps skip it until `ductor runs release`",
                plan.run_id,
                extra={
                    "run_id": plan.run_id,
                    "reason": letters.reason.value,
                    "detail": letters.detail,
                },
            )
        if error is not None:  # tried again when the run is next met: not an outage
            log.warning("could not write quarantine flags: %s", first_line(error))

    def isolated(self, stage: str, item: str, exc: BaseException) -> None:
        """An exception nobody foresaw, met while handling one item (``item``: its run id, or
        what names it) at ``stage``, and isolated to it: counted by stage, logged with its
        traceback (once: its dead letter is counted and logged as a dead letter only, where
        it is carried out)."""
        self._stats.isolated[stage] += 1
        log.error(
            "%s: an unexpected exception, isolated to %s: %s",
            stage,
            item or "one record",
            describe(exc),
            exc_info=exc,
            extra={"stage": stage, "item": item},
        )

    def relayed(self, run_id: str, records: int) -> None:
        """Records of a transition sent again from the outbox (their first send was lost)."""
        self._stats.relayed += records
        log.debug("relaying %d record(s) of run %s from the outbox", records, run_id)

    def stuck_failed(self, runs: list[tuple[str, str]]) -> None:
        """Runs the watchdog force-failed as stuck, (run id, workflow): counted like the
        livelock guard's, and as runs ended failed (the sweep wrote each one's end)."""
        for run_id, workflow in runs:
            self._stats.ticks[Outcome.FORCE_FAILED] += 1
            self._stats.runs.force_failed(workflow)
            self.force_failed(run_id, ForceFailReason.STUCK, None)

    def _dead_lettered(self, work: Work, reason: DeadLetterReason, detail: str) -> None:
        if reason in _ALSO_ERRORS:
            # A row changed out of band (never overwritten), a row a statement fails on: a
            # genuine error as well as a dead letter.
            self._stats.errors[reason] += 1
            log.error(
                "run %s: %s",
                work.run_id,
                _ALSO_ERRORS[reason],
                extra={"run_id": work.run_id, "detail": detail, **log_ids(work.span)},
            )
        for record in work.records:
            self._stats.dead_letters[reason] += 1
            log.warning(
                "dead-lettered a record",
                extra={
                    "reason": reason.value,
                    "detail": detail,
                    "topic": record.tp[0],
                    "offset": record.offset,
                    **log_ids(work.span),
                },
            )

    def error(self, kind: str, message: str, *args: object) -> None:
        """A genuine failure: counted by kind, logged as an error."""
        self._stats.errors[kind] += 1
        log.error(message, *args)

    def _sample_end_to_end(self, work: Work) -> None:
        now_ms = self._wall_ms()
        for record in work.records:
            if record.wakeup is not None and record.wakeup.produced_at is not None:
                start = record.wakeup.due_at or record.wakeup.produced_at
                self._stats.sample("end_to_end", max(0, now_ms - start))

    # -- tracing -----------------------------------------------------------------------------

    def start_span(self, work: Work) -> None:
        """Open the work's CONSUMER span (when tracing) from its records' producer contexts."""
        if work.span is not None or not self._telemetry.tracing or not work.records:
            return
        records = [(r.tp[0], r.tp[1], r.offset, r.key, r.headers) for r in work.records]
        work.span = self._telemetry.start_consumer_span(work.records[0].tp[0], records, work.run_id)

    def trace_try(self, work: Work, plan: Plan, tick: Interval, commit: Interval) -> None:
        """The try as a ``tick`` event on the work's CONSUMER span (an event, not a child
        span: a sampled tick then costs one span, not three), with the batch's timings; a
        conflict adds a ``conflict`` event and never an error status."""
        if work.span is None or plan.tick_outcome is None or not work.span.is_recording():
            return  # nothing to build for a trace that is not sampled
        attributes: dict[str, str | int | float] = {
            "ductor.tick.try": work.tries + 1,
            "ductor.attempt": work.tries + 1,  # deprecated here: ductor.tick.try
            "ductor.expected_version": plan.expected_version or 0,
            "ductor.outcome": plan.tick_outcome,
            "ductor.tick_ms": (tick[1] - tick[0]) / 1e6,
        }
        if plan.tick_outcome is not Outcome.NOOP:  # a no-op took no part in the commit
            attributes["ductor.commit_ms"] = (commit[1] - commit[0]) / 1e6
        work.span.add_event("tick", attributes, timestamp=tick[1])
        if plan.tick_outcome is Outcome.CONFLICT or plan.tick_outcome is Outcome.LOCKED:
            # An expected outcome of concurrency: an event, never an error status.
            work.span.add_event(plan.tick_outcome.value, attributes, timestamp=commit[1])

    def end_span(self, work: Work, outcome: Outcome | None = None) -> None:
        """End the work's span: with its outcome when it settled, bare when it was dropped."""
        if work.span is None:
            return
        if outcome is None:
            work.span.end()
        else:
            # The try of the run's tick that settled it, as on its last `tick` event;
            # ductor.attempts (the tries lost before it) is its deprecated wire name.
            tried = {"tick.try": work.tries + 1, "attempts": work.tries}
            end_ok(work.span, outcome, **tried)
        work.span = None

    def end_span_with_error(self, work: Work, exc: BaseException) -> None:
        """A genuine failure ends the span as an error; the retry gets a span of its own."""
        end_error(work.span, exc)
        work.span = None
