"""A step worker: a task queue on Kafka that runs the users' step functions.

It consumes its queues' steps topics and handles each task on its own, as it comes:

1. **Claim** the attempt in Postgres (worker/database.py, core/claims.py), together with the
   other tasks that arrived meanwhile: a task whose attempt is stale (its deadline passed, the
   run was cancelled or ended, the coordinator moved on), already recorded, or running on a
   live worker is not run; one whose worker died running it runs again at most
   ``crash_reruns`` times, then fails its attempt instead of crashing the next worker too.
2. **Run** the step function on a slot of its own (runners.py; isolation.py for processes),
   with heartbeats and a ``cancelled`` flag; a step that outlives its deadline (or its
   heartbeat timeout) is abandoned, and its slot is free again.
3. **Record** the result (idempotent, keyed by run, node and attempt), in a group with the
   results that ended meanwhile, then **wake** the run with a record on its wakeup tier.
4. The task is done once its wakeup is acknowledged; offsets advance through a tracker that
   never passes an unfinished task (core/offsets.py).

So a step runs once per attempt unless a process died or a deadline passed, and one step never
holds back another: no batch barrier, at most ``concurrency`` tasks at once; when they are all
taken the worker pauses its partitions and keeps polling (the group never takes it for dead,
however long a step runs). The loop thread owns every task's state; the step slots and the
database thread report to it through one queue.

Outages are ridden through, never a reason to exit (one log line when each starts and one when
it ends); a task that cannot be decoded is dead-lettered; a result that cannot be stored is
recorded as a failed attempt saying why. A stop (SIGTERM) lets running steps finish within
``DUCTOR_SHUTDOWN_TIMEOUT_S``, records and announces them, and leaves the rest for the group.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import deque
from typing import Any, NamedTuple

from confluent_kafka import (
    TIMESTAMP_NOT_AVAILABLE,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from opentelemetry import context as otel_context
from opentelemetry import trace

from processor.core.claim_pace import ClaimPace
from processor.core.claims import SKIPPED, Verdict, died_reason
from processor.core.dead_letters import dead_letter_headers, truncate_dead_letter
from processor.core.envelope import Wakeup
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import DeadLetterReason
from processor.core.records import normalise_headers
from processor.core.routing import TopicNames
from processor.core.step_task import decode_step_task
from processor.io.config import Settings
from processor.io.delivery import Delivery
from processor.io.health_http import HealthServer
from processor.io.instances import Presence, heartbeat_interval_s
from processor.io.kafka import (
    Outbox,
    choose_partition,
    group_protocol_config,
    producer_config,
    producer_max_bytes,
    topic_partitions,
)
from processor.io.outage import Outage
from processor.io.step_data import MissingData
from processor.io.telemetry import Telemetry, context_headers, end_error, end_ok
from processor.worker.database import (
    Answer,
    Claimed,
    ClaimRules,
    NotCurrent,
    Recorded,
    WorkerDatabase,
)
from processor.worker.health import QueueLag, WorkerProbe
from processor.worker.isolation import ProcessRunner
from processor.worker.metrics import WorkerMetrics
from processor.worker.options import WorkerOptions
from processor.worker.runners import AsyncRunner, Runner, ThreadRunner
from processor.worker.stats import WorkerStats
from processor.worker.steps import (
    Outcome,
    StepRegistry,
    execute_async_step,
    execute_step,
)
from processor.worker.tasks import State, Task, TaskBook

log = logging.getLogger("ductor.worker")

EXIT_ABANDONED = 3  # the worker stopped itself: too many abandoned steps still running

# How long an idle loop blocks in poll, and how long a busy one waits for its slots and its
# database thread between two polls.
_IDLE_POLL_S = 0.1
_BUSY_WAIT_S = 0.002
# How often running steps are checked against their deadlines and heartbeat timeouts, and how
# often (and after how long) whether their attempt still matters.
_WATCH_EVERY_S = 0.05
_CURRENT_CHECK_EVERY_S = 1.0
# A task someone else holds is claimed again after this long.
_RECLAIM_AFTER_S = 1.0
# Tasks held (waiting for another worker) past this many per slot pause the partitions too.
_HELD_PER_SLOT = 8
# Records read ahead of the tasks in hand; the partitions pause when this many wait.
_BACKLOG_LIMIT = 2000
# Wakeups unacknowledged this long mean the broker is away (an outage, logged once).
_ACK_PATIENCE_S = 5.0


class _Ended(NamedTuple):
    """A step function ended (posted by its slot); no outcome: it did not start, its deadline
    passed while it waited."""

    task: Task
    outcome: Outcome | None
    started_ns: int
    ended_ns: int


class Worker:
    def __init__(
        self,
        settings: Settings,
        registry: StepRegistry,
        options: WorkerOptions | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.options = options = options or WorkerOptions()
        self.names = TopicNames(settings.topic_prefix)
        self.instance_id = client_id = f"ductor-worker-{uuid.uuid4().hex[:8]}"
        self.stats = WorkerStats()
        self.telemetry = telemetry or Telemetry.from_environment(
            "ductor-worker",
            settings.metrics_port,
            f"{settings.group_id}-workers",
            settings.http_host,
        )
        self.outages = {"postgres": Outage("postgres", log), "kafka": Outage("kafka", log)}
        self._producer = Producer(producer_config(settings, client_id))
        self._outbox = Outbox(self._producer)
        self._delivery = Delivery(self._outbox, self.stats.errors, outage=self.outages["kafka"])
        self._consumer = Consumer(
            {
                **settings.kafka_common(),
                "client.id": client_id,
                "group.id": f"{settings.group_id}-workers",
                **group_protocol_config(settings),
                "auto.offset.reset": "earliest",
                # Offsets are stored once a task's result is recorded and its wakeup
                # acknowledged (the tracker's order); auto-commit ships them.
                "enable.auto.offset.store": False,
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 1000,
                # A worker takes a few tasks at a time: a small prefetch keeps what waits in
                # its client (while its slots are full) small, and in Kafka for others.
                # What librdkafka prefetches beside the worker's own backlog (_BACKLOG_LIMIT).
                "queued.max.messages.kbytes": 4096,
                "enable.partition.eof": False,
            }
        )
        self._answers: queue.SimpleQueue[Answer | _Ended] = queue.SimpleQueue()
        self.presence = Presence(
            settings.pg_dsn,
            client_id,
            "worker",
            heartbeat_interval_s(settings.instance_timeout_s),
            settings.instance_timeout_s,
        )
        self.db = WorkerDatabase(
            settings.pg_dsn,
            client_id,
            ClaimRules(options.max_starts, settings.instance_timeout_s),
            self.outages["postgres"],
            self._answers.put,
            self.presence,
        )
        self.book = TaskBook()
        self.tracker = OffsetTracker()
        self._assigned: set[tuple[str, int]] = set()
        self._paused = False
        self._backlog: deque[Message] = deque()  # polled while the slots were full
        self._to_claim: deque[Task] = deque()  # received, in the order they came
        self._ready: deque[Task] = deque()  # claimed, in the order they came
        self._suspects: deque[Task] = deque()  # reruns, claimed and run one at a time
        self._solo: Task | None = None  # the rerun being claimed or run, alone
        self._to_record: list[tuple[Task, Outcome]] = []
        self._runners = self._make_runners()
        self._pace = ClaimPace(options.concurrency, options.held_limit, time.monotonic())
        self._wakeup_partitions: dict[str, int] = {}
        self._dlq_max_bytes = producer_max_bytes(settings)
        self._stop = threading.Event()
        self._stopping_since: float | None = None
        self._shutdown_by = 0.0
        self._next_watch = 0.0
        self._next_current_check = 0.0
        self._sent_at: dict[Task, float] = {}  # wakeups on their way, since when
        self.exit_code = 0
        self._next_stats_log = time.monotonic() + settings.stats_log_interval_s
        topics = [self.names.steps_for(q) for q in options.queues]
        self.probe = WorkerProbe(
            client_id, QueueLag(settings, options.queues, topics) if settings.health_port else None
        )
        self._health: HealthServer | None = None
        self.metrics = WorkerMetrics(
            self.telemetry,
            self.stats,
            lambda: (self.book.in_hand, self.book.count(State.RUNNING)),
            self.abandoned_alive,
            self._is_ready,
            lambda: len(self._assigned),
        )

    def _make_runners(self) -> dict[str, Runner]:
        if self.options.isolation == "process":
            runner = ProcessRunner(self.options, self._on_ended)
            return {"sync": runner, "async": runner}
        return {
            "sync": ThreadRunner(self.options.concurrency, self._execute, self._on_ended),
            "async": AsyncRunner(self._execute_async, self._on_ended),
        }

    # -- what the tests and tools read ------------------------------------------------------

    @property
    def executed(self) -> int:
        return self.stats.executed

    @property
    def dead_letters(self) -> int:
        return self.stats.dead_letters

    @property
    def fetched(self) -> int:
        """Tasks whose data was read from the database (not carried inline)."""
        return self.db.fetched

    @property
    def dropped(self) -> int:
        """Results not recorded: their run no longer exists (or cannot be stored at all)."""
        return self.db.dropped

    @property
    def in_flight(self) -> int:
        """Tasks held waiting to run, and running."""
        return self.book.in_hand + self.book.count(State.RUNNING)

    @property
    def assigned(self) -> int:
        return len(self._assigned)

    def abandoned_alive(self) -> int:
        return sum(r.abandoned_alive() for r in set(self._runners.values()))

    @property
    def last_loop_at(self) -> float:
        return self.probe.last_loop_at

    def stop(self) -> None:
        self._stop.set()

    def _is_ready(self) -> bool:
        """The ``ductor.ready`` gauge: what /readyz answers (without a database check of its
        own when no health server runs)."""
        if self._health is not None:
            return self._health.readiness().ok
        return not self.probe.problems(self.settings.health_stall_s)

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        """Serve the queues until stop() (or a bound of abandoned steps), then shut down
        cleanly. The health endpoints answer from before the first poll to after shutdown."""
        if self.settings.health_port:
            self._health = HealthServer(
                self.probe,
                self.settings.pg_dsn,
                self.settings.health_port,
                host=self.settings.http_host,
                stall_s=self.settings.health_stall_s,
            ).start()
        try:
            self._run()
        finally:
            if self._health is not None:
                self._health.stop()
                self._health = None
            if self.probe.lag is not None:
                self.probe.lag.close()

    def _run(self) -> None:
        topics = [self.names.steps_for(q) for q in self.options.queues]
        try:
            topic_partitions(self._producer, topics)
        except RuntimeError:
            missing = ", ".join(self.options.queues)
            raise RuntimeError(
                f"a steps topic of queue(s) {missing} does not exist: register a workflow"
                f" that uses the queue, or run `ductor topics create --queue {missing}`"
            ) from None
        self._wakeup_partitions = topic_partitions(self._producer, self.names.wakeup_topics())
        self.presence.register_now()
        self.presence.start()
        self.db.start()
        self._consumer.subscribe(
            topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )
        log.info(
            "worker started",
            extra={
                "instance": self.instance_id,
                "step_types": self.registry.types(),
                "queues": list(self.options.queues),
                "concurrency": self.options.concurrency,
                "isolation": self.options.isolation,
            },
        )
        try:
            while self._turn():
                pass
        finally:
            self._shutdown()

    def _turn(self) -> bool:
        """One turn: poll, take what the slots and the database answered, watch the running
        steps, ask for claims and records, deliver, store offsets. False: time to leave."""
        now = self.probe.last_loop_at = time.monotonic()
        if self._stop.is_set() and self._stopping_since is None:
            self._begin_stopping(now)
        self.probe.assigned_partitions = len(self._assigned)
        self.probe.database_ok = not self.outages["postgres"].active
        polled = self._poll()
        self._take_answers(_BUSY_WAIT_S if not polled and len(self.book) else 0.0)
        if now >= self._next_watch:
            self._next_watch = now + _WATCH_EVERY_S
            self._watch(now)
        self._ask()
        self._delivery.send_due(now)
        self._outbox.poll(0)
        self._store_offsets()
        if now >= self._next_stats_log:
            self._next_stats_log = now + self.settings.stats_log_interval_s
            self._log_stats()
        if self._stopping_since is not None:
            unfinished = len(self.book) > 0
            return unfinished and time.monotonic() < self._shutdown_by
        return True

    def _room(self) -> int:
        """How many more tasks the worker takes in: its prefetch, less what it holds waiting
        to run; nothing while it stops, or while tasks held for others pile up."""
        if self._stopping_since is not None:
            return 0
        waiting = self.book.count(State.HELD) + self.book.count(State.SUSPECT)
        if waiting >= _HELD_PER_SLOT * self.options.concurrency:
            return 0
        # (Tasks handed to a runner wait there for a free slot: they count too.)
        held = self.book.in_hand + self.book.count(State.RUNNING)
        return self.options.held_limit + self.options.concurrency - held

    def _poll(self) -> int:
        """Read records into the backlog (tracked from the moment they are read) while it has
        room, and take tasks from it while the worker has room. How many were taken.

        The partitions are paused only when the backlog is full, and resumed once it is down
        to a quarter: librdkafka drops what it prefetched for a paused partition and starts
        fetching again only some hundreds of ms after the resume, so pausing whenever the
        slots are full (every few tasks, under load) cost more time than the tasks did."""
        taken = 0
        room = self._room()
        while room > taken and self._backlog:
            self._intake(self._backlog.popleft())
            taken += 1
        space = _BACKLOG_LIMIT - len(self._backlog)
        if self._stopping_since is None and space > 0:
            idle = not len(self.book) and not self._backlog and not self._outbox.in_flight
            for message in self._consume(min(space, 500), _IDLE_POLL_S if idle else 0.0):
                if self._track(message) is None:
                    continue
                if room > taken:
                    self._intake(message)
                    taken += 1
                else:
                    self._backlog.append(message)
        else:
            self._consumer.poll(0)  # (paused: serves the group, returns no record)
        if len(self._backlog) >= _BACKLOG_LIMIT:
            self._pause(True)
        elif len(self._backlog) <= _BACKLOG_LIMIT // 4 and self._stopping_since is None:
            self._pause(False)
        return taken

    def _consume(self, count: int, wait_s: float) -> list[Message]:
        """Up to ``count`` records, waiting at most ``wait_s`` for the first (a batch consume
        waits for all ``count`` until its timeout: the first comes by poll instead)."""
        if wait_s <= 0:
            return self._consumer.consume(count, 0)
        first = self._consumer.poll(wait_s)
        if first is None:
            return []
        return [first, *self._consumer.consume(count - 1, 0)] if count > 1 else [first]

    def _pause(self, pause: bool) -> None:
        if pause == self._paused:
            return
        partitions = [TopicPartition(t, p) for t, p in self._assigned]
        if partitions:
            (self._consumer.pause if pause else self._consumer.resume)(partitions)
        self._paused = pause

    # -- intake -----------------------------------------------------------------------------

    def _track(self, message: Message) -> tuple[str, int] | None:
        """A record read: its offset is held from now on (None: an error, not a record)."""
        error = message.error()
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                self.stats.errors["consume"] += 1
                log.error("worker consumer error: %s", error)
            return None
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None
        self.tracker.started((topic, partition), offset)
        return (topic, partition)

    def _intake(self, message: Message) -> None:
        """A tracked record becomes a task in hand (or a dead letter, or is skipped)."""
        tp = (message.topic() or "", message.partition() or 0)
        offset = message.offset() or 0
        try:
            headers = normalise_headers(message)
            # The task's trace context rides on to the wakeup, so one trace follows the run
            # through its step round trips.
            trace_headers = [(k, v) for k, v in headers if k in ("traceparent", "tracestate")]
            step = decode_step_task(message.value())
        except Exception as exc:  # a poison task must never stop the worker
            self._dead_letter(message, tp, offset, exc)
            return
        if self.book.holds(step.key):
            self._skipped_at_intake(tp, offset, "duplicate")  # the task in hand covers it
            return
        if time.time() * 1000 >= step.deadline_ms:
            self._skipped_at_intake(tp, offset, "deadline")
            return
        kind, stamp = message.timestamp()
        produced = None if kind == TIMESTAMP_NOT_AVAILABLE else stamp
        task = Task(step, tp, offset, trace_headers, produced)
        self.book.add(task)
        self._to_claim.append(task)

    def _skipped_at_intake(self, tp: tuple[str, int], offset: int, reason: str) -> None:
        self.stats.skipped[reason] += 1
        self.tracker.done(tp, offset)

    def _dead_letter(
        self, message: Message, tp: tuple[str, int], offset: int, exc: Exception
    ) -> None:
        """A task that cannot be run goes to the dead-letter topic with why and where from."""
        detail = f"undecodable step task: {exc}"
        try:
            own = normalise_headers(message)
        except Exception:
            own = []
        reason = DeadLetterReason.WRONG_SCHEMA
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
            lambda: self.tracker.done(tp, offset),
        )

    # -- answers ----------------------------------------------------------------------------

    def _take_answers(self, wait_s: float) -> None:
        try:
            answer = self._answers.get(timeout=wait_s) if wait_s else self._answers.get_nowait()
            while True:
                self._answered(answer)
                answer = self._answers.get_nowait()
        except queue.Empty:
            pass

    def _answered(self, answer: Answer | _Ended) -> None:
        if isinstance(answer, _Ended):
            self._step_ended(answer)
        elif isinstance(answer, Claimed):
            if answer.tasks:
                self._pace.claimed(time.monotonic() - answer.tasks[0][0].asked_at)
            for task, verdict, starts, data in answer.tasks:
                self._claimed(task, verdict, starts, data)
        elif isinstance(answer, Recorded):
            for task, recorded in answer.tasks:
                if recorded:
                    self._wake(task)
                else:
                    self._done(task)
        elif isinstance(answer, NotCurrent):
            for task in answer.tasks:
                if task.state is State.RUNNING and not task.attempt.cancelled:
                    task.attempt.cancel()

    def _claimed(self, task: Task, verdict: Verdict, starts: int, data: Any) -> None:
        if task is self._solo and verdict is not Verdict.RUN:
            self._solo = None
        if not self.book.has(task):  # let go meanwhile (its partition went, the worker stops)
            if verdict is Verdict.RUN:
                self.db.unclaim([task])  # the next worker takes it as never started
            return
        if (task.revoked or self._stopping_since is not None) and verdict is not Verdict.RUN:
            self.book.remove(task)  # its partition's (next) owner claims it again
            return
        if verdict is Verdict.RUN:
            task.starts = starts
            if isinstance(data, MissingData):  # the attempt fails; a deleted run's is dropped
                self._record(task, Outcome.failed(f"the step's data: {data}"))
                return
            task.data = data
            self.book.move(task, State.READY)
            if task.revoked or self._stopping_since is not None:
                self._give_back([task])  # claimed, but the next owner will run it
            elif task is not self._solo:
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
                self._wake(task)  # its worker died before the run heard of the result
            else:
                self._done(task)

    def _dispatch(self) -> None:
        """Hand claimed tasks to their runner, in the order they came (a free slot takes the
        next at once). An attempt a worker that died had started (a rerun) runs alone:
        nothing else runs while it does, and nothing else is claimed, so a step that kills
        the process again is the only one it takes down with it (core/claims.py)."""
        solo = self._solo
        if solo is not None:
            if solo.state is State.READY and not self.book.count(State.RUNNING):
                self._start(solo)
            return
        while self._ready:
            task = self._ready.popleft()
            if task.state is State.READY and self.book.has(task):
                self._start(task)
        # The worker must be quiet first: nothing running, claimed or being recorded (a
        # result recorded before a crash is not run again; one in flight would be).
        if self._suspects and not any(
            self.book.count(s) for s in (State.RUNNING, State.CLAIMING, State.RECORDING)
        ):
            task = self._suspects.popleft()
            if task.state is State.SUSPECT and self.book.has(task):
                self._solo = task
                self.book.move(task, State.CLAIMING)
                self.db.claim_rerun(task)

    def _give_back(self, tasks: list[Task]) -> None:
        """Claimed tasks that will not run here (the worker stops, the partition went): their
        claims are given back, so the next worker takes them as never started."""
        if tasks:
            self.db.unclaim(tasks)
            for task in tasks:
                self.book.remove(task)

    # -- running ----------------------------------------------------------------------------

    def _start(self, task: Task) -> None:
        self.book.move(task, State.RUNNING)
        if task.starts > 1:
            self.stats.reruns += 1
            log.warning(
                "running a step again, alone: the worker that started it died (execution %d)",
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
        kind = "async" if self.registry.is_async(task.step.step_type) else "sync"
        self._runners[kind].submit(task)

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

    def _step_ended(self, ended: _Ended) -> None:
        task = ended.task
        if task.abandoned or task.state is not State.RUNNING:
            return
        if task is self._solo:
            self._solo = None
        self._pace.ended(time.monotonic())
        outcome = ended.outcome
        if outcome is not None:
            self.metrics.step_ended(task.step.step_type, (ended.ended_ns - ended.started_ns) / 1e6)
            if task.produced_ms is not None:
                self.metrics.step_started(max(0.0, ended.started_ns / 1e6 - task.produced_ms))
        if outcome is None:
            self.stats.skipped["deadline"] += 1
            self._end_span(task, None, "its deadline passed before it started")
            self._done(task)
            return
        self.stats.attempts[(task.step.step_type, outcome.outcome.value)] += 1
        self.stats.heartbeats += task.attempt.beats
        self._end_span(task, outcome)
        self._record(task, outcome)

    def _end_span(self, task: Task, outcome: Outcome | None, why: str | None = None) -> None:
        span, task.span = task.span, None
        if span is None:
            return
        if outcome is not None and outcome.error is None:
            end_ok(span, outcome.outcome.value, attempt=task.key.attempt)
        else:
            end_error(span, RuntimeError(why or (outcome.error if outcome else "") or "failed"))

    def _watch(self, now: float) -> None:
        """Steps past their deadline (and grace) or their heartbeat timeout are abandoned;
        long ones are asked whether their attempt still matters; a broker that does not
        acknowledge wakeups is an outage."""
        wall_ms = time.time() * 1000
        grace_ms = self.options.abandon_after_s * 1000
        long_running: list[Task] = []
        for task in self.book.in_state(State.RUNNING):
            if not task.started_ns:
                continue  # waiting for a slot (skipped by it if its deadline passes)
            step = task.step
            silent_ms = (now - task.attempt.beat_at) * 1000
            if wall_ms > step.deadline_ms + grace_ms:
                late_s = (wall_ms - step.deadline_ms) / 1000
                self._abandon(task, f"still running {late_s:.1f} s after its deadline")
                self._done(task)  # its attempt timed out at the coordinator
            elif step.heartbeat_timeout_ms is not None and silent_ms > step.heartbeat_timeout_ms:
                why = (
                    f"no heartbeat for {silent_ms / 1000:.1f} s"
                    f" (heartbeat_timeout_ms {step.heartbeat_timeout_ms})"
                )
                self._abandon(task, why)
                self._record(task, Outcome.failed(f"abandoned: {why}"))
            elif time.monotonic_ns() - task.started_ns > _CURRENT_CHECK_EVERY_S * 1e9:
                long_running.append(task)
        if long_running and now >= self._next_current_check:
            self._next_current_check = now + _CURRENT_CHECK_EVERY_S
            self.db.check_current(long_running)
        if self.abandoned_alive() > self.options.abandoned_limit and self.exit_code == 0:
            log.error(
                "%d abandoned steps are still running (at most %d): the worker stops, for its"
                " supervisor to start a fresh process",
                self.abandoned_alive(),
                self.options.abandoned_limit,
            )
            self.exit_code = EXIT_ABANDONED
            self.stop()
        waiting = min(self._sent_at.values(), default=None)
        if waiting is not None and now - waiting > _ACK_PATIENCE_S:
            self.outages["kafka"].failed(
                f"{len(self._sent_at)} wakeup(s), the oldest not acknowledged after"
                f" {now - waiting:.0f} s"
            )

    def _statements(self) -> dict[str, dict[str, int]]:
        """The database statements so far, by kind: how many, for how many tasks, how long."""
        return {
            kind: {"count": int(n), "tasks": int(rows), "ms": round(seconds * 1000)}
            for kind, (n, rows, seconds) in self.db.statements.items()
        }

    def _log_stats(self) -> None:
        """Totals and what the worker holds, every DUCTOR_STATS_LOG_INTERVAL_S."""
        log.info(
            "worker stats",
            extra={
                "instance": self.instance_id,
                "executed": self.stats.executed,
                "skipped": dict(self.stats.skipped),
                "abandoned": self.stats.abandoned,
                "reruns": self.stats.reruns,
                "held": {s.value: self.book.count(s) for s in State if self.book.count(s)},
                "backlog": len(self._backlog),
                "paused": self._paused,
                "statements": self._statements(),
            },
        )

    def _abandon(self, task: Task, why: str) -> None:
        if task is self._solo:
            self._solo = None
        kind = "async" if self.registry.is_async(task.step.step_type) else "sync"
        self._runners[kind].abandon(task)
        self.stats.abandoned += 1
        self.stats.heartbeats += task.attempt.beats
        log.warning("abandoned a step: %s", why, extra={**_ids(task), "reason": why})
        self._end_span(task, None, f"abandoned: {why}")

    # -- recording and waking ---------------------------------------------------------------

    def _record(self, task: Task, outcome: Outcome) -> None:
        self.book.move(task, State.RECORDING)
        self._to_record.append((task, outcome))

    def _ask(self) -> None:
        """Hand the database what gathered this turn: one request per kind; held tasks whose
        wait is over are claimed again."""
        now = time.monotonic()
        for task in self.book.in_state(State.HELD) if self.book.count(State.HELD) else ():
            if time.time() * 1000 >= task.step.deadline_ms:
                self.stats.skipped["deadline"] += 1
                self._done(task)  # the coordinator has moved on from it
            elif now >= task.claim_at:
                self.book.move(task, State.RECEIVED)
                self._to_claim.append(task)
        if self._to_record:
            self.db.record(self._to_record)
            self._to_record = []
        self._dispatch()
        if self._to_claim and not self._suspects and self._solo is None:
            # (While reruns wait, nothing new is claimed: they run first, each alone.) Claims
            # go ahead of the free slots as far as the pace says (core/claim_pace.py).
            waiting = max(0, self.book.count(State.RUNNING) - self.options.concurrency)
            ahead = self.book.count(State.CLAIMING) + self.book.count(State.READY) + waiting
            room = self._pace.limit(now) - ahead
            if room <= 0:
                return
            claims: list[Task] = []
            while self._to_claim and len(claims) < room:
                task = self._to_claim.popleft()
                if task.state is State.RECEIVED and self.book.has(task):
                    self.book.move(task, State.CLAIMING)
                    task.asked_at = now
                    claims.append(task)
            if claims:
                self.db.claim(claims)

    def _wake(self, task: Task) -> None:
        """Wake the task's run: its result is recorded (or was, by a worker that died)."""
        self.book.move(task, State.SENDING)
        step = task.step
        wakeup = Wakeup(
            run_id=step.run_id, reason="step_result", produced_at=int(time.time() * 1000)
        )
        topic = self.names.wakeup(step.tier)
        partition = choose_partition(
            step.run_id, self._wakeup_partitions[topic], self.settings.partition_by_run
        )
        self._sent_at[task] = time.monotonic()

        def delivered() -> None:
            self._sent_at.pop(task, None)
            self._done(task)

        self._delivery.send(
            topic, wakeup.encode(), wakeup.key(), partition, task.headers, delivered
        )

    def _done(self, task: Task) -> None:
        self.tracker.done(task.tp, task.offset)  # ignored when the partition went meanwhile
        self.book.remove(task)

    def _store_offsets(self) -> None:
        moved = self.tracker.committable()
        offsets = [
            TopicPartition(t, p, o) for (t, p), o in moved.items() if (t, p) in self._assigned
        ]
        if offsets:
            try:
                self._consumer.store_offsets(offsets=offsets)
            except KafkaException as exc:
                # Revoked meanwhile: its new owner claims those tasks and skips what ran.
                log.warning("could not store worker offsets: %s", exc)

    # -- rebalance --------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        consumer.incremental_assign(partitions)
        self._assigned |= {(p.topic, p.partition) for p in partitions}
        if self._paused and partitions:
            consumer.pause(partitions)
        log.info(
            "partitions assigned", extra={"count": len(partitions), "instance": self.instance_id}
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(consumer, partitions, commit=True)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(consumer, partitions, commit=False)

    def _release(self, consumer: Consumer, partitions: list[TopicPartition], commit: bool) -> None:
        """Give partitions back. Tasks not claimed yet are the next owner's; claimed ones
        run to their end here (the next owner finds them held, then recorded), their
        offsets no longer ours."""
        tps = {(p.topic, p.partition) for p in partitions}
        self._backlog = deque(m for m in self._backlog if (m.topic(), m.partition()) not in tps)
        ready: list[Task] = []
        for task in self.book.of_partitions(tps):
            task.revoked = True
            if task.state in (State.RECEIVED, State.HELD, State.SUSPECT):
                self.book.remove(task)
            elif task.state is State.READY and task is not self._solo:
                ready.append(task)
        self._give_back(ready)
        if commit:
            # Wakeups on their way count their tasks as done (briefly: a broker away must
            # not hold a rebalance); then what is done is committed.
            self._outbox.flush(min(2.0, self.settings.shutdown_timeout_s))
            self._store_offsets()
            try:
                consumer.commit(asynchronous=False)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError._NO_OFFSET:
                    log.warning("worker offset commit on revoke failed: %s", exc)
        for tp in tps:
            self.tracker.forget(tp)
        self._assigned -= tps
        log.info("partitions released", extra={"count": len(tps), "instance": self.instance_id})

    # -- stopping ---------------------------------------------------------------------------

    def _begin_stopping(self, now: float) -> None:
        """Take no new task; running ones finish (within the shutdown timeout), are recorded
        and announced. Tasks not claimed yet are left to the group (their offsets are not
        stored). With a dependency in an outage, nothing is waited for."""
        self._stopping_since = now
        self.probe.stopping = True
        wait_s = self.settings.shutdown_timeout_s
        if any(o.active for o in self.outages.values()):
            wait_s = 0.0
            self.db.give_up()
        self._shutdown_by = now + wait_s
        self._backlog.clear()
        ready: list[Task] = []
        for task in self.book:
            if task.state in (State.RECEIVED, State.HELD, State.SUSPECT):
                self.book.remove(task)
            elif task.state is State.READY:
                ready.append(task)
        self._give_back(ready)
        self._to_claim.clear()
        self._suspects.clear()
        self._solo = None
        self._pause(True)

    def _shutdown(self) -> None:
        for task in self.book.in_state(State.RUNNING):
            self._abandon(task, "the worker stopped before it ended")
        self._store_offsets()
        try:
            self._consumer.commit(asynchronous=False)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError._NO_OFFSET:
                log.warning("final worker offset commit failed: %s", exc)
        self._consumer.close()
        remaining = max(0.0, self._shutdown_by - time.monotonic()) if self._stopping_since else 0.0
        self._producer.flush(remaining)
        for runner in set(self._runners.values()):
            runner.close()
        self.db.close(max(1.0, remaining))
        self.presence.stop()
        self.telemetry.shutdown()
        log.info(
            "worker stopped",
            extra={
                "instance": self.instance_id,
                "executed": self.stats.executed,
                "skipped": dict(self.stats.skipped),
                "abandoned": self.stats.abandoned,
                "reruns": self.stats.reruns,
                "dead_letters": self.stats.dead_letters,
                "dropped": self.db.dropped,
                "fetched": self.db.fetched,
                "statements": self._statements(),
                "outages": {name: o.count for name, o in self.outages.items()},
                "exit_code": self.exit_code,
            },
        )


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


__all__ = ["EXIT_ABANDONED", "Worker"]
