"""One processor instance: the poll loop that feeds the executor, composed of the
collaborators engine/assembly.py builds (the composition root is here: ``Processor``).

Each turn: consume (engine/pace.py), judge each record (engine/intake.py), look at the group
(engine/membership.py), resume delay partitions that came due, feed ready records by tier
weight to the executor, advance the commit path (engine/executor.py), serve delivery reports,
store the offsets of finished records, hand sweep results on (engine/sweeps.py).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Set
from dataclasses import replace

from processor.core.routing import DEFAULT_QUEUE
from processor.core.shapes import TopicPartition
from processor.core.stats import Stats
from processor.engine.assembly import build_processor
from processor.engine.executor import Executor
from processor.engine.flow_control import FlowControl
from processor.engine.health import is_ready
from processor.engine.watchdog import Watchdog
from processor.io.config.settings import Settings
from processor.io.kafka.clients import broker_unreachable, topic_partitions
from processor.io.kafka.offsets import store_offsets
from processor.io.kafka.topics import topic_max_message_bytes
from processor.io.postgres import connections
from processor.io.postgres.db_errors import database_unreachable
from processor.io.postgres.trigger_store import load_triggers
from processor.io.runtime.clock import SYSTEM_CLOCK, Clock
from processor.io.runtime.collector import settle_collector
from processor.io.runtime.faults import NO_FAULTS, Faults
from processor.io.runtime.health_http import HealthServer
from processor.io.runtime.outage import Outage, until_available
from processor.io.telemetry.setup import Telemetry

log = logging.getLogger("ductor.processor")

# How long each try at the broker waits for its answer at start, before the backoff: short,
# so a stop is not kept waiting (librdkafka goes on connecting between two tries).
_START_TRY_S = 2.0


class Processor:
    """Constructing one touches no service; ``run`` connects and consumes."""

    def __init__(
        self,
        settings: Settings,
        stats: Stats | None = None,
        instance_id: str | None = None,
        telemetry: Telemetry | None = None,
        faults: Faults = NO_FAULTS,  # tests only: see io/runtime/faults.py
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id or f"ductor-{uuid.uuid4().hex[:8]}"
        self.stats = stats or Stats()
        self._stop = threading.Event()
        self.telemetry = telemetry or Telemetry.from_environment(
            "ductor-processor", settings.metrics_port, settings.group_id, settings.http_host
        )
        self.telemetry.group_id = settings.group_id
        if faults.armed:
            log.warning("fault injection armed (tests only): %s", ", ".join(faults.armed))
        parts = build_processor(
            settings, self.instance_id, self.stats, self.telemetry, self.stop, faults, clock
        )
        self._parts = parts
        self.names = parts.names
        self.probe = parts.probe
        self.client_errors = parts.client_errors  # its fatal one ends the process so
        self.partitions = parts.partitions
        self.rules = parts.rules
        self.executor: Executor = parts.executor
        self.requests = parts.requests
        self.triggers = parts.triggers
        self.presence = parts.presence
        self._publisher = parts.commons.publisher
        self._delivery = parts.commons.delivery
        self._tracker = parts.commons.tracker
        self._postgres = parts.commons.postgres
        self._membership = parts.membership
        self._sweeps = parts.sweeps
        self._intake = parts.intake
        self._pace = parts.pace
        self.telemetry.instrument(self.stats, self._membership.lag_now)
        self._health: HealthServer | None = None  # while run() serves the health endpoints
        self.telemetry.instrument_readiness(
            lambda: is_ready(self.probe, settings.health_stall_s, self._health),
            lambda: self.probe.assigned_partitions,
        )

    @property
    def watchdog(self) -> Watchdog:
        return self._sweeps.watchdog

    @property
    def flow(self) -> FlowControl:
        return self._membership.flow

    @property
    def assigned(self) -> Set[TopicPartition]:
        return self._membership.assigned

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        self.probe.stopping = True

    def run(self, until: Callable[[], bool] | None = None) -> None:
        """Consume until stop() is called (or ``until`` returns True), then shut down cleanly.
        The health endpoints (health.py) answer from before the first poll to after shutdown;
        the start waits for the broker and the database (``_start``)."""
        health = self._health = HealthServer.started_for(self.probe, self.settings)
        try:
            if self._start():
                log.info("processor started", extra={"instance": self.instance_id})
                log.info(self.settings.requests_scope.describe())
                settle_collector()
                while not self._stop.is_set() and not (until is not None and until()):
                    self.step()
        finally:
            try:
                self._shutdown()
            finally:
                if health is not None:
                    self._health = None
                    health.stop()

    def _start(self) -> bool:
        """Wait for the broker, then for the database, as for any outage (one line when it
        starts, one when it ends; ``/readyz`` says what is awaited, ``/healthz`` that the
        process is alive), then join the group. False: stopped meanwhile. A topic that does
        not exist is MissingTopic: waiting would not create it."""
        self.probe.waiting_for = "the broker"
        kafka = Outage("kafka", log)
        if not until_available(
            kafka, self._read_topics, broker_unreachable, self._stop, self._turn_while_starting
        ):
            return False
        self.probe.waiting_for = "the database"
        if not until_available(
            self._postgres,
            self._register_and_read_triggers,
            database_unreachable,
            self._stop,
            self._turn_while_starting,
        ):
            return False
        self.probe.waiting_for = None
        self._membership.watch(self.partitions)
        self._membership.subscribe()
        self.presence.start()
        return True

    def _register_and_read_triggers(self) -> None:
        self.presence.register_now()
        with connections.connect(self.settings.pg_dsn) as conn:
            self.triggers.follow(load_triggers(conn))  # (subscribed once started)

    def _read_topics(self) -> None:
        """The partition counts of every topic, and the largest record the dead-letter topic
        takes (a dead letter must fit it as well as the producer)."""
        topics = [*self.names.coordinator_topics(), *self.names.step_topics(DEFAULT_QUEUE)]
        topics.append(self.names.dlq)
        self.partitions.update(topic_partitions(self._parts.producer, topics, _START_TRY_S))
        dlq_limit = topic_max_message_bytes(self.settings, self.names.dlq, _START_TRY_S)
        if dlq_limit < self.rules.dlq_max_bytes:
            self.rules = replace(self.rules, dlq_max_bytes=dlq_limit)
            self.executor.use_rules(self.rules)
            self.requests.use_rules(self.rules)
            self._intake.use_rules(self.rules)
            self._sweeps.use_rules(self.rules)

    def _turn_while_starting(self) -> None:
        """The loop is alive (``/healthz``), and the clients' queues are served (their log
        lines: io/kafka/logs.py)."""
        self.probe.last_loop_at = self._pace.now()
        self._publisher.poll(0)
        self._membership.consumer.poll(0)  # (not subscribed yet: returns nothing)

    def step(self) -> None:
        """One turn of the loop: consume, resume, tick a batch, deliver, store offsets, sweep."""
        now = self._pace.now()
        self.probe.last_loop_at = now
        messages = self._pace.consume(self._membership.consumer)
        for message in messages:
            self._intake.take(message)
        self._membership.turn(now, bool(messages))
        flow = self._membership.flow
        flow.resume_due(now)
        self.requests.advance()
        self._pace.feed()
        self._delivery.send_due(now)
        self._sweeps.park_refused()
        self.executor.advance(self.settings.batch_size)
        self.probe.database_ok = self.executor.database_ok
        self._publisher.poll(0)
        store_offsets(self._membership.consumer, self._tracker.committable(), flow.assigned)
        self._sweeps.turn()
        if self._pace.stats_due(now):
            self._log_stats()
        self._membership.lag.maybe_update(now, set(flow.assigned), flow.paused())

    def _log_stats(self) -> None:
        """Totals every few seconds, and the runs that conflicted most since the last line
        (run ids go to the log, never to metric labels)."""
        hot = self.stats.take_hot_runs(5)
        log.info(
            "processor stats",
            extra={
                "instance": self.instance_id,
                "stats": self.stats.summary(),
                "hot_runs": [{"run_id": r, "conflicts": n} for r, n in hot],
            },
        )

    def _shutdown(self) -> None:
        self.probe.stopping = True
        now = self._pace.now()
        deadline = self._membership.deadline = now + self.settings.shutdown_timeout_s

        def left(at_least: float) -> float:
            return max(at_least, deadline - self._pace.now())

        # Runs still waiting (backing off, or not yet ticked) are dropped: their offsets were
        # not stored, so the group redelivers them. Effects already produced are flushed.
        if not self.executor.flush(left(0.1)):
            log.error("the batch in flight did not finish before the shutdown bound")
        if not self.requests.flush(left(0.1)):
            log.error("the request statement in flight did not finish before the shutdown bound")
        self.requests.drop_waiting()
        self.executor.drop_waiting()
        remaining = self._publisher.flush(left(0.1))
        if remaining:
            log.error(
                "%d effects still undelivered at shutdown; their records will be redone", remaining
            )
        self._membership.leave()
        # The outbox rows acknowledged since the last commit go now: left, they would be sent
        # again by the others once this instance is marked stopped.
        if not self.executor.delete_acknowledged(left(0.1)):
            log.error("the acknowledged outbox rows could not be deleted at shutdown")
        self.executor.close()
        self.requests.close()
        self._sweeps.close()
        self.presence.stop(max(0.5, min(2.0, deadline - self._pace.now())))
        self.telemetry.shutdown()
        log.info(
            "processor stopped", extra={"instance": self.instance_id, "stats": self.stats.summary()}
        )


__all__ = ["Processor"]
