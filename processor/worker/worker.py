"""A step worker: a task queue on Kafka that runs the users' step functions. This module is
the process around it (its loop, start and stop, health, presence) and its composition root:
it builds its parts (assembly.py puts the task flow together) around one injected clock
(io/runtime/clock.py). The life of each task is flow.py's, where the tasks come from source.py's.

So a step runs once per attempt unless a process died or a deadline passed, and one step never
holds back another: no batch barrier, at most ``concurrency`` steps at once; when its backlog
is full the worker pauses its partitions and keeps polling (the group never takes it for dead,
however long a step runs). The loop thread owns every task's state; the step slots and the
database lanes report to it through one queue.

Outages are ridden through, never a reason to exit (one log line when each starts and one when
it ends); a task that cannot be decoded is dead-lettered; a result that cannot be stored is
recorded as a failed attempt saying why. A stop (SIGTERM) lets running steps finish within
``DUCTOR_SHUTDOWN_TIMEOUT_S``, records and announces them, and leaves the rest for the group.
"""

from __future__ import annotations

import logging
import queue
import threading
import uuid

from confluent_kafka import Producer

from processor.core.routing import TopicNames
from processor.core.shapes import TopicPartition
from processor.io.config.settings import Settings
from processor.io.kafka.clients import ClientErrors, Publisher, broker_unreachable
from processor.io.kafka.configs import producer_config, producer_max_bytes
from processor.io.kafka.delivery import Delivery
from processor.io.kafka.logs import with_logger
from processor.io.kafka.worker_group import configure_worker_group, membership_note
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.db_errors import database_unreachable
from processor.io.postgres.worker_registry import Directory, partitions_doc
from processor.io.runtime.clock import SYSTEM_CLOCK, Clock
from processor.io.runtime.collector import settle_collector
from processor.io.runtime.exit_codes import EXIT_ABANDONED, EXIT_KAFKA_FATAL
from processor.io.runtime.faults import NO_FAULTS, Faults
from processor.io.runtime.health_http import HealthServer
from processor.io.runtime.outage import Outage, until_available
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.setup import Telemetry
from processor.worker import worker_parts as parts
from processor.worker.app import for_children
from processor.worker.assembly import FlowParts, build_flow, presence_of
from processor.worker.database import ClaimRules, WorkerDatabase
from processor.worker.messages import News
from processor.worker.options import WorkerOptions
from processor.worker.stats import WorkerStats
from processor.worker.steps import StepRegistry
from processor.worker.turns import BUSY_WAIT_S, Turns

log = logging.getLogger("ductor.worker")

# The last offset commit and the group's leave wait at least this long, whatever is left of
# the shutdown bound (none in an outage): a broker that answers takes them in milliseconds.
_LEAVE_AT_LEAST_S = 2.0


class Worker:
    def __init__(
        self,
        settings: Settings,
        registry: StepRegistry,
        options: WorkerOptions | None = None,
        telemetry: Telemetry | None = None,
        faults: Faults = NO_FAULTS,  # tests only: see io/runtime/faults.py
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        # Its own DSN (DUCTOR_WORKER_PG_DSN, else DUCTOR_PG_DSN) for every connection it
        # makes: the claims, the results, the heartbeat, the health endpoint's check.
        self.settings = settings = settings.for_worker()
        self.registry = registry
        self.options = options = for_children(options or WorkerOptions(), registry)
        self.names = TopicNames(settings.topic_prefix)
        self.instance_id = client_id = f"ductor-worker-{uuid.uuid4().hex[:8]}"
        self.stats = WorkerStats()
        # Its long-lived threads, watched: one that dies turns the health endpoints unhealthy.
        self.threads = ThreadWatch(faults)
        if faults.armed:
            log.warning("fault injection armed (tests only): %s", ", ".join(faults.armed))
        self.telemetry = telemetry or parts.worker_telemetry(settings)
        self.outages = {"postgres": Outage("postgres", log), "kafka": Outage("kafka", log)}
        # A fatal client error stops the worker (exit EXIT_KAFKA_FATAL, for its supervisor).
        self.client_errors = ClientErrors(self._fatal_client_error)
        self._producer = Producer(
            with_logger({**producer_config(settings, client_id), "error_cb": self.client_errors})
        )
        self._publisher = Publisher(self._producer)
        self._delivery = Delivery(self._publisher, self.stats.errors, outage=self.outages["kafka"])
        self.source = parts.task_source(
            settings, client_id, self.stats, self._releasing, self.client_errors, faults, self.names
        )
        self.clock = clock
        # Deadlines are Postgres's time: each heartbeat measures this process's offset from
        # it, and a task's deadline is taken in on this process's clock (io/postgres/db_clock.py).
        self.db_clock = DatabaseClock()
        # What it serves, in its registry row (`ductor workers`), and the other workers as the
        # registry shows them, read after its heartbeats while tasks of types it has no
        # function for wait for them (handback.py).
        self.directory = Directory(settings.worker_group_id, settings.instance_timeout_s)
        self.presence = presence_of(
            settings, options, registry, client_id, self.db_clock, self.threads, self.directory
        )
        self._holding = 0  # the source's assignment changes the registry was told of
        answers: queue.SimpleQueue[News] = queue.SimpleQueue()
        self.db = self._database(answers, faults)
        gauges = (self._is_ready, lambda: len(self.source.assigned))
        self.flow = build_flow(self._flow_parts(answers, faults), self.directory, client_id, gauges)
        self._stop = threading.Event()
        self.turns = Turns(clock, settings.stats_log_interval_s)
        self.exit_code = 0
        self.probe = parts.worker_probe(
            settings, self.names, options.queues, client_id, self.threads
        )
        self._health: HealthServer | None = None

    def _database(self, answers: queue.SimpleQueue[News], faults: Faults) -> WorkerDatabase:
        """Its two database lanes (claims, results), answering on the loop's queue."""
        return WorkerDatabase(
            self.settings.pg_dsn,
            self.instance_id,
            ClaimRules(self.options.max_starts, self.settings.instance_timeout_s),
            self.outages["postgres"],
            answers.put,
            self.presence,
            faults,
            self.threads,
            self.stats.isolated,
        )

    def _flow_parts(self, answers: queue.SimpleQueue[News], faults: Faults) -> FlowParts:
        """What its task flow is built from (assembly.py): its own parts, one clock."""
        settings = self.settings
        return FlowParts(
            options=self.options,
            registry=self.registry,
            names=self.names,
            stats=self.stats,
            telemetry=self.telemetry,
            clock=self.clock,
            db_clock=self.db_clock,
            answers=answers,
            ask=self.db.ask,
            delivery=self._delivery,
            flush=self._publisher.flush,
            kafka_outage=self.outages["kafka"],
            done_offset=self.source.done,
            too_many_abandoned=self._too_many_abandoned,
            partition_by_run=settings.partition_by_run,
            shutdown_timeout_s=settings.shutdown_timeout_s,
            dlq_max_bytes=producer_max_bytes(settings),
            faults=faults,
            threads=self.threads,
        )

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
        return sum(self.flow.in_flight())

    @property
    def assigned(self) -> int:
        return len(self.source.assigned)

    @property
    def last_loop_at(self) -> float:
        return self.probe.last_loop_at

    def stop(self) -> None:
        self._stop.set()

    def _fatal_client_error(self) -> None:
        self.exit_code = EXIT_KAFKA_FATAL
        self.stop()

    def _too_many_abandoned(self) -> None:
        self.exit_code = EXIT_ABANDONED
        self.stop()

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
        self._health = HealthServer.started_for(self.probe, self.settings)
        try:
            self._run()
        finally:
            if self._health is not None:
                self._health.stop()
                self._health = None
            if self.probe.lag is not None:
                self.probe.lag.close()

    def _run(self) -> None:
        try:
            if self._start():
                log.info(
                    "worker started",
                    extra={
                        "instance": self.instance_id,
                        "step_types": self.registry.served(),
                        "queues": list(self.options.queues),
                        "concurrency": self.options.concurrency,
                        "isolation": self.options.isolation,
                    },
                )
                settle_collector()
                while self._turn():
                    pass
        finally:
            self._shutdown()

    def _start(self) -> bool:
        """Wait for the broker, then for the database, as for any outage (one line when it
        starts, one when it ends; ``/readyz`` says what is awaited, ``/healthz`` that the
        worker is alive), then join the group. False: stopped meanwhile. A steps topic that
        does not exist is MissingTopic: waiting would not create it."""
        partitions: dict[str, int] = {}
        self.probe.waiting_for = "the broker"
        if not until_available(
            self.outages["kafka"],
            lambda: partitions.update(self._read_topics()),
            broker_unreachable,
            self._stop,
            self._turn_while_starting,
        ):
            return False
        self.probe.waiting_for = "the database"
        if not until_available(
            self.outages["postgres"],
            self.presence.register_now,
            database_unreachable,
            self._stop,
            self._turn_while_starting,
        ):
            return False
        self.probe.waiting_for = None
        configure_worker_group(self.settings)  # how soon a dead worker's tasks move
        membership_note(self.settings)
        self.presence.start()
        self.db.start()
        self.source.subscribe(partitions)
        return True

    def _read_topics(self) -> dict[str, int]:
        """The partition counts of the queues' steps topics (returned) and of the wakeup
        topics (for the flow)."""
        steps, wakeups = parts.read_topics(self._producer, self.names, self.options.queues)
        self.flow.wakeup_partitions(wakeups)
        return steps

    def _turn_while_starting(self) -> None:
        """The loop is alive (``/healthz``), and the clients' queues are served (their log
        lines: io/kafka/logs.py)."""
        self.probe.last_loop_at = self.clock.monotonic()
        self._publisher.poll(0)
        self.source.serve()
        if self.probe.lag is not None:
            self.probe.lag.serve()

    def _turn(self) -> bool:
        """One turn: poll, take what the slots and the database answered, watch the running
        steps, ask for claims and records, deliver, store offsets. False: time to leave."""
        turns = self.turns
        now = self.probe.last_loop_at = turns.now()
        if self._stop.is_set() and turns.stopping_since is None:
            self._begin_stopping(now)
        self.probe.assigned_partitions = len(self.source.assigned)
        if self.source.assignments != self._holding:  # (the registry says what it holds)
            self._holding = self.source.assignments
            self.presence.holding(partitions_doc(self.source.assigned))
        self.probe.database_ok = not self.outages["postgres"].active
        polled = self._poll()
        if self.source.keep_in_group(now) is not None:
            self.stats.rejoins += 1
        self.flow.take_answers(turns.answers_wait(polled, self.flow.holding()))
        if turns.watch_due(now):
            self.flow.watch(now)
        self.flow.ask()
        self._delivery.send_due(now)
        self._publisher.poll(0)
        if self.probe.lag is not None:
            self.probe.lag.serve()
        self.source.store_offsets()
        if turns.stats_due(now):
            self._log_stats()
        if turns.stopping_since is not None:
            return self.flow.holding() > 0 and turns.left_s() > 0
        return True

    def _poll(self) -> int:
        """Take new tasks while there is room (waiting a little for them when idle); how many
        were taken."""
        holding, backlog = self.flow.holding(), self.source.backlog
        in_flight = self._publisher.in_flight
        if Turns.send_now(holding, backlog, in_flight):
            self._publisher.flush(BUSY_WAIT_S)
            in_flight = self._publisher.in_flight
        wait_s = Turns.poll_wait(holding, backlog, in_flight)
        taken = self.source.take(
            max(0, self.flow.room()), wait_s, self.turns.stopping_since is None
        )
        for message in taken:
            self.flow.intake(message)  # (never raises: a task's exception is its own)
        return len(taken)

    def _releasing(self, tps: set[TopicPartition], commit: bool) -> None:
        self.flow.releasing(tps, commit)

    def _log_stats(self) -> None:
        """Totals and what the worker holds, every DUCTOR_STATS_LOG_INTERVAL_S."""
        log.info(
            "worker stats",
            extra={
                "instance": self.instance_id,
                **self.stats.totals(),
                "rejoins": self.stats.rejoins,
                "held": self.flow.held_by_state(),
                "backlog": self.source.backlog,
                "paused": self.source.paused,
                "statements": self.db.statements_done(),
            },
        )

    # -- stopping ---------------------------------------------------------------------------

    def _begin_stopping(self, now: float) -> None:
        """Take no new task; running ones finish (within the shutdown timeout), are recorded
        and announced. Tasks not claimed yet are left to the group (their offsets are not
        stored). With a dependency in an outage, nothing is waited for."""
        self.probe.stopping = True
        wait_s = self.settings.shutdown_timeout_s
        if any(o.active for o in self.outages.values()):
            wait_s = 0.0
            self.db.give_up()
        self.turns.begin_stopping(now, wait_s)
        self.source.stop_reading()
        self.flow.begin_stopping()

    def _shutdown(self) -> None:
        self.flow.abandon_running()
        self.source.close(max(_LEAVE_AT_LEAST_S, self.turns.left_s()))
        self._producer.flush(self.turns.left_s())
        self.flow.close()
        self.db.close(max(1.0, self.turns.left_s()))
        self.presence.stop()
        self.telemetry.shutdown()
        log.info(
            "worker stopped",
            extra={
                "instance": self.instance_id,
                **self.stats.totals(),
                "dead_letters": self.stats.dead_letters,
                "isolated": dict(self.stats.isolated),
                "dropped": self.db.dropped,
                "fetched": self.db.fetched,
                "statements": self.db.statements_done(),
                "outages": {name: o.count for name, o in self.outages.items()},
                "exit_code": self.exit_code,
            },
        )


__all__ = ["Worker"]
