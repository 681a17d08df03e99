"""A task's last stages (flow.py, 3 and 4): its result **recorded**, in a group with the
results that ended meanwhile, then its run **woken** with a record on its wakeup tier; the
task is done once the wakeup is acknowledged, and its offset may then pass. What a running
step reports of its execution (late starts, heartbeats, ends) gathers here too, and goes to
the claims lane once a turn."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from processor.core.backoff import MAX_RETRY_S
from processor.core.envelope import Wakeup
from processor.core.model import StepOutcome
from processor.core.routing import TopicNames
from processor.core.shapes import RunRef, TopicPartition
from processor.io.kafka.clients import choose_partition
from processor.io.kafka.delivery import Delivery
from processor.io.postgres.step_attempts import Report
from processor.io.runtime.clock import Clock
from processor.io.runtime.outage import Outage
from processor.io.telemetry.spans import link_headers
from processor.worker.messages import Recorded, RecordResults, ReportExecutions, Request, ToRecord
from processor.worker.steps import AttemptResult
from processor.worker.tasks import State, Task, TaskBook

# Wakeups unacknowledged this long mean the broker is away (an outage, logged once).
_ACK_PATIENCE_S = 5.0


class Results:
    def __init__(
        self,
        *,
        book: TaskBook,
        clock: Clock,
        names: TopicNames,
        partition_by_run: bool,
        delivery: Delivery,
        kafka_outage: Outage,
        ask: Callable[[Request], None],
        done_offset: Callable[[TopicPartition, int], None],
        tracing: bool = False,
    ) -> None:
        self._book = book
        self._clock = clock
        self._names = names
        self._partition_by_run = partition_by_run
        self._delivery = delivery
        self._kafka_outage = kafka_outage
        self._ask = ask
        self._done_offset = done_offset
        self._tracing = tracing
        self._to_record: list[ToRecord] = []
        self._reports: list[
            Report
        ] = []  # what to report of executions (io/postgres/step_attempts.py)
        self._sent_at: dict[Task, float] = {}  # wakeups on their way, since when
        self.wakeup_partitions: dict[str, int] = {}

    def record(self, task: Task, outcome: AttemptResult, ended: bool = False) -> None:
        """Record ``outcome`` as the task's attempt's result; ``ended``: the task's execution
        ended with it (else it still runs, given up, or none ran; its runner reports its end
        when it comes)."""
        self._book.move(task, State.RECORDING)
        self._to_record.append(
            ToRecord(task, outcome, ended, new_details(task), kept_tags(task, outcome))
        )

    def report(self, report: Report) -> None:
        self._reports.append(report)

    def send(self) -> None:
        """Hand the database what gathered this turn: one request per kind."""
        if self._to_record:
            self._ask(RecordResults(self._to_record))
            self._to_record = []
        if self._reports:
            self._ask(ReportExecutions(self._reports))
            self._reports = []

    def recorded(self, answer: Recorded, failed: Callable[[Task, Exception], None]) -> None:
        """One wakeup per run for the results recorded together (the branches of a fan-out
        often end in one group): the tick it causes reads every recorded result."""
        woken: dict[RunRef, list[Task]] = {}
        for task, recorded in answer.tasks:
            if recorded:
                woken.setdefault((task.step.run_id, task.step.tier), []).append(task)
            else:
                self.done(task)
        for tasks in woken.values():
            try:
                self.wake(tasks)
            except Exception as exc:  # their results are recorded: a sweep wakes the run
                for task in tasks:
                    failed(task, exc)

    def wake(self, tasks: list[Task], reason: str = "step_result") -> None:
        """Wake the run of ``tasks`` (one run's): their results are recorded (or were, by a
        worker that died), or (``replay``) its row lost the commit that dispatched them. The
        wakeup carries the first task's trace context, and the others' as links; every task is
        done once it is acknowledged."""
        now = self._clock.monotonic()
        for task in tasks:
            self._book.move(task, State.SENDING)
            self._sent_at[task] = now
        step = tasks[0].step
        wakeup = Wakeup(run_id=step.run_id, reason=reason, produced_at=self._clock.wall_ms())
        topic = self._names.wakeup(step.tier)
        partition = choose_partition(
            step.run_id, self.wakeup_partitions[topic], self._partition_by_run
        )

        def delivered() -> None:
            for task in tasks:
                self._sent_at.pop(task, None)
                self.done(task)

        headers = tasks[0].headers
        if len(tasks) > 1 and self._tracing:  # the run's tick links to every execution
            headers = [*headers, *link_headers(task.headers for task in tasks[1:])]
        self._delivery.send(topic, wakeup.encode(), wakeup.key(), partition, headers, delivered)

    def done(self, task: Task) -> None:
        self._done_offset(task.tp, task.offset)  # ignored when the partition went meanwhile
        self._book.remove(task)

    def let_go(self, task: Task) -> None:
        """A task whose wakeup (if any) is no longer waited for: done now."""
        self._sent_at.pop(task, None)
        self.done(task)

    def watch_acks(self, now: float) -> None:
        """A broker that does not acknowledge wakeups is an outage."""
        waiting = min(self._sent_at.values(), default=None)
        # Once an outage ended, the records that failed during it are sent again after their
        # own backoff (io/kafka/delivery.py, at most MAX_RETRY_S): they are not a new outage.
        settled = self._kafka_outage.ended_at + MAX_RETRY_S
        if waiting is not None and now - max(waiting, settled) > _ACK_PATIENCE_S:
            self._kafka_outage.failed(
                f"{len(self._sent_at)} wakeup(s), the oldest not acknowledged after"
                f" {now - waiting:.0f} s"
            )


def new_details(task: Task) -> str | None:
    """The details of the task's last heartbeat, if they were not recorded yet (they are
    taken as recorded now)."""
    details = task.handle.details
    if details is None or details == task.details_reported:
        return None
    task.details_reported = details
    return details


def kept_tags(task: Task, outcome: AttemptResult) -> tuple[tuple[str, str], ...]:
    """The tags the task's step set on its run, recorded with its result if it succeeded
    (then its function has returned: no step writes them any more); a failed attempt's are
    dropped, so a run's tags come from the attempts that count, as its outputs do."""
    if outcome.outcome is not StepOutcome.SUCCEEDED or not task.handle.tags:
        return ()
    return tuple(task.handle.tags.items())


def ids(task: Task) -> dict[str, Any]:
    """A task's attempt, for a log line's extra fields."""
    run_id, node, attempt = task.key
    return {"run_id": run_id, "node": node, "attempt": attempt}
