"""Which librdkafka properties a ``DUCTOR_KAFKA_<PROPERTY>`` variable may set, and why not.

Every client of the project starts from its own defaults (io/kafka.py); a property given as a
``DUCTOR_KAFKA_*`` variable replaces the default. A few properties are the project's own: its
correctness depends on their value (offsets stored only once a record's work is done, an
idempotent producer, rebalance callbacks that assign incrementally), or another setting
already gives them. Those are refused at start with the reason, rather than silently
overwritten. Pure: names and sentences, no client.
"""

from __future__ import annotations

from collections.abc import Mapping

PASSTHROUGH_PREFIX = "DUCTOR_KAFKA_"

# The properties whose value is a secret: redacted wherever settings are shown or logged, and
# each may be read from a file (DUCTOR_KAFKA_SASL_PASSWORD_FILE, see config.py).
SECRET_PROPERTIES = frozenset(
    {
        "sasl.password",
        "sasl.oauthbearer.client.secret",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
    }
)

# property -> why the project sets it itself (one sentence, completed by the variable's name).
OWNED: Mapping[str, str] = {
    "bootstrap.servers": "set DUCTOR_BOOTSTRAP_SERVERS instead",
    "group.id": "set DUCTOR_GROUP_ID instead (the workers' group is <id>-workers)",
    "group.protocol": "set DUCTOR_GROUP_PROTOCOL instead",
    "partition.assignment.strategy": (
        "the rebalance callbacks assign partitions incrementally, which only cooperative-sticky"
        " does (DUCTOR_GROUP_PROTOCOL=classic sets it)"
    ),
    "enable.auto.offset.store": (
        "offsets are stored only once a record's work is committed and acknowledged; storing"
        " them as records are read would lose records at a crash"
    ),
    "enable.auto.commit": (
        "the offsets stored once each record's work is done reach the broker by the"
        " auto-commit (tune auto.commit.interval.ms instead)"
    ),
    "auto.offset.reset": (
        "a consumer without a committed offset must read from the earliest record, or it"
        " skips the wakeups and tasks written before it joined"
    ),
    "enable.partition.eof": (
        "each consumer sets it as its loop expects (the dead-letter reader stops at the end"
        " of each partition)"
    ),
    "enable.idempotence": (
        "the producers rely on it: no duplicate and no reordering from the client's own retries"
    ),
    "acks": "the idempotent producers need acks=all",
    "transactional.id": (
        "the producers are not transactional: a transactional producer cannot send outside a"
        " transaction"
    ),
    "message.max.bytes": (
        "it follows DUCTOR_MAX_RECORD_BYTES (the largest record the dead-letter path sends);"
        " set that instead"
    ),
}

# Under the consumer group protocol (KIP-848) these are the broker's: the client refuses them.
BROKER_SIDE_UNDER_CONSUMER_PROTOCOL = ("session.timeout.ms", "heartbeat.interval.ms")
# Only the consumer group protocol reads it: under the classic one it would do nothing.
CONSUMER_PROTOCOL_ONLY = ("group.remote.assignor",)


def variable_for(prop: str) -> str:
    """The ``DUCTOR_KAFKA_*`` variable that gives ``prop``."""
    return PASSTHROUGH_PREFIX + prop.upper().replace(".", "_")


def property_of(var: str) -> str:
    """The librdkafka property a ``DUCTOR_KAFKA_<PROPERTY>`` variable names."""
    return var[len(PASSTHROUGH_PREFIX) :].lower().replace("_", ".")


def refusal(prop: str, group_protocol: str) -> str | None:
    """Why ``prop`` may not be set by a ``DUCTOR_KAFKA_*`` variable (a sentence naming the
    variable), or None if it may."""
    var = variable_for(prop)
    if prop in OWNED:
        return f"{var}: {prop} is set by Ductor itself: {OWNED[prop]}"
    if group_protocol == "consumer" and prop in BROKER_SIDE_UNDER_CONSUMER_PROTOCOL:
        return (
            f"{var}: under the consumer group protocol {prop} is the broker's"
            " (group.consumer.session.timeout.ms, group.consumer.heartbeat.interval.ms);"
            " set it there, or DUCTOR_GROUP_PROTOCOL=classic to set it here"
        )
    if group_protocol == "classic" and prop in CONSUMER_PROTOCOL_ONLY:
        return (
            f"{var}: {prop} is read only under the consumer group protocol, and"
            " DUCTOR_GROUP_PROTOCOL is classic (its assignor is cooperative-sticky)"
        )
    return None
