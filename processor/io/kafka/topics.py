"""Idempotent topic creation with the admin client (the names are in core/routing.py)."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable

from confluent_kafka import Consumer, KafkaError, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    NewTopic,
    OffsetSpec,
)

from processor.core.routing import DEFAULT_QUEUE, TopicNames
from processor.io.config.settings import Settings
from processor.io.kafka.clients import topic_partitions
from processor.io.kafka.configs import admin_config, reader_config
from processor.io.kafka.errors import MissingTopic
from processor.io.kafka.logs import with_logger


def desired_topics(settings: Settings, queues: Iterable[str] = ()) -> dict[str, int]:
    """Every topic the system uses, with its partition count from the configuration: the
    steps topics (one per tier) of the default queue and of each of ``queues`` among them."""
    names = TopicNames(settings.topic_prefix)
    topics = dict.fromkeys(names.wakeup_topics(), settings.wakeup_partitions)
    topics.update(dict.fromkeys(names.delay_topics(), settings.delay_partitions))
    for queue in (DEFAULT_QUEUE, *queues):
        topics.update(dict.fromkeys(names.step_topics(queue), settings.step_partitions))
    topics[names.dlq] = settings.dlq_partitions
    # Keyed by run id like the wakeups: as many partitions, so one run's requests stay in order.
    topics[names.requests] = settings.wakeup_partitions
    return topics


def replication(settings: Settings, brokers: int) -> tuple[int, int]:
    """The replication factor and ``min.insync.replicas`` of new topics on a cluster of
    ``brokers``: the settings', or min(3, brokers) and 2 where that is 3 or more (a write is
    acknowledged by two replicas, so one broker may be down), else 1. RuntimeError if the
    cluster cannot hold them."""
    replicas = settings.replication_factor or min(3, brokers)
    min_isr = settings.min_insync_replicas or (2 if replicas >= 3 else 1)
    if replicas > brokers:
        raise RuntimeError(
            f"DUCTOR_REPLICATION_FACTOR={replicas} needs {replicas} brokers; the cluster at"
            f" {settings.bootstrap_servers} has {brokers}"
        )
    if min_isr > replicas:
        raise RuntimeError(
            f"DUCTOR_MIN_INSYNC_REPLICAS={min_isr} is more than the {replicas} replicas of each"
            " topic: no write would ever be acknowledged"
        )
    return replicas, min_isr


def create_topics(
    settings: Settings, timeout_s: float = 30.0, queues: Iterable[str] = ()
) -> dict[str, str]:
    """Create missing topics (the steps topics of ``queues`` too); report 'created' or
    'exists' per topic. Idempotent.

    A topic that exists with fewer partitions than configured is reported, not altered:
    adding partitions moves runs between partitions, which an operator should decide.
    """
    admin = AdminClient(with_logger(admin_config(settings, "ductor-topics")))
    wanted = desired_topics(settings, queues)
    metadata = admin.list_topics(timeout=timeout_s)
    existing = metadata.topics
    replicas, min_isr = replication(settings, len(metadata.brokers))
    report: dict[str, str] = {}
    to_create: list[NewTopic] = []
    for topic, partitions in wanted.items():
        if topic in existing:
            have = len(existing[topic].partitions)
            report[topic] = "exists" if have >= partitions else f"exists with {have} partitions"
        else:
            to_create.append(
                NewTopic(
                    topic,
                    num_partitions=partitions,
                    replication_factor=replicas,
                    config={"min.insync.replicas": str(min_isr)},
                )
            )
    futures = admin.create_topics(to_create, operation_timeout=timeout_s) if to_create else {}
    for topic, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            report[topic] = "created"
        except KafkaException as exc:
            error = exc.args[0]
            if isinstance(error, KafkaError) and error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                report[topic] = "exists"
            else:
                raise
    # Return only once every topic is in the metadata, so a client started right after this
    # (a processor, a test) finds them all, and every partition is served by its leader.
    wait_served(admin, topic_partitions(admin, list(wanted), timeout_s), timeout_s)
    return dict(sorted(report.items()))


def wait_served(admin: AdminClient, partitions: dict[str, int], timeout_s: float) -> None:
    """Return once the leader of every partition of ``partitions`` (topic: count) serves it
    (answers a ListOffsets request); MissingTopic after ``timeout_s``.

    A new topic is in the metadata before its leader has created the partitions' logs (a
    second or two later on a loaded broker). A record produced in between is refused and
    retried by the idempotent producer, yet one was reported delivered and never reached the
    log: the chaos run's first record to a partition, sent 0.6 s before the broker created
    it; the partition's next record, sent 0.5 s later, took offset 0."""
    deadline = time.monotonic() + timeout_s
    waiting = [KafkaTopicPartition(t, p) for t, n in partitions.items() for p in range(n)]
    while waiting:
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        futures = admin.list_offsets(dict.fromkeys(waiting, latest), request_timeout=timeout_s)
        unserved = []
        for tp, future in futures.items():
            try:
                future.result(timeout=timeout_s)
            except KafkaException:
                unserved.append(tp)
        waiting = unserved
        if waiting and time.monotonic() > deadline:
            first = waiting[0]
            raise MissingTopic(
                f"partition {first.partition} of topic {first.topic} is not served by its"
                f" leader after {timeout_s:.0f} s ({len(waiting)} partitions waiting)"
            )
        if waiting:
            time.sleep(0.2)  # the leader creating the partitions; bounded by the deadline


def delete_topics(settings: Settings, timeout_s: float = 30.0) -> None:
    """Delete every topic of the settings' prefix (a test's or a chaos run's own topics),
    the steps topics of its queues included."""
    admin = AdminClient(with_logger(admin_config(settings, "ductor-topics")))
    prefix = f"{settings.topic_prefix}."
    existing = admin.list_topics(timeout=timeout_s).topics
    doomed = [t for t in existing if t.startswith(prefix)]
    if not doomed:
        return
    futures = admin.delete_topics(doomed, operation_timeout=timeout_s)
    for future in futures.values():
        future.result(timeout=timeout_s)


def topic_max_message_bytes(settings: Settings, topic: str, timeout_s: float = 10.0) -> int:
    """The largest record ``topic`` takes (its ``max.message.bytes``, the broker's default
    unless set on the topic)."""
    admin = AdminClient(with_logger(admin_config(settings, "ductor-topics")))
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=timeout_s)
    return int(configs["max.message.bytes"].value)


def busiest_broker(settings: Settings, timeout_s: float = 10.0) -> int:
    """The id of the broker that leads the most partitions of the wakeup and steps topics:
    the one whose loss moves the most leaders."""
    names = TopicNames(settings.topic_prefix)
    topics = [*names.wakeup_topics(), names.steps]
    admin = AdminClient(with_logger(admin_config(settings, "ductor-topics")))
    meta = admin.list_topics(timeout=timeout_s).topics
    leaders = Counter(p.leader for t in topics for p in meta[t].partitions.values())
    return leaders.most_common(1)[0][0]


def topic_end_offsets(settings: Settings, topic: str, timeout_s: float = 10.0) -> dict[int, int]:
    """Each partition of ``topic`` and its end offset (where the next record goes); ValueError
    if there is no such topic."""
    reader = Consumer(
        with_logger(reader_config(settings, "ductor-topics", f"ductor-ends-{uuid.uuid4().hex[:8]}"))
    )
    try:
        meta = reader.list_topics(topic, timeout=timeout_s).topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            raise ValueError(f"topic {topic!r} does not exist on {settings.bootstrap_servers}")
        return {
            p: reader.get_watermark_offsets(KafkaTopicPartition(topic, p), timeout=timeout_s)[1]
            for p in sorted(meta.partitions)
        }
    finally:
        reader.close()
