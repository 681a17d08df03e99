"""One processor instance: the poll loop that feeds the executor.

Each turn: consume, judge each record (core/intake.py), resume delay partitions that came due,
feed ready records by tier weight to the executor, advance the commit path, serve delivery
reports, store the offsets of finished records, hand sweep results on.

The loop never sleeps on a delay: a delay partition whose head is not due is paused (and the
record sought back) until its due time, a conflicted run waits in the executor's book with a
ready time, and the consume timeout is the time to the next of those events.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Set
from dataclasses import replace

from confluent_kafka import Consumer, KafkaError, Message, Producer, TopicPartition

from processor.core.decide import Rules, hop, reject
from processor.core.flow import TierQueues
from processor.core.intake import (
    Accepted,
    Hop,
    NotDue,
    Reject,
    Requested,
    Skipped,
    Verdict,
    admit,
)
from processor.core.membership import Holding, Stuck
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Inbound, KafkaMessage, normalise_headers
from processor.core.routing import DEFAULT_QUEUE, TIERS, TopicNames
from processor.core.stats import Stats
from processor.engine.database import Database
from processor.engine.executor import Executor
from processor.engine.flow_control import FlowControl
from processor.engine.health import HealthServer, Probe, is_ready
from processor.engine.lag import LagMeter
from processor.engine.recent_commits import RecentCommits
from processor.engine.request_desk import RequestDesk
from processor.engine.trigger_follow import TriggerFollower
from processor.engine.watchdog import Shards, SweepResult, SweepSettings, Watchdog
from processor.io.config.settings import Settings
from processor.io.kafka.clients import ClientErrors, Outbox, broker_unreachable, topic_partitions
from processor.io.kafka.configs import consumer_config, producer_config, producer_max_bytes
from processor.io.kafka.group_watch import GroupWatch, holding, let_go_by_fault
from processor.io.kafka.logs import with_logger
from processor.io.kafka.offsets import (
    commit_positions,
    leave_group,
    positions_to_commit,
    read_finished,
    store_offsets,
)
from processor.io.kafka.topics import topic_max_message_bytes
from processor.io.postgres import connections
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.db_errors import database_unreachable
from processor.io.postgres.instances import Presence, heartbeat_interval_s
from processor.io.postgres.outbox import OutboxRelay
from processor.io.postgres.trigger_store import TriggerSet, load_triggers
from processor.io.runtime.collector import settle_collector
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.runtime.outage import Outage, until_available
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.logs import describe, first_line
from processor.io.telemetry.setup import Telemetry

log = logging.getLogger("ductor.processor")

# While a batch is in flight and nothing is left to take, the loop waits this long for it at
# most before its next turn (delivery reports, sweeps, new records): a short wait that ends
# when the batch does, instead of a spin that took the GIL from the batch's own thread.
_BUSY_WAIT_S = 0.005
_IDLE_POLL_S = 0.1
# How long each try at the broker waits for its answer at start, before the backoff: short,
# so a stop is not kept waiting (librdkafka goes on connecting between two tries).
_START_TRY_S = 2.0
# The last offset commit and the group's leave wait at least this long, whatever is left of
# the shutdown bound: a broker that answers takes them in milliseconds.
_LEAVE_AT_LEAST_S = 2.0


class Processor:
    """Constructing one touches no service; ``run`` connects and consumes."""

    def __init__(
        self,
        settings: Settings,
        stats: Stats | None = None,
        instance_id: str | None = None,
        telemetry: Telemetry | None = None,
        faults: Faults = NO_FAULTS,  # tests only: see io/runtime/faults.py
    ) -> None:
        self.settings = settings
        self.instance_id = instance_id or f"ductor-{uuid.uuid4().hex[:8]}"
        self.stats = stats or Stats()
        self.names = TopicNames(settings.topic_prefix)
        # Its long-lived threads, watched: one that dies turns the health endpoints unhealthy.
        self.threads = ThreadWatch(faults)
        self.probe = Probe(self.instance_id, threads=self.threads)
        self._stop = threading.Event()
        # A fatal client error stops the instance (exit EXIT_KAFKA_FATAL, for its supervisor).
        self.client_errors = ClientErrors(self.stop)
        self._producer = Producer(
            with_logger(
                {**producer_config(settings, self.instance_id), "error_cb": self.client_errors}
            )
        )
        self.outbox = Outbox(self._producer)
        self.partitions: dict[str, int] = {}  # partition counts, read from the broker in run()
        self.tracker = OffsetTracker()
        self.queues: TierQueues[Inbound] = TierQueues(settings.tier_weights.as_dict())
        self.telemetry = telemetry or Telemetry.from_environment(
            "ductor-processor", settings.metrics_port, settings.group_id, settings.http_host
        )
        self.telemetry.group_id = settings.group_id
        # One outage of Postgres as this instance sees it: batches and sweeps both report to
        # it, so an outage gives one line when it starts and one when it ends.
        self.postgres = Outage("postgres", log)
        self._faults = faults
        self._intake_fault = faults.at(Point.INTAKE)  # (asked per record: a bool)
        if faults.armed:
            log.warning("fault injection armed (tests only): %s", ", ".join(faults.armed))
        self.rules = Rules(self.names, settings.livelock_requeues, producer_max_bytes(settings))
        # This instance in the registry: the outbox rows it commits are its own, relayed by
        # others only once it is gone.
        # Every time-based decision reads Postgres's clock (io/postgres/db_clock.py): each load and
        # each heartbeat measure this process's offset from it.
        self.clock = DatabaseClock()
        self.presence = Presence(
            settings.pg_dsn,
            self.instance_id,
            "processor",
            heartbeat_interval_s(settings.instance_timeout_s),
            settings.instance_timeout_s,
            self.clock,
            self.threads,
        )
        # What was committed just before a database restart: woken again after it, by the
        # commit path or the sweeps, whichever meets the new server first.
        recent = RecentCommits()
        self.executor = Executor(
            recent=recent,
            database=Database(settings.pg_dsn, self.instance_id),
            outbox=self.outbox,
            partitions=self.partitions,
            rules=self.rules,
            partition_by_run=settings.partition_by_run,
            tracker=self.tracker,
            stats=self.stats,
            telemetry=self.telemetry,
            faults=faults,
            postgres=self.postgres,
            clock=self.clock,
            threads=self.threads,
        )
        # Start and signal requests from upstream producers (ductor.requests), within the
        # scope the operator set (core/scopes.py): said once started, unscoped or not.
        self.requests_scope = settings.requests_scope
        self.requests = RequestDesk(
            settings.pg_dsn,
            self.executor,
            self.rules,
            self.clock.now_ms,
            self.postgres,
            faults=faults,
            threads=self.threads,
        )
        self.watchdog = Watchdog(
            database=Database(settings.pg_dsn),
            names=self.names,
            owned_shards=self._owned_shards,
            may_relay=lambda: self.executor.may_relay(settings.relay_after_s),
            relay_as=lambda: OutboxRelay(
                self.instance_id, self.presence.may_judge(), settings.instance_timeout_s
            ),
            settings=SweepSettings(
                settings.sweep_interval_s,
                settings.sweep_grace_s,
                settings.stuck_after_s,
                settings.sweep_limit,
                settings.relay_after_s,
                settings.kept_signal_ttl_s,
                settings.trigger_refresh_s,
            ),
            wall_ms=self.clock.now_ms,
            faults=faults,
            recent=recent,
            threads=self.threads,
        )
        # The triggers followed (their source topics are subscribed to), read at start and by
        # the watchdog's sweeps every DUCTOR_TRIGGER_REFRESH_S.
        self.triggers = TriggerFollower(self.names, settings.max_record_bytes, self.stats, faults)
        self._consumer, self.lag, self.flow = self._new_member()
        # Looks at the group when nothing has come for a while (built once the partition
        # counts are read, in run()).
        self.group_watch: GroupWatch | None = None
        self.telemetry.instrument(self.stats, self._lag_now)
        self._health: HealthServer | None = None  # while run() serves the health endpoints
        self.telemetry.instrument_readiness(
            lambda: is_ready(self.probe, settings.health_stall_s, self._health),
            lambda: self.probe.assigned_partitions,
        )
        self._next_stats_log = time.monotonic() + settings.stats_log_interval_s
        self._shutdown_deadline: float | None = None
        self._leaving = False  # it left its group: the close's callbacks find nothing to do

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
                log.info(self.requests_scope.describe())
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
            self.postgres,
            self._register_and_read_triggers,
            database_unreachable,
            self._stop,
            self._turn_while_starting,
        ):
            return False
        self.probe.waiting_for = None
        self.group_watch = GroupWatch(
            self.settings,
            self.settings.group_id,
            {t: self.partitions[t] for t in self.names.coordinator_topics()},
            self.settings.group_stall_s,
            time.monotonic(),
            self._faults,
        )
        self._subscribe()
        self.presence.start()
        return True

    def _register_and_read_triggers(self) -> None:
        self.presence.register_now()
        with connections.connect(self.settings.pg_dsn) as conn:
            self.triggers.follow(load_triggers(conn))  # (subscribed once started)

    def _use_triggers(self, found: TriggerSet) -> None:
        if self.triggers.follow(found):
            self._subscribe()

    def _read_topics(self) -> None:
        """The partition counts of every topic, and the largest record the dead-letter topic
        takes (a dead letter must fit it as well as the producer)."""
        topics = [*self.names.coordinator_topics(), *self.names.step_topics(DEFAULT_QUEUE)]
        topics.append(self.names.dlq)
        self.partitions.update(topic_partitions(self._producer, topics, _START_TRY_S))
        dlq_limit = topic_max_message_bytes(self.settings, self.names.dlq, _START_TRY_S)
        if dlq_limit < self.rules.dlq_max_bytes:
            self.rules = replace(self.rules, dlq_max_bytes=dlq_limit)
            self.executor.use_rules(self.rules)
            self.requests.use_rules(self.rules)

    def _turn_while_starting(self) -> None:
        """The loop is alive (``/healthz``), and the clients' queues are served (their log
        lines: io/kafka/logs.py)."""
        self.probe.last_loop_at = time.monotonic()
        self.outbox.poll(0)
        self._consumer.poll(0)  # (not subscribed yet: returns nothing)

    def step(self) -> None:
        """One turn of the loop: consume, resume, tick a batch, deliver, store offsets, sweep."""
        now = time.monotonic()
        self.probe.last_loop_at = now
        messages = self._consume()
        for message in messages:
            try:
                self._intake(message)
            except Exception as exc:  # the record's alone: never the loop's
                self._intake_failed(message, exc)
        assert self.group_watch is not None
        stuck = self.group_watch.turn(now, bool(messages), self._holding)
        if stuck is not None:
            self._join_again(stuck, now)
        self.flow.resume_due(now)
        self.requests.advance()
        self._feed_executor()
        self.executor.send_due(now)
        self.watchdog.park(self.executor.take_parked())
        self.executor.advance(self.settings.batch_size)
        self.probe.database_ok = self.executor.database_ok
        self.outbox.poll(0)
        self._store_offsets()
        for sweep in self.watchdog.maybe_sweep():
            try:
                self._hand_on(sweep)
            except Exception as exc:  # the next sweep finds what this one left
                self.executor.isolated("sweep", "a sweep's results", exc)
        self._maybe_log_stats(now)
        self.lag.maybe_update(now, set(self.flow.assigned), self.flow.paused())

    def _hand_on(self, sweep: SweepResult) -> None:
        """What a sweep found, to the executor (each item isolated there) and the log."""
        if sweep.isolated:
            self.stats.isolated["sweep"] += sweep.isolated
        if sweep.error is not None:
            self.stats.errors[type(sweep.error).__name__] += 1
            self.postgres.failed(f"watchdog sweep: {first_line(sweep.error)}")
            return
        if not self.executor.busy:
            self.postgres.ok()  # (while a batch is in flight, its outcome says)
        self.executor.replay_after_restart(sweep.replay)
        self.executor.stuck_failed(sweep.force_failed)
        self.executor.send_outboxed(sweep.ended)
        self.executor.rewake(sweep.overdue)
        self.executor.relay(sweep.relay)
        self.executor.dead_letter_kept(sweep.expired, self.watchdog.forget)
        if sweep.triggers is not None:
            self._use_triggers(sweep.triggers)
        if sweep.overdue:
            log.info("watchdog re-woke %d overdue run(s)", len(sweep.overdue))
        if sweep.relay:
            log.info(
                "relaying the records of %d transition(s) left in the outbox", len(sweep.relay)
            )

    @property
    def assigned(self) -> Set[tuple[str, int]]:
        return self.flow.assigned

    def _owned_shards(self) -> Shards:
        """The watchdog sweeps the runs of the bulk-tier partitions this instance owns."""
        topic = self.names.wakeup("t2")
        owned = sorted(p for t, p in set(self.flow.assigned) if t == topic)
        return self.partitions[topic], owned

    def _maybe_log_stats(self, now: float) -> None:
        """Totals every few seconds, and the runs that conflicted most since the last line
        (run ids go to the log, never to metric labels)."""
        if now < self._next_stats_log:
            return
        self._next_stats_log = now + self.settings.stats_log_interval_s
        hot = self.stats.take_hot_runs(5)
        log.info(
            "processor stats",
            extra={
                "instance": self.instance_id,
                "stats": self.stats.summary(),
                "hot_runs": [{"run_id": r, "conflicts": n} for r, n in hot],
            },
        )

    def _consume(self) -> list[Message]:
        batch = self.settings.batch_size
        messages: list[Message] = self._consumer.consume(batch, 0)
        if messages:
            return messages
        if self.executor.busy:
            # Nothing to take: wait for the batch in flight rather than spin (the client keeps
            # fetching meanwhile); this returns the moment the batch is done.
            self.executor.wait_for_stage(_BUSY_WAIT_S)
            return []
        timeout = self._idle_timeout()
        if timeout <= 0:
            return []
        first = self._consumer.poll(timeout)
        if first is None:
            return []
        rest: list[Message] = self._consumer.consume(
            batch - 1, self.settings.batch_linger_ms / 1000
        )
        return [first, *rest]

    def _idle_timeout(self) -> float:
        """How long the loop may block in poll: until the next due event, at most 100 ms."""
        now = time.monotonic()
        if self.outbox.in_flight:
            return 0.005  # delivery reports wait for this loop
        if len(self.queues) or self.executor.book.ready_count(now):
            return 0.0
        deadlines = [
            d
            for d in (
                self.executor.book.next_ready_at(),
                self.executor.next_send_at(),
                self.flow.next_resume_at(),
                self.watchdog.next_at,
                self.requests.next_at(),
            )
            if d is not None
        ]
        until_next = min(deadlines, default=now + _IDLE_POLL_S) - now
        return max(0.0, min(_IDLE_POLL_S, until_next))

    # -- intake ------------------------------------------------------------------------------

    def _intake(self, message: KafkaMessage) -> None:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._FATAL:  # the consumer's own, reported so
                self.client_errors.failed(str(error))
            elif error.code() != KafkaError._PARTITION_EOF:
                self.stats.errors["consume"] += 1
                log.error("consumer error: %s", error)
            return
        topic, partition = message.topic(), message.partition()
        assert topic is not None and partition is not None
        tp = (topic, partition)
        offset = message.offset()
        if offset is not None and self.tracker.done_before(tp, offset):
            # Its previous owner did it (a dead letter sent, a tick committed) and committed
            # an offset below it: not done twice (core/offsets.py).
            self.stats.done_before += 1
            return
        if self.flow.waits_for_due_head(tp):
            return  # prefetched behind a not-due head: it will be read again after the resume
        if self.triggers.is_source(topic):
            self._intake_trigger(message)
            return
        now_ms = self.clock.now_ms()
        verdict = admit(
            message, self.names, self.settings.max_record_bytes, now_ms, self.requests_scope
        )
        if isinstance(verdict, NotDue):
            self.flow.hold_until_due(tp, verdict.record.offset, time.monotonic(), verdict.wait_ms)
            return
        # From here the record is taken: its offset is held back until it is done.
        record = verdict.record
        self.tracker.started(record.tp, record.offset)
        if self._intake_fault:
            self._faults.hit(Point.INTAKE, _run_id_of(verdict))
        if isinstance(verdict, Reject):
            plan = reject(record, verdict.reason, verdict.detail, self.rules)
            self.executor.carry_out_now(record, plan)
            return
        self.stats.records += 1
        if isinstance(verdict, Requested):
            self.requests.add(record, verdict.request)
            return
        if isinstance(verdict, Hop):
            plan = hop(record, verdict.target_ms, now_ms, self.names)
            self.executor.carry_out_now(record, plan, traced=False)
            return
        assert isinstance(verdict, Accepted)
        self.queues.push(record.tier, record)

    def _intake_failed(self, message: KafkaMessage, exc: Exception) -> None:
        """Taking a record in raised what nobody foresaw: the record is taken (if it was not
        yet) and dead-lettered with why, so its offset passes and the loop goes on."""
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        self.executor.isolated("intake", f"{topic}[{partition}]@{offset}", exc)
        if topic is None or partition is None or offset is None:
            return  # not a record (the consumer's own event): nothing to take
        record = Inbound((topic, partition), offset, message.key(), message.value(), [], "")
        with contextlib.suppress(Exception):  # (else the dead letter goes without them)
            record.headers = normalise_headers(message)
        self.tracker.started(record.tp, offset)
        plan = reject(record, DeadLetterReason.UNEXPECTED_ERROR, describe(exc), self.rules)
        self.executor.carry_out_now(record, plan)

    def _intake_trigger(self, message: KafkaMessage) -> None:
        verdict = self.triggers.admit(message)
        if verdict is None:
            return
        record = verdict.record
        self.tracker.started(record.tp, record.offset)
        if isinstance(verdict, Requested):
            self.requests.add(record, verdict.request)
        elif isinstance(verdict, Skipped):
            self.tracker.done(record.tp, record.offset)  # nothing to do: done at once
        else:
            plan = reject(record, verdict.reason, verdict.detail, self.rules)
            self.executor.carry_out_now(record, plan)

    def _feed_executor(self) -> None:
        room = self.settings.batch_size - self.executor.book.ready_count(time.monotonic())
        if room > 0:
            for record in self.queues.take(room):
                self.executor.add(record)
        backlog = {source: self.queues.size(source) for source in (*TIERS, "delay")}
        backlog["requests"] = backlog["trigger"] = len(self.requests)
        limit = self.settings.tier_buffer_limit
        self.flow.apply_backpressure(backlog, self.executor.waiting_records, limit)

    def _store_offsets(self) -> None:
        store_offsets(self._consumer, self.tracker.committable(), self.flow.assigned)

    # -- the group ---------------------------------------------------------------------------

    def _new_member(self) -> tuple[Consumer, LagMeter, FlowControl]:
        """A consumer, not subscribed yet, and what reads and steers it."""
        consumer = Consumer(
            with_logger(
                {**consumer_config(self.settings, self.instance_id), "error_cb": self.client_errors}
            )
        )
        lag = LagMeter(consumer, enabled=self.telemetry.meter_provider is not None)
        return consumer, lag, FlowControl(consumer, self.names, lag)

    def _lag_now(self) -> Mapping[tuple[str, int], int]:
        return self.lag.read()  # (the current member's meter: a new member has its own)

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            [*self.names.coordinator_topics(), *sorted(self.triggers.by_topic)],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _holding(self) -> Holding:
        held = set(self.flow.assigned)
        return holding(self._consumer, held, held - self.flow.paused())

    def _join_again(self, stuck: Stuck, now: float) -> None:
        """The member is stuck (io/kafka/group_watch.py): give back what it holds, as on a
        revocation, leave the group, and join it again with a new consumer."""
        log.warning(
            "joining the group again",
            extra={"instance": self.instance_id, "reason": stuck.reason, "waiting": stuck.waiting},
        )
        self.stats.rejoins += 1
        old = self._consumer
        # Everything goes back as on a revocation, but the commit is not waited for: a stuck
        # client's coordinator may not answer. A record redone by the next owner costs a
        # tick that finds its row moved on (auto-commit had shipped the offsets within 1 s).
        held = {(p.topic, p.partition) for p in old.assignment()} & self.flow.assigned
        left = self.flow.assigned - held  # (the client had let these go: none of its own)
        for tps, commit in ((held, True), (left, False)):
            if tps:
                self._release(old, [TopicPartition(t, p) for t, p in tps], commit, wait=False)
        self._consumer, self.lag, self.flow = self._new_member()
        self._subscribe()
        assert self.group_watch is not None
        self.group_watch.joined_again(now, old)

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if let_go_by_fault(self._faults, consumer, partitions):
            return
        uncommitted = read_finished(consumer, partitions, self.tracker)
        consumer.incremental_assign([self.triggers.start_at(p, uncommitted) for p in partitions])
        tps = {(p.topic, p.partition) for p in partitions}
        self.flow.assigned_now(tps)
        self.probe.assigned_partitions = len(self.flow.assigned)
        log.info("partitions assigned", extra={"count": len(tps), "instance": self.instance_id})

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._ours(consumer):
            self._release(consumer, partitions, commit=True)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._ours(consumer):
            self._release(consumer, partitions, commit=False)

    def _ours(self, consumer: Consumer) -> bool:
        """Whether a rebalance callback is the instance's to act on: not one of a retired
        consumer closing (see RetiredConsumers), nor of the close after it left."""
        return consumer is self._consumer and not self._leaving

    def _wait_bound(self) -> float:
        """How long a rebalance or the shutdown may wait for in-flight work."""
        if self._shutdown_deadline is not None:
            return max(0.1, self._shutdown_deadline - time.monotonic())
        return min(10.0, self.settings.shutdown_timeout_s)

    def _release(
        self,
        consumer: Consumer,
        partitions: list[TopicPartition],
        commit: bool,
        wait: bool = True,
    ) -> None:
        """Give partitions back: drop their waiting records (the next owner redoes them), let
        effects already produced finish so their records count as done, then commit
        (``wait``: for the broker's answer)."""
        tps = {(p.topic, p.partition) for p in partitions}
        # The batch in flight finishes first, so its outcome is known; bounded, because a hung
        # database must not hold a rebalance (or a shutdown) hostage. If it does not finish,
        # its records are simply redone by the partitions' next owner.
        if not self.executor.flush(self._wait_bound()):
            log.error("the batch in flight did not finish before the partitions were released")
        if not self.requests.flush(self._wait_bound()):
            log.error("the request statement in flight did not finish before the release")
        self.requests.drop_partitions(tps)
        self.queues.drop(lambda r: r.tp in tps)
        self.executor.drop_partitions(tps)
        if commit:
            self.outbox.flush(min(5.0, self._wait_bound()))
            failure = "offset commit on revoke failed: %s"
            commit_positions(consumer, self.tracker, tps, failure, wait)
            # Acknowledged outbox rows go now, before the partitions' next owner meets them.
            self.executor.delete_acknowledged(min(5.0, self._wait_bound()))
        for tp in tps:
            self.tracker.forget(tp)
        self.flow.released(tps)
        self.probe.assigned_partitions = len(self.flow.assigned)
        log.info("partitions released", extra={"count": len(tps), "instance": self.instance_id})

    def _shutdown(self) -> None:
        self.probe.stopping = True
        deadline = self._shutdown_deadline = time.monotonic() + self.settings.shutdown_timeout_s
        # Runs still waiting (backing off, or not yet ticked) are dropped: their offsets were
        # not stored, so the group redelivers them. Effects already produced are flushed.
        if not self.executor.flush(max(0.1, deadline - time.monotonic())):
            log.error("the batch in flight did not finish before the shutdown bound")
        if not self.requests.flush(max(0.1, deadline - time.monotonic())):
            log.error("the request statement in flight did not finish before the shutdown bound")
        self.requests.drop_waiting()
        self.executor.drop_waiting()
        remaining = self.outbox.flush(max(0.1, deadline - time.monotonic()))
        if remaining:
            log.error(
                "%d effects still undelivered at shutdown; their records will be redone", remaining
            )
        # What is held goes as on a revocation (its work was finished or dropped above), then
        # the last commit and the close, bounded (io/kafka/clients.py's leave_group): the close's
        # callbacks have nothing left to do.
        held = set(self.flow.assigned)
        offsets = positions_to_commit(self.tracker, held)
        for tp in held:
            self.tracker.forget(tp)
        self.flow.released(held)
        self.probe.assigned_partitions = 0
        log.info("partitions released", extra={"count": len(held), "instance": self.instance_id})
        self._leaving = True
        leave_group(
            self._consumer,
            offsets,
            "final offset commit failed: %s",
            max(_LEAVE_AT_LEAST_S, deadline - time.monotonic()),
        )
        if self.group_watch is not None:
            self.group_watch.close(max(0.1, min(2.0, deadline - time.monotonic())))
        # The outbox rows acknowledged since the last commit go now: left, they would be sent
        # again by the others once this instance is marked stopped.
        if not self.executor.delete_acknowledged(max(0.1, deadline - time.monotonic())):
            log.error("the acknowledged outbox rows could not be deleted at shutdown")
        self.executor.close()
        self.requests.close()
        self.watchdog.close()
        self.presence.stop(max(0.5, min(2.0, deadline - time.monotonic())))
        self.telemetry.shutdown()
        log.info(
            "processor stopped", extra={"instance": self.instance_id, "stats": self.stats.summary()}
        )


def _run_id_of(verdict: Verdict) -> str:
    """The run a record taken in names, for the intake's fault point ("": none known)."""
    if isinstance(verdict, Requested):
        return verdict.request.run_id
    wakeup = verdict.record.wakeup
    return "" if wakeup is None else wakeup.run_id
