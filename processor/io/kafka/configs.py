"""Each Kafka client's librdkafka configuration: its defaults, what the ``DUCTOR_KAFKA_*``
variables give, then what the project owns (io/config/kafka_properties.py says which)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from processor.io.config.settings import Settings


def producer_max_bytes(settings: Settings) -> int:
    """The largest record this project's producers send (``message.max.bytes``)."""
    return max(1_000_000, settings.max_record_bytes * 2)


# How long the producer retries a record before reporting it undelivered (librdkafka's
# message.timeout.ms, 300 s by default), set here so that it is known rather than inherited:
# a record the broker has not taken after two minutes is reported failed, counted and logged
# as an outage, and sent again by its own instance after a backoff (io/kafka/delivery.py). Nobody
# else re-sends it meanwhile (the outbox relay takes only the rows of instances that are
# gone), so the timeout bounds how long a delivery stays silent, not how many copies exist.
# DUCTOR_KAFKA_MESSAGE_TIMEOUT_MS overrides it.
DELIVERY_TIMEOUT_MS = 120_000


def client_config(
    settings: Settings, defaults: Mapping[str, Any], owned: Mapping[str, Any]
) -> dict[str, Any]:
    """A client's librdkafka configuration: its ``defaults``, replaced by whatever the
    ``DUCTOR_KAFKA_*`` variables give (``settings.kafka_extra``), then what the project
    ``owned`` (io/config/kafka_properties.py: a variable giving one of those is refused at
    start)."""
    return {**defaults, **settings.kafka_common(), **owned}


def producer_config(settings: Settings, client_id: str) -> dict[str, Any]:
    return client_config(
        settings,
        {
            "client.id": client_id,
            "message.timeout.ms": DELIVERY_TIMEOUT_MS,
            "linger.ms": 2,
            "compression.type": "lz4",
        },
        {
            "enable.idempotence": True,  # acks=all, in order, no duplicates from internal retries
            "message.max.bytes": producer_max_bytes(settings),
        },
    )


def consumer_config(settings: Settings, client_id: str) -> dict[str, Any]:
    """The processor's consumer."""
    return group_consumer_config(
        settings,
        settings.group_id,
        {
            "client.id": client_id,
            "auto.commit.interval.ms": 1000,
            "max.poll.interval.ms": 300_000,
            # A fetch waits for 64 KiB of records or 10 ms, whichever comes first. Answering
            # every fetch with whatever single record had arrived cost the broker, and the loop
            # that served it, far more than the records did: at a steady 4,500 wakeups/s the
            # instance, the broker and Postgres (fewer, larger batches) spent a third less CPU
            # per tick and the tail shortened (docs/performance.md). A backlog fills 64 KiB at
            # once; an idle partition's record waits 10 ms at most.
            "fetch.min.bytes": 64 * 1024,
            "fetch.wait.max.ms": 10,
            # What the client prefetches is the processor's memory when a backlog waits (the
            # records themselves stay in Kafka): a few MiB keep the pipeline full (one fetch is
            # thousands of wakeups) without the defaults' 50 MiB responses (bench_memory.py).
            "fetch.max.bytes": 4 * 1024 * 1024,
            "queued.max.messages.kbytes": 8192,
        },
    )


def worker_consumer_config(settings: Settings, client_id: str) -> dict[str, Any]:
    """A step worker's consumer of its queues' steps topics: a static member of its group
    when the worker has a name (``DUCTOR_WORKER_NAME``), with the workers' session timeout
    under the classic protocol (under the consumer protocol it is the group's: io/
    worker_group.py sets it)."""
    defaults: dict[str, Any] = {
        "client.id": client_id,
        "auto.commit.interval.ms": 1000,
        # What librdkafka prefetches beside the worker's own backlog.
        "queued.max.messages.kbytes": 4096,
    }
    session_ms = settings.worker_session_timeout_ms
    if settings.group_protocol == "classic" and session_ms:
        defaults["session.timeout.ms"] = session_ms
        defaults["heartbeat.interval.ms"] = worker_heartbeat_interval_ms(session_ms)
    owned = {"group.instance.id": settings.worker_name} if settings.worker_name else {}
    return group_consumer_config(settings, settings.worker_group_id, defaults, owned)


def worker_heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """How often a worker's consumer says it is alive: every second, or a third of its
    session timeout if that is shorter (three beats may be lost before it is taken for
    dead). A survivor learns its new assignment at its next beat, so this adds to the time
    a dead worker's tasks wait."""
    return min(1000, session_timeout_ms // 3)


def group_consumer_config(
    settings: Settings,
    group_id: str,
    defaults: Mapping[str, Any],
    owned: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A member of a consumer group whose offsets are stored by hand, only once a record's
    work is committed and its effects acknowledged; the auto-commit then only ships what was
    stored (at-least-once)."""
    protocol_defaults, protocol_owned = group_protocol_config(settings)
    return client_config(
        settings,
        {**protocol_defaults, **defaults},
        {
            "group.id": group_id,
            "auto.offset.reset": "earliest",
            "enable.auto.offset.store": False,
            "enable.auto.commit": True,
            "enable.partition.eof": False,
            **protocol_owned,
            **(owned or {}),
        },
    )


def group_protocol_config(settings: Settings) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rebalancing without stopping the world, by either group protocol (see config.py): the
    defaults a variable may replace, and what the rebalance callbacks depend on."""
    if settings.group_protocol == "consumer":
        return {"group.remote.assignor": "range"}, {"group.protocol": "consumer"}
    return (
        {"session.timeout.ms": 10_000, "heartbeat.interval.ms": 1000},
        {"partition.assignment.strategy": "cooperative-sticky"},
    )


def reader_config(settings: Settings, client_id: str, group_id: str) -> dict[str, Any]:
    """A consumer that joins no group and commits nothing (assign(), or metadata and offsets
    only): the group id only satisfies the client."""
    return client_config(
        settings,
        {"client.id": client_id},
        {
            "group.id": group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        },
    )


def admin_config(settings: Settings, client_id: str) -> dict[str, Any]:
    """An admin client (topics, configs, groups)."""
    return client_config(settings, {"client.id": client_id}, {})
