"""The life of each task a worker holds, from its record to its wakeup (worker.py runs the
loop around it; tasks.py names the states; this module makes every move between them):

1. **Claim** the attempt in Postgres (claiming.py; worker/database.py, core/claims.py),
   together with the other tasks that arrived meanwhile: a task whose attempt is stale (its
   deadline passed, the run was cancelled or ended, the coordinator moved on), already
   recorded, or running on a live worker is not run; one whose worker died running it runs
   again (at most ``crash_reruns`` times) in a child process of its own, so that if it kills
   its process again it fails its own attempt and nothing else. Claims go ahead of the free
   slots as far as core/claim_pace.py says, but a claim starts only within the worker's start
   permit, kept about a slot's worth of tasks ahead of what runs: a worker that dies leaves
   the claims beyond it as never started, and the next worker runs them as new, not as reruns.
2. **Run** the step function on a slot of its own (runs.py), with heartbeats and a
   ``cancelled`` flag; a step that outlives its deadline (and grace) or its heartbeat timeout
   is abandoned (watch.py), and its slot is free again.
3. **Record** the result (idempotent, keyed by run, node and attempt), in a group with the
   results that ended meanwhile, then **wake** the run with a record on its wakeup tier
   (results.py).
4. The task is done once its wakeup is acknowledged; its offset may then be passed.

Every change of a task's state happens on the worker's loop thread; the slots and the database
lanes report through one queue (``answers``, messages.py). The book of the tasks held is this
module's alone: the loop asks it a few questions (``room``, ``holding``, ``in_flight``).

An exception nobody foresaw while handling one task (taking it in, its claim's answer, its
step's end, its result's answer) is that task's alone, never the loop's: a task taken in is
dead-lettered (``unexpected_error``); one claimed fails its attempt, saying why (the
coordinator retries it as its policy says); one whose attempt cannot be failed either is let
go (its attempt times out). Each is logged and counted (``ductor.worker.isolated``).
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable

from confluent_kafka import Message

from processor.core.claims import SKIPPED, ClaimVerdict, died_reason
from processor.core.failures import no_traceback
from processor.core.shapes import TopicPartition
from processor.io.postgres.step_attempts import Report
from processor.io.postgres.step_data import MissingData
from processor.io.runtime.clock import Clock
from processor.io.runtime.faults import Faults, Point
from processor.io.telemetry.logs import describe
from processor.worker.claiming import Claims
from processor.worker.handback import Handback
from processor.worker.intake import Intake, isolated, too_late
from processor.worker.isolation import PROCESS_DIED
from processor.worker.messages import (
    Claimed,
    Ended,
    News,
    NotCurrent,
    Over,
    Permitted,
    Recorded,
    TaskClaim,
)
from processor.worker.metrics import WorkerMetrics
from processor.worker.options import WorkerOptions
from processor.worker.results import Results, ids
from processor.worker.runs import Runs, end_span
from processor.worker.stats import WorkerStats
from processor.worker.steps import AttemptResult
from processor.worker.tasks import State, Task, TaskBook
from processor.worker.watch import DeadlineWatch

log = logging.getLogger("ductor.worker")


# Tasks held (waiting for another worker) past this many per slot stop the intake too.
HELD_PER_SLOT = 8


class TaskFlow:
    """The state moves of the tasks held, over the collaborators it is built from (assembly.py,
    which the worker, its composition root, calls); a unit test builds any of them alone."""

    def __init__(
        self,
        *,
        book: TaskBook,
        clock: Clock,
        options: WorkerOptions,
        stats: WorkerStats,
        answers: queue.SimpleQueue[News],
        runs: Runs,
        claims: Claims,
        results: Results,
        watch: DeadlineWatch,
        intake: Intake,
        handback: Handback | None,
        faults: Faults,
        flush: Callable[[float], object],
        shutdown_timeout_s: float,
        metrics: WorkerMetrics | None = None,
    ) -> None:
        """``flush``: wait up to so many seconds for the records on their way (a rebalance
        waits for the wakeups of the partitions that go)."""
        self._book = book
        self._clock = clock
        self._options = options
        self._stats = stats
        self._answers = answers
        self._runs = runs
        self._claims = claims
        self._results = results
        self._watch = watch
        self._intake = intake
        self._handback = handback
        self._faults = faults
        self._flush = flush
        self._shutdown_timeout_s = shutdown_timeout_s
        self.stopping = False
        self._metrics = metrics

    # -- the few questions the loop asks of the book ----------------------------------------

    def holding(self) -> int:
        """Tasks held, in any state."""
        return len(self._book)

    def in_flight(self) -> tuple[int, int]:
        """Tasks held waiting to run (for their claim, or claimed and waiting for a slot), and
        running."""
        return self._book.in_hand, self._book.count(State.RUNNING)

    def held_by_state(self) -> dict[str, int]:
        """How many tasks are held in each state (the states with none left out)."""
        return {s.name.lower(): n for s in State if (n := self._book.count(s))}

    def abandoned_alive(self) -> int:
        return self._runs.abandoned_alive()

    def room(self) -> int:
        """How many more tasks the worker takes in: its prefetch, less what it holds waiting
        to run; nothing while it stops, or while tasks held for others pile up."""
        if self.stopping:
            return 0
        book, options = self._book, self._options
        waiting = book.count(State.HELD) + book.count(State.SUSPECT)
        if waiting >= HELD_PER_SLOT * options.concurrency:
            return 0
        if self._handback is not None and self._handback.waiting >= options.held_limit:
            return 0  # (tasks of others' types, waiting for a worker that has them)
        # (Tasks handed to a runner wait there for a free slot: they count too.)
        held = book.in_hand + book.count(State.RUNNING)
        return options.held_limit + options.concurrency - held

    # -- what the loop hands it -------------------------------------------------------------

    def wakeup_partitions(self, partitions: dict[str, int]) -> None:
        """The wakeup topics' partition counts, read from the broker at start."""
        self._results.wakeup_partitions = partitions

    def intake(self, message: Message) -> None:
        """A tracked record becomes a task in hand (or a dead letter, or is skipped); never
        raises."""
        self._intake.intake(message)

    def take_answers(self, wait_s: float) -> None:
        """What the lanes and the slots answered, waiting up to ``wait_s`` for the first."""
        try:
            answers = self._answers
            answer = answers.get(timeout=wait_s) if wait_s else answers.get_nowait()
            while True:
                self._answered(answer)
                answer = answers.get_nowait()
        except queue.Empty:
            pass

    def watch(self, now: float) -> None:
        """The running steps judged (watch.py); a broker that does not acknowledge wakeups is
        an outage."""
        self._watch.watch(now)
        self._results.watch_acks(now)

    def ask(self) -> None:
        """Hand the database what gathered this turn: one request per kind; held tasks whose
        wait is over are claimed again."""
        now = self._clock.monotonic()
        if self._handback is not None:
            self._handback.turn()
        if self._book.count(State.HELD):
            wall_ms = self._clock.wall_ms()
            for task in self._book.in_state(State.HELD):
                if too_late(task.step, wall_ms):
                    self._stats.skipped["deadline"] += 1
                    self._results.done(task)  # the coordinator has moved on from it
                elif now >= task.claim_at:
                    self._claims.again(task)
        self._results.send()
        self._claims.ask(now)

    def releasing(self, tps: set[TopicPartition], commit: bool) -> None:
        """Partitions go. Tasks not claimed yet are the next owner's; claimed ones not started
        are given back; running ones run to their end here (the next owner finds them held,
        then recorded), their offsets no longer ours."""
        if self._handback is not None:
            self._handback.releasing(tps)
        tasks = self._book.of_partitions(tps)
        for task in tasks:
            task.revoked = True
        self._let_go_unstarted(tasks)
        if commit:
            # Wakeups on their way count their tasks as done (briefly: a broker away must
            # not hold a rebalance) before what is done is committed.
            self._flush(min(2.0, self._shutdown_timeout_s))

    def begin_stopping(self) -> None:
        """Take no new task; tasks not claimed yet are left to the group (their offsets are
        not stored), claims not started are given back; running ones finish."""
        self.stopping = True
        if self._handback is not None:
            self._handback.stop()
        self._let_go_unstarted(list(self._book))
        self._claims.clear()

    def _let_go_unstarted(self, tasks: list[Task]) -> None:
        ready: list[Task] = []
        for task in tasks:
            if task.state in (State.RECEIVED, State.HELD, State.SUSPECT):
                self._book.remove(task)
            elif task.state is State.READY:
                ready.append(task)
        self._claims.give_back(ready)

    def abandon_running(self) -> None:
        """The worker leaves: steps still running are given up (their threads are daemons)."""
        for task in self._book.in_state(State.RUNNING):
            self._runs.abandon(task, "the worker stopped before it ended")

    def close(self) -> None:
        self._runs.close()

    # -- the answers: every state move after the intake -------------------------------------

    def _answered(self, answer: News) -> None:
        if isinstance(answer, Over):
            self._results.report(Report(answer.task.key, ended=True))
        elif isinstance(answer, Ended):
            try:
                self._step_ended(answer)
            except Exception as exc:
                self._task_failed(answer.task, "ended", exc)
        elif isinstance(answer, Claimed):
            self._claimed_all(answer)
        elif isinstance(answer, Recorded):
            self._results.recorded(
                answer, lambda task, exc: self._task_failed(task, "recorded", exc)
            )
        elif isinstance(answer, NotCurrent):
            for task in answer.tasks:
                if task.state is State.RUNNING and not task.handle.cancelled:
                    task.handle.cancel()
        elif isinstance(answer, Permitted):
            self._claims.permitted(answer.through)

    def _claimed_all(self, answer: Claimed) -> None:
        if answer.tasks:
            self._claims.pace.claimed(self._clock.monotonic() - answer.tasks[0].task.asked_at)
        for claim in answer.tasks:
            try:
                self._faults.hit(Point.TASK_CLAIMED, claim.task.key.run_id)
                self._claimed(claim)
            except Exception as exc:
                self._task_failed(claim.task, "claimed", exc)

    def _claimed(self, claim: TaskClaim) -> None:
        task, verdict = claim.task, claim.verdict
        if not self._book.has(task):  # let go meanwhile (its partition went, the worker stops)
            if verdict is ClaimVerdict.RUN:
                self._claims.give_back([task])  # the next worker takes it as never started
            return
        if (task.revoked or self.stopping) and verdict is not ClaimVerdict.RUN:
            self._book.remove(task)  # its partition's (next) owner claims it again
            return
        if verdict is ClaimVerdict.RUN:
            self._claimed_to_run(claim)
        elif verdict is ClaimVerdict.RERUN:
            self._claims.suspect(task)
        elif verdict is ClaimVerdict.DIED:
            self._stats.skipped["died"] += 1
            log.error(
                "a step attempt is not run again: the worker running it died %d time(s)",
                claim.starts,
                extra=ids(task),
            )
            why = died_reason(claim.starts)
            self._results.record(task, AttemptResult.failed(why, traceback=no_traceback(why)))
        elif verdict is ClaimVerdict.HELD:
            self._claims.hold(task)
        else:
            self._skipped(task, verdict)

    def _claimed_to_run(self, claim: TaskClaim) -> None:
        task, data = claim.task, claim.data
        task.starts = claim.starts
        task.claimed_ns = int(self._clock.monotonic() * 1e9)
        task.handle.last_details = claim.details
        if isinstance(data, MissingData):  # the attempt fails; a deleted run's is dropped
            self._results.record(task, AttemptResult.failed(f"the step's data: {data}"), ended=True)
            return
        task.data = data
        if task.revoked or self.stopping:
            self._book.move(task, State.READY)
            self._claims.give_back([task])  # claimed, but the next owner will run it
        else:
            self._claims.ready(task)

    def _skipped(self, task: Task, verdict: ClaimVerdict) -> None:
        assert verdict in SKIPPED
        self._stats.skipped[verdict.value] += 1
        if verdict is ClaimVerdict.RESEND:
            self._results.wake([task])  # its worker died before the run heard of the result
        elif verdict is ClaimVerdict.AHEAD:
            log.info(  # (counted: skipped{reason=ahead})
                "a step task its run's row never dispatched: the commit that dispatched it"
                " was lost (a database crash or failover); waking the run to dispatch it"
                " again",
                extra=ids(task),
            )
            self._results.wake([task], "replay")
        else:
            self._results.done(task)

    def _step_ended(self, ended: Ended) -> None:
        task = ended.task
        if task.abandoned or task.state is not State.RUNNING:
            return
        self._runs.ended(task)
        self._claims.pace.ended(self._clock.monotonic())
        outcome = ended.outcome
        if outcome is not None and self._metrics is not None:
            metrics = self._metrics
            metrics.step_ended(task.step.step_type, (ended.ended_ns - ended.started_ns) / 1e6)
            if task.produced_ms is not None:
                metrics.step_started(max(0.0, ended.started_ns / 1e6 - task.produced_ms))
        if outcome is None:
            self._stats.skipped["deadline"] += 1
            end_span(task, None, "its deadline passed before it started")
            self._results.report(Report(task.key, ended=True))  # claimed, never run
            self._results.done(task)
            return
        self._stats.attempts[(task.step.step_type, outcome.outcome.value)] += 1
        if task.starts > 1 and (outcome.error or "").startswith(PROCESS_DIED):
            self._stats.rerun_crashes += 1
            log.error(
                "a rerun killed its process again: its attempt fails (execution %d)",
                task.starts,
                extra=ids(task),
            )
        self._stats.heartbeats += task.handle.beats
        end_span(task, outcome)
        self._results.record(task, outcome, ended=True)

    # -- what nobody foresaw ----------------------------------------------------------------

    def _task_failed(self, task: Task, stage: str, exc: Exception) -> None:
        """Handling ``task`` raised what nobody foresaw: its attempt fails, saying why (the
        coordinator retries it as its policy says), unless its result is recorded already or
        being recorded; then, or should failing it raise too, the task is let go (its offset
        passes; a result not recorded times its attempt out at the coordinator)."""
        isolated(self._stats, stage, task.key.run_id, exc)
        try:
            if task.state in (State.RECORDING, State.SENDING):  # its result is recorded
                self._results.let_go(task)
                return
            running = task.state is State.RUNNING
            if running:  # (its step may still run: its slot is freed)
                self._runs.free_slot(task)
            end_span(task, None, f"unexpected error: {describe(exc)}")
            why = f"the worker failed handling it: {describe(exc)}"
            # Its execution, if any, is reported over by its runner.
            self._results.record(task, AttemptResult.failed(why), ended=not running)
        except Exception as again:
            isolated(self._stats, stage, task.key.run_id, again)
            self._results.done(task)
