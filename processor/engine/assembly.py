"""How a processor instance is put together: its collaborators built in one place, around one
injected clock (io/runtime/clock.py) and Postgres's clock derived from it (io/postgres/db_clock.py).
processor.py is the composition root that calls ``build_processor``; a unit test builds any
one collaborator alone (``build_executor``, ``Pace``, ``Sweeps`` ...) with a ManualClock.

    consumer ─> intake ─> tier queues ─> pace ─> executor ─> producing ─> broker
                  │                                 │  └──> database stage (its thread)
                  └──> request desk ────────────────┤
                                      sweeps (watchdog thread) ──┘
    membership: the group, its rebalances, the release of partitions, the leave
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import Producer
from opentelemetry.trace import Span

from processor.core.flow import TierQueues
from processor.core.offsets import OffsetTracker
from processor.core.pending import RunBook
from processor.core.plans import Rules
from processor.core.records import Inbound
from processor.core.routing import TopicNames
from processor.core.stats import Stats
from processor.engine.acknowledged import Acknowledged
from processor.engine.database import Database
from processor.engine.executor import Executor
from processor.engine.health import Probe
from processor.engine.intake import RecordIntake
from processor.engine.ledger import Ledger
from processor.engine.membership import Membership
from processor.engine.pace import Pace
from processor.engine.recent_commits import RecentCommits
from processor.engine.request_desk import RequestDesk
from processor.engine.rewake import Rewake
from processor.engine.settling import Producing, Settler
from processor.engine.stage import DatabaseStage
from processor.engine.stage_failures import StageFailures
from processor.engine.sweeps import Sweeps
from processor.engine.trigger_follow import TriggerFollower
from processor.engine.watchdog import Shards, SweepSettings, Watchdog
from processor.io.config.settings import Settings
from processor.io.kafka.clients import ClientErrors, Publisher
from processor.io.kafka.configs import producer_config, producer_max_bytes
from processor.io.kafka.delivery import Delivery
from processor.io.kafka.logs import with_logger
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.instances import Presence, heartbeat_interval_s
from processor.io.postgres.outbox import OutboxRelay
from processor.io.postgres.trigger_store import TriggerSet
from processor.io.runtime.clock import SYSTEM_CLOCK, Clock
from processor.io.runtime.faults import NO_FAULTS, Faults
from processor.io.runtime.outage import Outage
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.setup import Telemetry


@dataclass(frozen=True)
class Commons:
    """What the commit path's collaborators share: the process's counters and telemetry, the
    producer and its delivery, the offsets, the clocks, the Postgres outage."""

    stats: Stats
    telemetry: Telemetry
    publisher: Publisher
    delivery: Delivery
    partitions: Mapping[str, int]  # filled by the processor once the topics are known
    tracker: OffsetTracker
    clock: Clock
    db_clock: DatabaseClock
    postgres: Outage
    faults: Faults
    threads: ThreadWatch
    ledger: Ledger
    rewake: Rewake
    acknowledged: Acknowledged  # outbox rows whose records the broker has, to delete
    settler: Settler


def commons(
    publisher: Publisher,
    partitions: Mapping[str, int],
    names: TopicNames,
    stats: Stats,
    telemetry: Telemetry,
    clock: Clock = SYSTEM_CLOCK,
    db_clock: DatabaseClock | None = None,
    tracker: OffsetTracker | None = None,
    faults: Faults = NO_FAULTS,
    threads: ThreadWatch | None = None,
    postgres: Outage | None = None,
    partition_by_run: bool = True,
) -> Commons:
    """What the commit path's collaborators share (``partition_by_run``: how records that
    follow a run choose their partition, io/kafka/clients.py)."""
    db_clock = db_clock or DatabaseClock(clock.wall_ms)
    # Counted and logged by Postgres's clock, like everything a run is judged by.
    ledger = Ledger(stats, telemetry, db_clock.now_ms)
    delivery = Delivery(publisher, stats.errors, clock.monotonic)
    tracker = tracker or OffsetTracker()
    acknowledged = Acknowledged(clock.monotonic)
    producing = Producing(delivery, partitions, partition_by_run, telemetry)
    return Commons(
        stats=stats,
        telemetry=telemetry,
        publisher=publisher,
        delivery=delivery,
        partitions=partitions,
        tracker=tracker,
        clock=clock,
        db_clock=db_clock,
        postgres=postgres or Outage("postgres", logging.getLogger("ductor.executor")),
        faults=faults,
        threads=threads or ThreadWatch(),
        ledger=ledger,
        rewake=Rewake(publisher, partitions, names, ledger, stats, db_clock.now_ms),
        acknowledged=acknowledged,
        settler=Settler(producing, acknowledged, tracker, ledger, stats, faults),
    )


def build_executor(
    c: Commons,
    database: Database,
    rules: Rules,
    book: RunBook[Span] | None = None,
    recent: RecentCommits | None = None,
    sleep: Callable[[float], object] = time.sleep,
    acknowledged: Acknowledged | None = None,
) -> Executor:
    """The executor, its database stage (ticks judged by Postgres's clock, phases timed by
    the process's) and its settler; ``book`` and ``acknowledged``: the runs it holds and the
    outbox rows it is to delete (a test's or a bench's to look into; None: its own)."""
    stage = DatabaseStage(database, rules, c.db_clock, c.faults, recent, c.threads, c.clock)
    return Executor(
        stage=stage,
        settler=c.settler,
        acknowledged=c.acknowledged if acknowledged is None else acknowledged,
        ledger=c.ledger,
        rewake=c.rewake,
        failures=StageFailures(c.stats, c.ledger, c.postgres, stage.close),
        rules=rules,
        stats=c.stats,
        book=book,
        clock=c.clock,
        wall_ms=c.db_clock.now_ms,
        faults=c.faults,
        sleep=sleep,
    )


@dataclass(frozen=True)
class ProcessorParts:
    """A processor's collaborators, as ``build_processor`` built them."""

    names: TopicNames
    commons: Commons
    probe: Probe
    client_errors: ClientErrors
    producer: Producer
    partitions: dict[str, int]
    queues: TierQueues[Inbound]
    rules: Rules
    presence: Presence
    executor: Executor
    requests: RequestDesk
    triggers: TriggerFollower
    membership: Membership
    sweeps: Sweeps
    intake: RecordIntake
    pace: Pace


def build_processor(
    settings: Settings,
    instance_id: str,
    stats: Stats,
    telemetry: Telemetry,
    stop: Callable[[], None],
    faults: Faults = NO_FAULTS,
    clock: Clock = SYSTEM_CLOCK,
) -> ProcessorParts:
    """Every collaborator of a processor instance; constructing them touches no service.
    ``stop``: what a fatal client error calls (the instance exits EXIT_KAFKA_FATAL)."""
    names = TopicNames(settings.topic_prefix)
    # Its long-lived threads, watched: one that dies turns the health endpoints unhealthy.
    threads = ThreadWatch(faults)
    client_errors = ClientErrors(stop)
    config = {**producer_config(settings, instance_id), "error_cb": client_errors}
    producer = Producer(with_logger(config))
    partitions: dict[str, int] = {}  # partition counts, read from the broker at start
    # Every time-based decision reads Postgres's clock (io/postgres/db_clock.py): each load and each
    # heartbeat measure this process's offset from it. One outage of Postgres as this
    # instance sees it: batches and sweeps both report to it, so an outage gives one line
    # when it starts and one when it ends.
    postgres = Outage("postgres", logging.getLogger("ductor.processor"))
    publisher = Publisher(producer)
    c = commons(
        publisher,
        partitions,
        names,
        stats,
        telemetry,
        clock,
        faults=faults,
        threads=threads,
        postgres=postgres,
        partition_by_run=settings.partition_by_run,
    )
    rules = Rules(names, settings.livelock_requeues, producer_max_bytes(settings))
    # What was committed just before a database restart: woken again after it, by the
    # commit path or the sweeps, whichever meets the new server first.
    recent = RecentCommits()
    database = Database(settings.pg_dsn, instance_id, settings.instance_timeout_s)
    executor = build_executor(c, database, rules, None, recent)
    requests = RequestDesk(
        settings.pg_dsn,
        executor,
        rules,
        c.db_clock.now_ms,
        postgres,
        clock.monotonic,
        faults,
        threads,
    )
    core = _Core(names, c, rules, recent, executor, requests)
    return _loop_parts(settings, instance_id, core, client_errors, producer, partitions)


@dataclass(frozen=True)
class _Core:
    """The commit path's parts, which the loop's are built around."""

    names: TopicNames
    c: Commons
    rules: Rules
    recent: RecentCommits
    executor: Executor
    requests: RequestDesk


def _loop_parts(
    settings: Settings,
    instance_id: str,
    core: _Core,
    client_errors: ClientErrors,
    producer: Producer,
    partitions: dict[str, int],
) -> ProcessorParts:
    """The loop's own collaborators, around the commit path."""
    c, names = core.c, core.names
    probe = Probe(instance_id, threads=c.threads)
    queues: TierQueues[Inbound] = TierQueues(settings.tier_weights.as_dict())
    triggers = TriggerFollower(names, settings.max_record_bytes, c.stats, c.faults)
    membership = Membership(
        settings=settings,
        instance_id=instance_id,
        names=names,
        clock=c.clock,
        client_errors=client_errors,
        lag_enabled=c.telemetry.meter_provider is not None,
        tracker=c.tracker,
        queues=queues,
        executor=core.executor,
        requests=core.requests,
        triggers=triggers,
        publisher=c.publisher,
        probe=probe,
        stats=c.stats,
        faults=c.faults,
    )
    presence = Presence(
        settings.pg_dsn,
        instance_id,
        "processor",
        heartbeat_interval_s(settings.instance_timeout_s),
        settings.instance_timeout_s,
        c.db_clock,
        c.threads,
    )
    sweeps = _sweeps(settings, instance_id, core, presence, membership, triggers, partitions)
    intake, pace = _turns(settings, core, client_errors, queues, triggers, membership, sweeps)
    return ProcessorParts(
        names, c, probe, client_errors, producer, partitions, queues, core.rules, presence,
        core.executor, core.requests, triggers, membership, sweeps, intake, pace,
    )  # fmt: skip


def _turns(
    settings: Settings,
    core: _Core,
    client_errors: ClientErrors,
    queues: TierQueues[Inbound],
    triggers: TriggerFollower,
    membership: Membership,
    sweeps: Sweeps,
) -> tuple[RecordIntake, Pace]:
    """What takes each record in, and what paces the loop's turns."""
    c = core.c
    intake = RecordIntake(
        names=core.names,
        max_record_bytes=settings.max_record_bytes,
        scope=settings.requests_scope,
        rules=core.rules,
        clock=c.clock,
        db_now_ms=c.db_clock.now_ms,
        tracker=c.tracker,
        queues=queues,
        executor=core.executor,
        requests=core.requests,
        triggers=triggers,
        flow=lambda: membership.flow,
        client_errors=client_errors,
        stats=c.stats,
        faults=c.faults,
    )
    pace = Pace(
        clock=c.clock,
        batch_size=settings.batch_size,
        batch_linger_ms=settings.batch_linger_ms,
        buffer_limit=settings.tier_buffer_limit,
        stats_every_s=settings.stats_log_interval_s,
        queues=queues,
        executor=core.executor,
        requests=core.requests,
        sweeps=sweeps,
        publisher=c.publisher,
        delivery=c.delivery,
        flow=lambda: membership.flow,
    )
    return intake, pace


def _sweeps(
    settings: Settings,
    instance_id: str,
    core: _Core,
    presence: Presence,
    membership: Membership,
    triggers: TriggerFollower,
    partitions: Mapping[str, int],
) -> Sweeps:
    """The watchdog (its sweeps on a thread of their own) and what hands their results on."""
    c = core.c

    def owned_shards() -> Shards:
        """The watchdog sweeps the runs of the bulk-tier partitions this instance owns."""
        topic = core.names.wakeup("t2")
        owned = sorted(p for t, p in set(membership.assigned) if t == topic)
        return partitions[topic], owned

    def use_triggers(found: TriggerSet) -> None:
        if triggers.follow(found):
            membership.subscribe()

    watchdog = Watchdog(
        database=Database(settings.pg_dsn),
        names=core.names,
        owned_shards=owned_shards,
        # While the broker does not take every record, records left in the outbox are this
        # instance's own, still being retried: relaying them would only add.
        may_relay=lambda: c.delivery.healthy_for(settings.relay_after_s),
        relay_as=lambda: OutboxRelay(
            instance_id, presence.may_judge(), settings.instance_timeout_s
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
        monotonic=c.clock.monotonic,
        wall_ms=c.db_clock.now_ms,
        faults=c.faults,
        recent=core.recent,
        threads=c.threads,
    )
    return Sweeps(
        watchdog=watchdog,
        executor=core.executor,
        settler=c.settler,
        rewake=c.rewake,
        ledger=c.ledger,
        delivery=c.delivery,
        stats=c.stats,
        postgres=c.postgres,
        rules=core.rules,
        use_triggers=use_triggers,
    )


__all__ = ["Commons", "ProcessorParts", "build_executor", "build_processor", "commons"]
