"""The life of each task a worker holds, from its record to its wakeup (worker.py runs the
loop around it; tasks.py names the states):

1. **Claim** the attempt in Postgres (worker/database.py, core/claims.py), together with the
   other tasks that arrived meanwhile: a task whose attempt is stale (its deadline passed, the
   run was cancelled or ended, the coordinator moved on), already recorded, or running on a
   live worker is not run; one whose worker died running it runs again (at most
   ``crash_reruns`` times) in a child process of its own, so that if it kills its process
   again it fails its own attempt and nothing else. Claims go ahead of the free slots as far
   as core/claim_pace.py says, but a claim starts only within the worker's start permit,
   kept about a slot's worth of tasks ahead of what runs: a worker that dies leaves the
   claims beyond it as never started, and the next worker runs them as new, not as reruns.
2. **Run** the step function on a slot of its own (runners.py; isolation.py for processes),
   with heartbeats and a ``cancelled`` flag; a step that outlives its deadline (and grace) or
   its heartbeat timeout is abandoned, and its slot is free again.
3. **Record** the result (idempotent, keyed by run, node and attempt), in a group with the
   results that ended meanwhile, then **wake** the run with a record on its wakeup tier.
4. The task is done once its wakeup is acknowledged; its offset may then be passed.

Every change of a task's state happens on the worker's loop thread; the slots and the database
lanes report through one queue (``answers``).

An exception nobody foresaw while handling one task (taking it in, its claim's answer, its
step's end, its result's answer) is that task's alone, never the loop's: a task taken in is
dead-lettered (``unexpected_error``); one claimed fails its attempt, saying why (the
coordinator retries it as its policy says); one whose attempt cannot be failed either is let
go (its attempt times out). Each is logged and counted (``ductor.worker.isolated``).
"""

from __future__ import annotations

import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Message,
)
from opentelemetry import context as otel_context
from opentelemetry import trace

from processor.core.backoff import MAX_RETRY_S
from processor.core.claim_pace import ClaimPace
from processor.core.claims import SKIPPED, Verdict, died_reason
from processor.core.dead_letters import dead_letter_headers, truncate_dead_letter
from processor.core.envelope import Wakeup
from processor.core.outcomes import DeadLetterReason
from processor.core.records import TRACE_HEADERS, normalise_headers
from processor.core.routing import TopicNames
from processor.core.step_task import StepTask, decode_step_task
from processor.io.config import Settings
from processor.io.db_clock import DatabaseClock
from processor.io.delivery import Delivery
from processor.io.faults import NO_FAULTS, Faults, Point
from processor.io.kafka import (
    Outbox,
    choose_partition,
    producer_max_bytes,
)
from processor.io.logs import describe
from processor.io.outage import Outage
from processor.io.step_attempts import Report
from processor.io.step_data import MissingData
from processor.io.telemetry import Telemetry, context_headers, end_error, end_ok, link_headers
from processor.io.threads import ThreadWatch
from processor.io.worker_registry import Directory
from processor.worker.database import (
    Answer,
    Claimed,
    NotCurrent,
    Permitted,
    Recorded,
    ToRecord,
    WorkerDatabase,
)
from processor.worker.handback import Foreign, Handback
from processor.worker.isolation import PROCESS_DIED, ProcessRunner
from processor.worker.metrics import WorkerMetrics
from processor.worker.options import WorkerOptions
from processor.worker.permits import StartPermits
from processor.worker.runners import AsyncRunner, Runner, ThreadRunner
from processor.worker.stats import WorkerStats
from processor.worker.steps import (
    Outcome,
    StepRegistry,
    execute_async_step,
    execute_step,
)
from processor.worker.tasks import ByTier, State, Task, TaskBook

log = logging.getLogger("ductor.worker")

# How often (and after how long) running steps are asked whether their attempt still matters.
_CURRENT_CHECK_EVERY_S = 1.0
# A task someone else holds is claimed again after this long.
_RECLAIM_AFTER_S = 1.0
# Tasks held (waiting for another worker) past this many per slot stop the intake too.
_HELD_PER_SLOT = 8
# Reruns (attempts a worker that died had started) run in child processes of their own,
# started as they are needed, up to twice as many at once as the worker has slots (a worker
# that dies leaves at most its running steps and its start window as reruns); a child left
# idle this long ends.
_RERUN_SLOTS_PER_SLOT = 2
_RERUN_IDLE_EXIT_S = 30.0
# Wakeups unacknowledged this long mean the broker is away (an outage, logged once).
_ACK_PATIENCE_S = 5.0
# A step that started on its slot this long after its claim (at most; a quarter of its
# timeout when that is less) reports its start: its timeout counts from there (core/tick.py,
# rule 4). Most start within milliseconds of their claim, and report nothing.
_LATE_START_S = 1.0
# Heartbeats are recorded at most this often (the last one's details with them), and at least
# twice within a step's heartbeat timeout: the coordinator judges that timeout from them.
_BEAT_RECORD_EVERY_S = 10.0
_BEATS_PER_TIMEOUT = 2.5


class _Over(NamedTuple):
    """The execution of an abandoned task is over (posted by its runner): its function
    returned at last, its child process was killed, or it never started."""

    task: Task


class _Ended(NamedTuple):
    """A step function ended (posted by its slot); no outcome: it did not start, its deadline
    passed while it waited."""

    task: Task
    outcome: Outcome | None
    started_ns: int
    ended_ns: int


class TaskFlow:
    def __init__(
        self,
        *,
        settings: Settings,
        options: WorkerOptions,
        registry: StepRegistry,
        stats: WorkerStats,
        telemetry: Telemetry,
        db: WorkerDatabase,
        answers: queue.SimpleQueue[Answer | _Ended | _Over],
        outbox: Outbox,
        delivery: Delivery,
        kafka_outage: Outage,
        done_offset: Callable[[tuple[str, int], int], None],
        too_many_abandoned: Callable[[], None],
        ready: Callable[[], bool],
        assigned: Callable[[], int],
        clock: DatabaseClock | None = None,
        faults: Faults = NO_FAULTS,
        threads: ThreadWatch | None = None,
        directory: Directory | None = None,
        instance_id: str = "",
    ) -> None:
        """``directory``: the other workers (the registry), for the tasks this one has no
        function for (handback.py); None: such tasks run here, and fail."""
        self.settings = settings
        self._faults = faults
        self._threads = threads or ThreadWatch()
        self._clock = clock or DatabaseClock()
        self.options = options
        self.registry = registry
        self.names = TopicNames(settings.topic_prefix)
        self.stats = stats
        self.telemetry = telemetry
        self.db = db
        self._answers = answers
        self._outbox = outbox
        self._delivery = delivery
        self._kafka_outage = kafka_outage
        self._done_offset = done_offset
        self._too_many_abandoned = too_many_abandoned
        self.book = TaskBook()
        self._to_claim = ByTier()  # received, in the order they came, t0's first
        self._ready: deque[Task] = deque()  # claimed, in the order they came
        self._suspects: deque[Task] = deque()  # reruns, to be claimed as such
        # Claims are numbered; those within the stored start permit may start (permits.py).
        self._permits = StartPermits(self.book)
        self._to_record: list[ToRecord] = []
        self._reports: list[Report] = []  # what to report of executions (io/step_attempts.py)
        self._runners = self._make_runners()
        # Reruns running in children of their own, beside the slots (not waiting for them).
        self._rerunning: set[Task] = set()
        self._pace = ClaimPace(options.concurrency, options.held_limit, time.monotonic())
        self._wakeup_partitions: dict[str, int] = {}
        self._dlq_max_bytes = producer_max_bytes(settings)
        self._next_current_check = 0.0
        self._sent_at: dict[Task, float] = {}  # wakeups on their way, since when
        self._bound_reached = False
        self.stopping = False
        self.handback = (
            Handback(
                self.names,
                options.queues,
                instance_id,
                directory,
                delivery,
                done_offset,
                self._run_here,
                stats,
            )
            if directory is not None
            else None
        )
        self.metrics = WorkerMetrics(
            telemetry,
            stats,
            lambda: (self.book.in_hand, self.book.count(State.RUNNING)),
            self.abandoned_alive,
            ready,
            assigned,
        )

    def wakeup_partitions(self, partitions: dict[str, int]) -> None:
        """The wakeup topics' partition counts, read from the broker at start."""
        self._wakeup_partitions = partitions

    def begin_stopping(self) -> None:
        """Take no new task; tasks not claimed yet are left to the group (their offsets are
        not stored), claims not started are given back; running ones finish."""
        self.stopping = True
        if self.handback is not None:
            self.handback.stop()
        ready: list[Task] = []
        for task in self.book:
            if task.state in (State.RECEIVED, State.HELD, State.SUSPECT):
                self.book.remove(task)
            elif task.state is State.READY:
                ready.append(task)
        self._give_back(ready)
        self._to_claim.clear()
        self._suspects.clear()

    def abandon_running(self) -> None:
        """The worker leaves: steps still running are given up (their threads are daemons)."""
        for task in self.book.in_state(State.RUNNING):
            self._abandon(task, "the worker stopped before it ended")

    def close(self) -> None:
        for runner in set(self._runners.values()):
            runner.close()

    def _make_runners(self) -> dict[str, Runner]:
        if self.options.isolation == "process":
            runner = ProcessRunner(
                self.options, self._on_ended, threads=self._threads, over=self._on_over
            )
            return {"sync": runner, "async": runner, "rerun": runner}
        runners: dict[str, Runner] = {
            "sync": ThreadRunner(
                self.options.concurrency,
                self._execute,
                self._on_ended,
                self._threads,
                self._on_over,
            ),
            "async": AsyncRunner(self._execute_async, self._on_ended, self._threads, self._on_over),
        }
        if self.options.reruns_in_child:
            # A rerun may kill its process again: it runs in a child of its own (started
            # only when reruns come), so the worker and its other tasks go on if it does.
            runners["rerun"] = ProcessRunner(
                self.options,
                self._on_ended,
                slots=_RERUN_SLOTS_PER_SLOT * self.options.concurrency,
                idle_exit_s=_RERUN_IDLE_EXIT_S,
                name="rerun",
                threads=self._threads,
                over=self._on_over,
            )
        return runners

    def _runner_of(self, task: Task) -> Runner:
        if task.starts > 1 and "rerun" in self._runners:
            return self._runners["rerun"]
        return self._runners["async" if self.registry.is_async(task.step.step_type) else "sync"]

    def abandoned_alive(self) -> int:
        return sum(r.abandoned_alive() for r in set(self._runners.values()))

    def room(self) -> int:
        """How many more tasks the worker takes in: its prefetch, less what it holds waiting
        to run; nothing while it stops, or while tasks held for others pile up."""
        if self.stopping:
            return 0
        waiting = self.book.count(State.HELD) + self.book.count(State.SUSPECT)
        if waiting >= _HELD_PER_SLOT * self.options.concurrency:
            return 0
        if self.handback is not None and self.handback.waiting >= self.options.held_limit:
            return 0  # (tasks of others' types, waiting for a worker that has them)
        # (Tasks handed to a runner wait there for a free slot: they count too.)
        held = self.book.in_hand + self.book.count(State.RUNNING)
        return self.options.held_limit + self.options.concurrency - held

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
            step = decode_step_task(message.value(), self._clock.offset_ms)
        except Exception as exc:  # a poison task must never stop the worker
            self._dead_letter(message, tp, offset, exc)
            return
        try:
            self._take(message, tp, offset, context, step)
        except Exception as unforeseen:  # the task's alone: dead-lettered, never the loop's
            self._isolated("intake", step.run_id, unforeseen)
            held = self.book.get(step.key)
            if held is not None and held.tp == tp and held.offset == offset:
                self.book.remove(held)  # (its claim, if asked, finds it gone)
            self._dead_letter(message, tp, offset, unforeseen, DeadLetterReason.UNEXPECTED_ERROR)

    def _take(
        self,
        message: Message,
        tp: tuple[str, int],
        offset: int,
        context: list[tuple[str, bytes]],
        step: StepTask,
    ) -> None:
        self._faults.hit(Point.TASK_INTAKE, step.run_id)
        if self.book.holds(step.key):
            self._skipped_at_intake(tp, offset, "duplicate")  # the task in hand covers it
            return
        if _too_late(step):
            self._skipped_at_intake(tp, offset, "deadline")
            return
        kind, stamp = message.timestamp()
        produced = None if kind == TIMESTAMP_NOT_AVAILABLE else stamp
        if self.handback is not None and self.registry.get(step.step_type) is None:
            self.handback.take(message, tp, offset, step, context, produced)
            return
        self._admit(step, tp, offset, context, produced)

    def _admit(
        self,
        step: StepTask,
        tp: tuple[str, int],
        offset: int,
        context: list[tuple[str, bytes]],
        produced: int | None,
    ) -> None:
        task = Task(step, tp, offset, context, produced)
        self.book.add(task)
        self._to_claim.append(task)

    def _run_here(self, foreign: Foreign) -> None:
        """A task of a type this worker has no function for, that no other worker can take
        (handback.py): it runs here, and fails as it always did."""
        if self.book.holds(foreign.step.key):
            self._skipped_at_intake(foreign.tp, foreign.offset, "duplicate")
            return
        self._admit(foreign.step, foreign.tp, foreign.offset, foreign.context, foreign.produced_ms)

    def _isolated(self, stage: str, run_id: str, exc: Exception) -> None:
        self.stats.isolated[stage] += 1
        log.error(
            "%s: an unexpected exception, isolated to a step task of run %s: %s",
            stage,
            run_id,
            describe(exc),
            exc_info=exc,
            extra={"stage": stage, "run_id": run_id},
        )

    def _task_failed(self, task: Task, stage: str, exc: Exception) -> None:
        """Handling ``task`` raised what nobody foresaw: its attempt fails, saying why (the
        coordinator retries it as its policy says), unless its result is recorded already or
        being recorded; then, or should failing it raise too, the task is let go (its offset
        passes; a result not recorded times its attempt out at the coordinator)."""
        self._isolated(stage, task.key.run_id, exc)
        try:
            if task.state in (State.RECORDING, State.SENDING):  # its result is recorded
                self._sent_at.pop(task, None)
                self._done(task)
                return
            running = task.state is State.RUNNING
            if running:  # (its step may still run: its slot is freed)
                self._rerunning.discard(task)
                self._runner_of(task).abandon(task)
            self._end_span(task, None, f"unexpected error: {describe(exc)}")
            why = f"the worker failed handling it: {describe(exc)}"
            # Its execution, if any, is reported over by its runner.
            self._record(task, Outcome.failed(why), ended=not running)
        except Exception as again:
            self._isolated(stage, task.key.run_id, again)
            self._done(task)

    def _skipped_at_intake(self, tp: tuple[str, int], offset: int, reason: str) -> None:
        self.stats.skipped[reason] += 1
        self._done_offset(tp, offset)

    def _dead_letter(
        self,
        message: Message,
        tp: tuple[str, int],
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
        self.stats.dead_letters += 1
        self._delivery.send(
            self.names.dlq,
            value,
            message.key(),
            None,
            headers,
            lambda: self._done_offset(tp, offset),
        )

    def take_answers(self, wait_s: float) -> None:
        try:
            answer = self._answers.get(timeout=wait_s) if wait_s else self._answers.get_nowait()
            while True:
                self._answered(answer)
                answer = self._answers.get_nowait()
        except queue.Empty:
            pass

    def _answered(self, answer: Answer | _Ended | _Over) -> None:
        if isinstance(answer, _Over):
            self._reports.append(Report(answer.task.key, ended=True))
        elif isinstance(answer, _Ended):
            try:
                self._step_ended(answer)
            except Exception as exc:
                self._task_failed(answer.task, "ended", exc)
        elif isinstance(answer, Claimed):
            if answer.tasks:
                self._pace.claimed(time.monotonic() - answer.tasks[0][0].asked_at)
            for task, verdict, starts, data, details in answer.tasks:
                try:
                    self._faults.hit(Point.TASK_CLAIMED, task.key.run_id)
                    self._claimed(task, verdict, starts, data, details)
                except Exception as exc:
                    self._task_failed(task, "claimed", exc)
        elif isinstance(answer, Recorded):
            # One wakeup per run for the results recorded together (the branches of a fan-out
            # often end in one group): the tick it causes reads every recorded result.
            woken: dict[tuple[str, str], list[Task]] = {}
            for task, recorded in answer.tasks:
                if recorded:
                    woken.setdefault((task.step.run_id, task.step.tier), []).append(task)
                else:
                    self._done(task)
            for tasks in woken.values():
                try:
                    self._wake(tasks)
                except Exception as exc:  # their results are recorded: a sweep wakes the run
                    for task in tasks:
                        self._task_failed(task, "recorded", exc)
        elif isinstance(answer, NotCurrent):
            for task in answer.tasks:
                if task.state is State.RUNNING and not task.attempt.cancelled:
                    task.attempt.cancel()
        elif isinstance(answer, Permitted):
            self._permits.stored(answer.through)

    def _claimed(
        self, task: Task, verdict: Verdict, starts: int, data: Any, details: Any = None
    ) -> None:
        if not self.book.has(task):  # let go meanwhile (its partition went, the worker stops)
            if verdict is Verdict.RUN:
                self.db.unclaim([task])  # the next worker takes it as never started
            return
        if (task.revoked or self.stopping) and verdict is not Verdict.RUN:
            self.book.remove(task)  # its partition's (next) owner claims it again
            return
        if verdict is Verdict.RUN:
            task.starts = starts
            task.claimed_ns = time.monotonic_ns()
            task.attempt.last_details = details
            if isinstance(data, MissingData):  # the attempt fails; a deleted run's is dropped
                self._record(task, Outcome.failed(f"the step's data: {data}"), ended=True)
                return
            task.data = data
            self.book.move(task, State.READY)
            if task.revoked or self.stopping:
                self._give_back([task])  # claimed, but the next owner will run it
            else:
                self._ready.append(task)
        elif verdict is Verdict.RERUN:
            self.book.move(task, State.SUSPECT)
            self._suspects.append(task)
        elif verdict is Verdict.DIED:
            self.stats.skipped["died"] += 1
            log.error(
                "a step attempt is not run again: the worker running it died %d time(s)",
                starts,
                extra=_ids(task),
            )
            self._record(task, Outcome.failed(died_reason(starts)))
        elif verdict is Verdict.HELD:
            self.book.move(task, State.HELD)
            task.claim_at = time.monotonic() + _RECLAIM_AFTER_S
        else:
            assert verdict in SKIPPED
            self.stats.skipped[verdict.value] += 1
            if verdict is Verdict.RESEND:
                self._wake([task])  # its worker died before the run heard of the result
            elif verdict is Verdict.AHEAD:
                log.info(  # (counted: skipped{reason=ahead})
                    "a step task its run's row never dispatched: the commit that dispatched it"
                    " was lost (a database crash or failover); waking the run to dispatch it"
                    " again",
                    extra=_ids(task),
                )
                self._wake([task], "replay")
            else:
                self._done(task)

    def _dispatch(self) -> None:
        """Hand claimed tasks to their runner, in the order they came (a free slot takes the
        next at once) as far as the start permit goes, raising it ahead of them, and claim
        the reruns that came meanwhile: attempts a worker that died had started, taken by a
        claim of their own (core/claims.py) and run in a child process of their own, beside
        everything else."""
        ready = self._ready
        while ready:
            task = ready[0]
            if task.state is not State.READY or not self.book.has(task):
                ready.popleft()
            elif self._permits.allows(task):
                ready.popleft()
                self._start(task)
            else:
                break
        reruns: list[Task] = []
        while self._suspects:
            task = self._suspects.popleft()
            if task.state is State.SUSPECT and self.book.has(task):
                self.book.move(task, State.CLAIMING)
                task.asked_at = time.monotonic()
                task.claim_seq = 0  # a rerun starts at its claim
                reruns.append(task)
        if reruns:
            self.db.claim_reruns(reruns)

    def _give_back(self, tasks: list[Task]) -> None:
        """Claimed tasks that will not run here (the worker stops, the partition went): their
        claims are given back, so the next worker takes them as never started."""
        if tasks:
            self.db.unclaim(tasks)
            for task in tasks:
                self.book.remove(task)

    def _permit_for(self, now: float) -> int:
        """The start permit to ask for now, 0 when the one asked covers enough: the claims
        that start next, as many as the pace's start window (core/claim_pace.py) less those
        already waiting in a runner for a thread."""
        return self._permits.to_ask(self._pace.start_window(now) - self._waiting_for_a_slot())

    def _waiting_for_a_slot(self) -> int:
        """Tasks handed to a runner that wait there for a free slot."""
        running = self.book.count(State.RUNNING) - len(self._rerunning)
        return max(0, running - self.options.concurrency)

    def _start(self, task: Task) -> None:
        self.book.move(task, State.RUNNING)
        runner = self._runner_of(task)
        if task.starts > 1:
            if runner is self._runners.get("rerun") and runner is not self._runners["sync"]:
                self._rerunning.add(task)
            self.stats.reruns += 1
            log.warning(
                "running a step again, in a process of its own: the worker that started it"
                " died (execution %d)",
                task.starts,
                extra=_ids(task),
            )
        if self.telemetry.tracing:
            record = (task.tp[0], task.tp[1], task.offset, None, task.headers)
            span = task.span = self.telemetry.start_consumer_span(
                task.tp[0], [record], task.key.run_id
            )
            if span.is_recording():
                span.set_attributes(
                    {
                        "ductor.node": task.key.node,
                        "ductor.attempt": task.key.attempt,
                        "ductor.step_type": task.step.step_type,
                    }
                )
            # The wakeup carries the execution's context: the run's next tick is its child.
            task.headers = context_headers(span) or task.headers
        runner.submit(task)

    def _execute(self, task: Task) -> Outcome:
        """On a slot's thread: the step function, inside its span's context."""
        assert task.data is not None
        token = _attach(task.span)
        try:
            return execute_step(self.registry, task.step, task.data, task.attempt)
        finally:
            _detach(token)

    async def _execute_async(self, task: Task) -> Outcome:
        assert task.data is not None
        return await execute_async_step(self.registry, task.step, task.data, task.attempt)

    def _on_ended(
        self, task: Task, outcome: Outcome | None, started_ns: int, ended_ns: int
    ) -> None:
        self._answers.put(_Ended(task, outcome, started_ns, ended_ns))

    def _on_over(self, task: Task) -> None:
        self._answers.put(_Over(task))

    def _step_ended(self, ended: _Ended) -> None:
        task = ended.task
        if task.abandoned or task.state is not State.RUNNING:
            return
        self._rerunning.discard(task)
        self._pace.ended(time.monotonic())
        outcome = ended.outcome
        if outcome is not None:
            self.metrics.step_ended(task.step.step_type, (ended.ended_ns - ended.started_ns) / 1e6)
            if task.produced_ms is not None:
                self.metrics.step_started(max(0.0, ended.started_ns / 1e6 - task.produced_ms))
        if outcome is None:
            self.stats.skipped["deadline"] += 1
            self._end_span(task, None, "its deadline passed before it started")
            self._reports.append(Report(task.key, ended=True))  # claimed, never run
            self._done(task)
            return
        self.stats.attempts[(task.step.step_type, outcome.outcome.value)] += 1
        if task.starts > 1 and (outcome.error or "").startswith(PROCESS_DIED):
            self.stats.rerun_crashes += 1
            log.error(
                "a rerun killed its process again: its attempt fails (execution %d)",
                task.starts,
                extra=_ids(task),
            )
        self.stats.heartbeats += task.attempt.beats
        self._end_span(task, outcome)
        self._record(task, outcome, ended=True)

    def _end_span(self, task: Task, outcome: Outcome | None, why: str | None = None) -> None:
        span, task.span = task.span, None
        if span is None:
            return
        if outcome is not None and outcome.error is None:
            end_ok(span, outcome.outcome.value, attempt=task.key.attempt)
        else:
            end_error(span, RuntimeError(why or (outcome.error if outcome else "") or "failed"))

    def watch(self, now: float) -> None:
        """Steps past their deadline (and grace) or their heartbeat timeout are abandoned;
        the others report a late start and their heartbeats; long ones are asked whether their
        attempt still matters; a broker that does not acknowledge wakeups is an outage."""
        wall_ms = time.time() * 1000
        grace_ms = self.options.abandon_after_s * 1000
        long_running: list[Task] = []
        for task in self.book.in_state(State.RUNNING):
            if not task.started_ns:
                continue  # waiting for a slot (skipped by it if its deadline passes)
            step = task.step
            deadline_ms = task.attempt.deadline_ms  # (its start plus its timeout)
            silent_ms = (now - task.attempt.beat_at) * 1000
            if wall_ms > deadline_ms + grace_ms:
                late_s = (wall_ms - deadline_ms) / 1000
                self._abandon(task, f"still running {late_s:.1f} s after its deadline")
                if step.timeout_ms is None:
                    self._done(task)  # its attempt timed out at the coordinator
                else:  # (which may learn late that it started, if it waited in its queue)
                    error = f"attempt {task.key.attempt} timed out after {step.timeout_ms} ms"
                    self._record(task, Outcome.failed(error))
            elif step.heartbeat_timeout_ms is not None and silent_ms > step.heartbeat_timeout_ms:
                why = (
                    f"no heartbeat for {silent_ms / 1000:.1f} s"
                    f" (heartbeat_timeout_ms {step.heartbeat_timeout_ms})"
                )
                self._abandon(task, why)
                self._record(task, Outcome.failed(f"abandoned: {why}"))
            else:
                self._report_progress(task, now)
                if time.monotonic_ns() - task.started_ns > _CURRENT_CHECK_EVERY_S * 1e9:
                    long_running.append(task)
        if long_running and now >= self._next_current_check:
            self._next_current_check = now + _CURRENT_CHECK_EVERY_S
            self.db.check_current(long_running)
        if self.abandoned_alive() > self.options.abandoned_limit and not self._bound_reached:
            log.error(
                "%d abandoned steps are still running (at most %d): the worker stops, for its"
                " supervisor to start a fresh process",
                self.abandoned_alive(),
                self.options.abandoned_limit,
            )
            self._bound_reached = True
            self._too_many_abandoned()
        waiting = min(self._sent_at.values(), default=None)
        # Once an outage ended, the records that failed during it are sent again after their
        # own backoff (io/delivery.py, at most MAX_RETRY_S): they are not a new outage.
        settled = self._kafka_outage.ended_at + MAX_RETRY_S
        if waiting is not None and now - max(waiting, settled) > _ACK_PATIENCE_S:
            self._kafka_outage.failed(
                f"{len(self._sent_at)} wakeup(s), the oldest not acknowledged after"
                f" {now - waiting:.0f} s"
            )

    def _report_progress(self, task: Task, now: float) -> None:
        """What a running step reports of its execution (io/step_attempts.py): its start, when
        it came well after its claim (a task claimed ahead of the slots waited for one: its
        timeout counts from its start, not its claim); its heartbeats, with the details of the
        last one, a few times per heartbeat timeout at most (the coordinator judges that
        timeout from them: core/tick.py, rule 4)."""
        step = task.step
        if not task.start_reported:
            task.start_reported = True
            if step.timeout_ms is not None and task.claimed_ns:
                waited_s = (task.started_ns - task.claimed_ns) / 1e9
                if waited_s > min(_LATE_START_S, step.timeout_ms / 4000):
                    self._reports.append(Report(task.key, started=True))
        attempt = task.attempt
        if attempt.beats == task.beats_reported:
            return
        every = _BEAT_RECORD_EVERY_S
        if step.heartbeat_timeout_ms is not None:
            every = min(every, step.heartbeat_timeout_ms / 1000 / _BEATS_PER_TIMEOUT)
        if now - task.beat_reported_at >= every:
            self._reports.append(Report(task.key, beat=True, details=self._new_details(task)))
            task.beats_reported = attempt.beats
            task.beat_reported_at = now

    def _new_details(self, task: Task) -> str | None:
        """The details of the task's last heartbeat, if they were not recorded yet (they are
        taken as recorded now)."""
        details = task.attempt.details
        if details is None or details == task.details_reported:
            return None
        task.details_reported = details
        return details

    def _abandon(self, task: Task, why: str) -> None:
        self._rerunning.discard(task)
        self._runner_of(task).abandon(task)
        self.stats.abandoned += 1
        self.stats.heartbeats += task.attempt.beats
        log.warning("abandoned a step: %s", why, extra={**_ids(task), "reason": why})
        self._end_span(task, None, f"abandoned: {why}")

    def _record(self, task: Task, outcome: Outcome, ended: bool = False) -> None:
        """Record ``outcome`` as the task's attempt's result; ``ended``: the task's execution
        ended with it (else it still runs, given up, or none ran; its runner reports its end
        when it comes)."""
        self.book.move(task, State.RECORDING)
        self._to_record.append(ToRecord(task, outcome, ended, self._new_details(task)))

    def ask(self) -> None:
        """Hand the database what gathered this turn: one request per kind; held tasks whose
        wait is over are claimed again."""
        now = time.monotonic()
        if self.handback is not None:
            self.handback.turn()
        for task in self.book.in_state(State.HELD) if self.book.count(State.HELD) else ():
            if _too_late(task.step):
                self.stats.skipped["deadline"] += 1
                self._done(task)  # the coordinator has moved on from it
            elif now >= task.claim_at:
                self.book.move(task, State.RECEIVED)
                self._to_claim.append(task)
        if self._to_record:
            self.db.record(self._to_record)
            self._to_record = []
        if self._reports:
            self.db.report(self._reports)
            self._reports = []
        self._dispatch()
        claims = self._claims_to_ask(now) if self._to_claim else []
        if claims:
            self.db.claim(claims, self._permit_for(now))  # the permit rides on the claim
        elif self._ready and self._permits.not_asked_for(self._ready[0]):
            # A claimed task waits for the permit (_dispatch left it first) and no claim goes
            # out to carry it: the permit goes alone.
            permit = self._permit_for(now)
            if permit:
                self.db.permit(permit)

    def _claims_to_ask(self, now: float) -> list[Task]:
        """The received tasks to claim now, numbered: as far ahead of the free slots as the
        pace says (core/claim_pace.py)."""
        ahead = (
            self.book.count(State.CLAIMING)
            + self.book.count(State.READY)
            + self._waiting_for_a_slot()
        )
        room = self._pace.limit(now) - ahead
        claims: list[Task] = []
        while self._to_claim and len(claims) < room:
            task = self._to_claim.popleft()
            if task.state is State.RECEIVED and self.book.has(task):
                self.book.move(task, State.CLAIMING)
                task.asked_at = now
                self._permits.number(task)
                claims.append(task)
        return claims

    def _wake(self, tasks: list[Task], reason: str = "step_result") -> None:
        """Wake the run of ``tasks`` (one run's): their results are recorded (or were, by a
        worker that died), or (``replay``) its row lost the commit that dispatched them. The
        wakeup carries the first task's trace context, and the others' as links; every task is
        done once it is acknowledged."""
        now = time.monotonic()
        for task in tasks:
            self.book.move(task, State.SENDING)
            self._sent_at[task] = now
        step = tasks[0].step
        wakeup = Wakeup(run_id=step.run_id, reason=reason, produced_at=int(time.time() * 1000))
        topic = self.names.wakeup(step.tier)
        partition = choose_partition(
            step.run_id, self._wakeup_partitions[topic], self.settings.partition_by_run
        )

        def delivered() -> None:
            for task in tasks:
                self._sent_at.pop(task, None)
                self._done(task)

        headers = tasks[0].headers
        if len(tasks) > 1 and self.telemetry.tracing:  # the run's tick links to every execution
            headers = [*headers, *link_headers(task.headers for task in tasks[1:])]
        self._delivery.send(topic, wakeup.encode(), wakeup.key(), partition, headers, delivered)

    def _done(self, task: Task) -> None:
        self._done_offset(task.tp, task.offset)  # ignored when the partition went meanwhile
        self.book.remove(task)

    def releasing(self, tps: set[tuple[str, int]], commit: bool) -> None:
        """Partitions go. Tasks not claimed yet are the next owner's; claimed ones not started
        are given back; running ones run to their end here (the next owner finds them held,
        then recorded), their offsets no longer ours."""
        ready: list[Task] = []
        if self.handback is not None:
            self.handback.releasing(tps)
        for task in self.book.of_partitions(tps):
            task.revoked = True
            if task.state in (State.RECEIVED, State.HELD, State.SUSPECT):
                self.book.remove(task)
            elif task.state is State.READY:
                ready.append(task)
        self._give_back(ready)
        if commit:
            # Wakeups on their way count their tasks as done (briefly: a broker away must
            # not hold a rebalance) before what is done is committed.
            self._outbox.flush(min(2.0, self.settings.shutdown_timeout_s))


def _too_late(step: StepTask) -> bool:
    """Whether no worker may take the task any more (core/step_task.py): its schedule-to-start
    bound passed, or the deadline of a task from before start-to-close."""
    until = step.taken_until_ms()
    return until is not None and time.time() * 1000 >= until


def _ids(task: Task) -> dict[str, Any]:
    run_id, node, attempt = task.key
    return {"run_id": run_id, "node": node, "attempt": attempt}


def _attach(span: Any) -> object | None:
    if span is None:
        return None
    return otel_context.attach(trace.set_span_in_context(span))


def _detach(token: object | None) -> None:
    if token is not None:
        otel_context.detach(token)  # type: ignore[arg-type]
