"""The workers' consumer group's session timeout under the consumer group protocol (KIP-848).

How long a dead worker's queued tasks wait is, first of all, how long the broker waits for the
dead member before giving its partitions to the others: its session timeout, then up to one
heartbeat interval for a survivor to hear of its new assignment. Under the classic protocol the
consumer says both (io/kafka/clients.py, ``worker_consumer_config``); under the consumer protocol
they are the broker's (``group.consumer.session.timeout.ms``, 45 s by default), which a group may
override with its own ``consumer.session.timeout.ms`` and ``consumer.heartbeat.interval.ms``
(group configurations, Kafka 4.0+). Each worker sets them on its group as it starts, from
``DUCTOR_WORKER_SESSION_TIMEOUT_MS``: the same value every time, so the last worker to start
decides only if two disagree.

The broker bounds both (``group.consumer.min.session.timeout.ms``, 45 s by default, and
``group.consumer.min.heartbeat.interval.ms``, 5 s), and altering a group's configuration needs
the ALTER_CONFIGS operation on the group: a refusal is a warning naming what to change, never
a reason not to start (the broker's values then hold).
"""

from __future__ import annotations

import logging

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from processor.io.config.settings import Settings
from processor.io.kafka.configs import admin_config, worker_heartbeat_interval_ms
from processor.io.kafka.logs import with_logger

log = logging.getLogger("ductor.worker")

SESSION_TIMEOUT = "consumer.session.timeout.ms"
HEARTBEAT_INTERVAL = "consumer.heartbeat.interval.ms"
# What each group setting is bounded by on the broker, for the warning.
_BROKER_MINIMUM = {
    SESSION_TIMEOUT: "group.consumer.min.session.timeout.ms",
    HEARTBEAT_INTERVAL: "group.consumer.min.heartbeat.interval.ms",
}


def membership_note(settings: Settings) -> None:
    """A named worker under the consumer protocol: say what its name does and does not do
    (measured: processor/tools/failover.py, docs/operations/workers.md#membership-and-failover)."""
    if settings.worker_name and settings.group_protocol == "consumer":
        log.info(
            "worker %r is a static member of its group: restarted after a clean stop, it takes"
            " its partitions back at once; killed, it gets its name back only once its session"
            " ends (DUCTOR_WORKER_SESSION_TIMEOUT_MS), as under the consumer group protocol the"
            " broker holds it until then (DUCTOR_GROUP_PROTOCOL=classic on the workers gives"
            " it back at once)",
            settings.worker_name,
        )


def configure_worker_group(settings: Settings, timeout_s: float = 5.0) -> dict[str, int]:
    """Set the workers' group's session timeout and heartbeat interval on the broker (consumer
    protocol, ``DUCTOR_WORKER_SESSION_TIMEOUT_MS`` > 0); returns what the broker took. Nothing
    to do under the classic protocol (the consumer gives them) or with 0 (the broker's)."""
    session_ms = settings.worker_session_timeout_ms
    if settings.group_protocol != "consumer" or not session_ms:
        return {}
    admin = AdminClient(with_logger(admin_config(settings, f"{settings.worker_group_id}-config")))
    taken: dict[str, int] = {}
    # One request each: a heartbeat interval below the broker's minimum must not cost the
    # session timeout (a resource's changes are taken or refused together).
    for name, value in (
        (SESSION_TIMEOUT, session_ms),
        (HEARTBEAT_INTERVAL, worker_heartbeat_interval_ms(session_ms)),
    ):
        refusal = _set(admin, settings.worker_group_id, name, value, timeout_s)
        if refusal is None:
            taken[name] = value
        else:
            log.warning(
                "the broker did not take %s=%d for the workers' group %s: %s; its own value"
                " holds, and a dead worker's tasks wait that long for another worker (lower"
                " %s on the brokers, grant the workers ALTER_CONFIGS on the group, or set"
                " DUCTOR_WORKER_SESSION_TIMEOUT_MS=0 to keep the broker's without this line)",
                name,
                value,
                settings.worker_group_id,
                refusal,
                _BROKER_MINIMUM[name],
            )
    if taken:
        log.info(
            "the workers' group's session settings",
            extra={"group": settings.worker_group_id, **taken},
        )
    return taken


def _set(admin: AdminClient, group: str, name: str, value: int, timeout_s: float) -> str | None:
    """Set one configuration of ``group``; None once taken, else why not (one sentence)."""
    resource = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry(name, str(value), incremental_operation=AlterConfigOpType.SET)
        ],
    )
    try:
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(timeout=timeout_s)
    except KafkaException as exc:
        error = exc.args[0] if exc.args else None
        if isinstance(error, KafkaError):
            return f"{error.name()}: {error.str()}"
        return str(exc)
    except TimeoutError:
        return f"no answer from the broker within {timeout_s:.0f} s"
    return None
