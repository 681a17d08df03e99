"""Kafka plumbing: client configuration, partition choice, the one way to produce a record
(``produce``, which waits while the local queue is full), and a producer wrapper that reports
each record's delivery to a callback.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from processor.core.offsets import OffsetTracker, decode_finished
from processor.core.records import Headers
from processor.core.routing import partition_for
from processor.io.config.settings import Settings
from processor.io.kafka.errors import KafkaAuthError, MissingTopic

log = logging.getLogger("ductor.kafka")

# librdkafka's own delivery report: the error (None once acknowledged) and the message.
DeliveryReport = Callable[[KafkaError | None, Any], None]

_QUEUE_FULL_POLL_S = 0.05
# How long a newly assigned partition's committed offset (and metadata) is waited for.
_COMMITTED_S = 5.0


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


# The exit code of a service whose Kafka client reported a fatal error: the client cannot go on,
# a fresh process can (its supervisor starts one).
EXIT_KAFKA_FATAL = 4


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


def store_offsets(
    consumer: Consumer, moved: dict[tuple[str, int], int], assigned: Set[tuple[str, int]]
) -> None:
    """Store the positions the offset tracker moved (``committable()``), for the partitions
    still ``assigned`` (auto-commit then ships them). A partition revoked meanwhile is its
    next owner's: it redoes what was not committed."""
    offsets = [TopicPartition(t, p, o) for (t, p), o in moved.items() if (t, p) in assigned]
    if offsets:
        try:
            consumer.store_offsets(offsets=offsets)
        except KafkaException as exc:
            log.warning("could not store offsets: %s", exc)


def commit_positions(
    consumer: Consumer,
    tracker: OffsetTracker,
    tps: Iterable[tuple[str, int]],
    failure: str,
    wait: bool = True,
) -> None:
    """Commit now, for the partitions ``tps`` (given up, or at the end), the tracker's safe
    position (``positions_to_commit``). ``failure`` is logged with the error if the broker
    refuses; ``wait=False`` sends the commit without waiting for it (a member leaving a client
    that may not answer)."""
    commit_offsets(consumer, positions_to_commit(tracker, tps), failure, wait)


def positions_to_commit(
    tracker: OffsetTracker, tps: Iterable[tuple[str, int]]
) -> list[TopicPartition]:
    """The tracker's safe position of each of ``tps`` where it has one, with what is done past
    it in the commit's metadata (core/offsets.py): the partitions' next owner does not do those
    records again."""
    offsets = []
    for topic, partition in tps:
        position = tracker.position((topic, partition))
        if position is None:
            continue  # nothing done here: what was committed before stands
        metadata = tracker.commit_metadata((topic, partition), position)
        offsets.append(TopicPartition(topic, partition, position, metadata=metadata))
    return offsets


def commit_offsets(
    consumer: Consumer, offsets: list[TopicPartition], failure: str, wait: bool = True
) -> None:
    """Commit ``offsets`` now (``positions_to_commit``); see ``commit_positions``."""
    if not offsets:
        return
    try:
        # Stored too: librdkafka's own commits (auto-commit, and the one it makes on a
        # revocation) ship the stored offsets, and must not drop the metadata.
        consumer.store_offsets(offsets=offsets)
        if wait:
            consumer.commit(offsets=offsets, asynchronous=False)
        else:
            consumer.commit(offsets=offsets, asynchronous=True)
    except KafkaException as exc:
        log.warning(failure, exc)


def leave_group(
    consumer: Consumer, offsets: list[TopicPartition], failure: str, bound_s: float
) -> bool:
    """A member's last commit of ``offsets`` and its consumer's close, on a thread of their
    own, waited for at most ``bound_s``. With the broker away both wait for its group
    coordinator: a commit behind an auto-commit that cannot reach it, and a close behind any
    commit outstanding, each until its request times out (a worker stopped in a broker outage
    waited past its supervisor's patience; a close alone waited 45 s). A shutdown must not.
    False: the process leaves without them; the partitions' next owner redoes what was done
    since the last commit the broker took (a step task finds its attempt claimed or ended, a
    wakeup a row that moved on). The caller has released what it held and ignores the
    rebalance callbacks the close may still make."""

    def leave() -> None:
        commit_offsets(consumer, offsets, failure)
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer failed: %s", exc)

    leaving = threading.Thread(target=leave, name="ductor-leave-group", daemon=True)
    leaving.start()
    leaving.join(bound_s)
    if leaving.is_alive():
        log.warning(
            "the broker did not take the last offset commit and the leave within %.1f s:"
            " leaving without them (what was done since the last commit it took is redone by"
            " the partitions' next owner)",
            bound_s,
        )
        return False
    return True


def read_finished(
    consumer: Consumer, partitions: list[TopicPartition], tracker: OffsetTracker
) -> set[tuple[str, int]] | None:
    """What the previous owners of ``partitions`` committed as done past their offsets, for
    ``tracker`` (bounded: without an answer those records are done again, as before). Returns
    the partitions the group has no offset for (None: not known)."""
    try:
        committed = consumer.committed(
            [TopicPartition(p.topic, p.partition) for p in partitions], timeout=_COMMITTED_S
        )
    except KafkaException as exc:
        log.warning("could not read the committed offsets of assigned partitions: %s", exc)
        return None
    uncommitted = set()
    for c in committed:
        if c.offset >= 0:
            tracker.learn((c.topic, c.partition), decode_finished(c.offset, c.metadata))
        else:
            uncommitted.add((c.topic, c.partition))
    return uncommitted


class Outbox:
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
