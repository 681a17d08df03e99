"""Kafka plumbing: partition choice, the one way to produce a record (``produce``, which waits
while the local queue is full), a producer wrapper that reports each record's delivery to a
callback, the clients' error callback, a topic's partitions, and the broker's refusals told
apart from its absence. The clients' configuration is in ``configs.py``, the consumers'
offsets in ``offsets.py``.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from processor.core.records import Headers
from processor.core.routing import partition_for
from processor.io.config.settings import Settings
from processor.io.kafka.errors import KafkaAuthError, MissingTopic
from processor.io.runtime.exit_codes import EXIT_KAFKA_FATAL

log = logging.getLogger("ductor.kafka")

# librdkafka's own delivery report: the error (None once acknowledged) and the message.
DeliveryReport = Callable[[KafkaError | None, Any], None]

_QUEUE_FULL_POLL_S = 0.05


def produce(
    producer: Producer,
    topic: str,
    value: bytes | None,
    key: bytes | None,
    partition: int | None = None,
    headers: Headers | None = None,
    on_delivery: DeliveryReport | None = None,
) -> None:
    """Produce one record; while the producer's local queue is full, serve delivery reports
    (``poll``) until there is room, so a fast loop slows down instead of failing."""
    kwargs: dict[str, Any] = {"key": key, "value": value}
    if partition is not None:
        kwargs["partition"] = partition
    if headers:
        kwargs["headers"] = headers
    if on_delivery is not None:
        kwargs["on_delivery"] = on_delivery
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(_QUEUE_FULL_POLL_S)


def choose_partition(run_id: str, partitions: int, by_run: bool) -> int:
    """``partition_for`` when co-partitioning by run is on; otherwise any partition, as a
    producer that does not co-partition would do (the benchmark measures the difference)."""
    return partition_for(run_id, partitions) if by_run else random.randrange(partitions)


class ClientErrors:
    """A Kafka client's error callback (``error_cb``). A fatal error (an idempotent producer
    fenced, a static member fenced by another with its ``group.instance.id``) means the
    client will never work again: it is logged once and ``on_fatal`` stops the service,
    which exits with ``EXIT_KAFKA_FATAL`` for its supervisor instead of running on without
    a working client. Other errors are librdkafka's reports of what it retries by itself (a
    broker down), which the outage handling already reports: logged at debug."""

    def __init__(self, on_fatal: Callable[[], None]) -> None:
        self._on_fatal = on_fatal
        self.fatal: str | None = None  # the first fatal error

    def __call__(self, err: KafkaError) -> None:
        if err.fatal():
            self.failed(err.str())
        else:
            log.debug("kafka client error: %s", err)

    def failed(self, what: str) -> None:
        """A fatal error, from the callback or as a consumed record's error (code _FATAL:
        the consumer reports its own fatal error so)."""
        if self.fatal is None:
            self.fatal = what
            log.critical(
                "fatal Kafka client error: %s; the process stops (exit code %d) for its"
                " supervisor to start a fresh one",
                what,
                EXIT_KAFKA_FATAL,
            )
            self._on_fatal()


class Publisher:
    """Produces records; the broker's acknowledgement (or final refusal) of each comes back
    through its delivery report, served by ``poll``."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer

    @property
    def in_flight(self) -> int:
        """What waits for this client: records queued or not yet acknowledged, and delivery
        reports (or client events) waiting for ``poll`` (librdkafka's out-queue length, so no
        Python wrapper around each delivery report is needed to count)."""
        return len(self._producer)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: DeliveryReport,
        partition: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        produce(self._producer, topic, value, key, partition, headers, on_delivery)

    def poll(self, timeout: float = 0.0) -> None:
        self._producer.poll(timeout)

    def flush(self, timeout: float) -> int:
        """Wait for outstanding deliveries; returns how many are still outstanding."""
        remaining: int = self._producer.flush(timeout)
        return remaining


def topic_partitions(
    client: Producer | AdminClient, topics: Sequence[str], timeout_s: float = 10.0
) -> dict[str, int]:
    """Partition counts of ``topics``: KafkaException when no broker answers within
    ``timeout_s`` (``broker_unreachable``), MissingTopic when one answers without a topic. A
    topic created a moment ago can be missing from the metadata of a broker that has not
    caught up yet, so ask again until ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        metadata = client.list_topics(timeout=timeout_s).topics
        missing = [
            t
            for t in topics
            if t not in metadata or metadata[t].error is not None or not metadata[t].partitions
        ]
        if not missing:
            return {t: len(metadata[t].partitions) for t in topics}
        if time.monotonic() > deadline:
            raise MissingTopic(
                f"topic {missing[0]} does not exist; run `ductor topics create` first"
            )
        time.sleep(0.2)  # metadata propagation; bounded by the deadline above


def broker_unreachable(exc: Exception) -> str | None:
    """What a failed request to the broker says, when it says that no broker answered (an
    outage to wait out); None for any other failure. librdkafka's own errors (negative
    codes: transport, timed out, all brokers down) are the outage; an error code the broker
    answered with is a refusal, not an outage, and so is a missing topic (MissingTopic).
    Refused credentials are found before (``check_authentication``)."""
    if isinstance(exc, TimeoutError):  # a request's future that got no answer in time
        return "no answer from the broker"
    error = exc.args[0] if isinstance(exc, KafkaException) and exc.args else None
    if isinstance(error, KafkaError) and error.code() < 0:
        return error.str()
    return None


# librdkafka's error text: "<protocol>://<host:port>/<id>: <reason> (after 314ms in state X)".
_BROKER_PREFIX = re.compile(r"^\w+://([^/\s]+)/\S*:\s*")
_STATE_SUFFIX = re.compile(r"\s*\(after \d+ms in state \w+\)\s*$")


def check_authentication(settings: Settings, timeout_s: float = 10.0) -> None:
    """With a SASL security protocol, connect once and raise ``KafkaAuthError`` if the broker
    refuses the credentials (librdkafka would otherwise retry them forever, silently for the
    caller). Returns as soon as the broker answers a metadata request, when every broker is
    unreachable (an outage is the caller's to ride through, not a configuration error), or
    after ``timeout_s``. librdkafka's own log lines go to a logger that drops them, so the
    caller's one-sentence error is the only output."""
    protocol = str(settings.kafka_extra.get("security.protocol", "")).upper()
    if not protocol.startswith("SASL"):
        return
    errors: list[KafkaError] = []
    config: dict[str, Any] = {
        **settings.kafka_common(),
        "client.id": "ductor-auth-check",
        "error_cb": errors.append,
        # Not registered with logging, and above every level: it drops what it is given.
        "logger": logging.Logger("ductor.kafka.auth-check", logging.CRITICAL + 1),
    }
    admin = AdminClient(config)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            admin.list_topics(timeout=0.2)
            return
        except KafkaException:
            pass  # no answer yet: the error callback says why, on the next poll
        admin.poll(0.05)
        refused = next((e for e in errors if e.code() == KafkaError._AUTHENTICATION), None)
        if refused is not None:
            raise KafkaAuthError(refusal_message(settings, refused.str()))
        if any(e.code() == KafkaError._ALL_BROKERS_DOWN for e in errors):
            return


def refusal_message(settings: Settings, text: str) -> str:
    """The sentence for librdkafka's authentication error ``text``: the broker, the user and
    the mechanism, never the password."""
    protocol = str(settings.kafka_extra.get("security.protocol", "")).upper()
    broker = _BROKER_PREFIX.match(text)
    reason = _STATE_SUFFIX.sub("", _BROKER_PREFIX.sub("", text)).rstrip(".")
    extra = settings.kafka_extra
    mechanism = extra.get("sasl.mechanism") or extra.get("sasl.mechanisms") or "GSSAPI"
    user = extra.get("sasl.username")
    return (
        f"the Kafka broker{f' at {broker.group(1)}' if broker else ''} refused to authenticate"
        f" this client{f' as user {user!r}' if user else ''} ({protocol}, {mechanism}: {reason});"
        " check DUCTOR_KAFKA_SASL_USERNAME, DUCTOR_KAFKA_SASL_PASSWORD and"
        " DUCTOR_KAFKA_SASL_MECHANISM"
    )
