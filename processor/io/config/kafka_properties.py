"""Which librdkafka properties a ``DUCTOR_KAFKA_<PROPERTY>`` variable may set, and why not.

Every client of the project starts from its own defaults (io/kafka/clients.py); a property given as
a
``DUCTOR_KAFKA_*`` variable replaces the default. A few properties are the project's own: its
correctness depends on their value (offsets stored only once a record's work is done, an
idempotent producer, rebalance callbacks that assign incrementally), or another setting
already gives them. Those are refused at start with the reason, rather than silently
overwritten. Pure: names and sentences, no client.
"""

from __future__ import annotations

from collections.abc import Mapping

PASSTHROUGH_PREFIX = "DUCTOR_KAFKA_"

# The properties whose value is a secret: each may be read from a file
# (DUCTOR_KAFKA_SASL_PASSWORD_FILE, see config.py) and is never shown or logged. They are the
# properties librdkafka itself flags as sensitive (rdkafka_conf.c's _RK_SENSITIVE, which its
# own debug dump redacts), with the alias of one of them, but for those that only name an
# account or a file (sasl.username, ssl.key.location, ...private.key.file): the error messages
# and `ductor config show` print those, as they tell which credential without giving it.
SECRET_PROPERTIES = frozenset(
    {
        "sasl.password",
        "sasl.oauthbearer.config",  # may hold a client secret or an unsecured token's claims
        "sasl.oauthbearer.client.secret",
        "sasl.oauthbearer.client.credentials.client.secret",  # the alias of the one above
        "sasl.oauthbearer.assertion.private.key.passphrase",
        "sasl.oauthbearer.assertion.private.key.pem",
        "ssl.key.password",
        "ssl.key.pem",
        "ssl.keystore.password",
    }
)
# Words that make any other property hidden too where settings are shown: a property a later
# librdkafka adds (or a typo of a known one) whose name says it carries a secret is hidden
# before anyone has listed it. A PEM value (a key, or a certificate) is hidden whole.
_SECRET_WORDS = ("password", "secret", "passphrase", "private.key")
_SECRET_SUFFIXES = (".pem",)


def is_secret(prop: str) -> bool:
    """Whether the value of librdkafka property ``prop`` is hidden wherever it is shown."""
    name = prop.strip().lower()
    if name in SECRET_PROPERTIES or name.endswith(_SECRET_SUFFIXES):
        return True
    # A file's path is not the secret it holds (ssl.key.location, ...private.key.file).
    if name.endswith((".file", ".location")):
        return False
    return any(word in name for word in _SECRET_WORDS)


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
