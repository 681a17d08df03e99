"""Parts the worker (worker.py, its composition root) builds from its settings alone: its
telemetry, where its tasks come from, what its health endpoints answer from, and the partition
counts it starts with (a steps topic that does not exist is MissingTopic, saying how to create
it)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from confluent_kafka import Producer

from processor.core.routing import TopicNames
from processor.core.shapes import TopicPartition
from processor.io.config.settings import Settings
from processor.io.kafka.clients import ClientErrors, topic_partitions
from processor.io.kafka.errors import MissingTopic
from processor.io.runtime.faults import Faults
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.setup import Telemetry
from processor.worker.health import QueueLag, WorkerProbe
from processor.worker.source import TaskSource
from processor.worker.stats import WorkerStats

# How long each try at the broker waits for its answer at start, before the backoff: short,
# so a stop is not kept waiting (librdkafka goes on connecting between two tries).
START_TRY_S = 2.0


def worker_telemetry(settings: Settings) -> Telemetry:
    """Its telemetry, as the OTEL_* variables and DUCTOR_METRICS_PORT say."""
    return Telemetry.from_environment(
        "ductor-worker", settings.metrics_port, settings.worker_group_id, settings.http_host
    )


def task_source(
    settings: Settings,
    instance_id: str,
    stats: WorkerStats,
    releasing: Callable[[set[TopicPartition], bool], None],
    client_errors: ClientErrors,
    faults: Faults,
    names: TopicNames,
) -> TaskSource:
    """Where its tasks come from: its consumer of the queues' steps topics (source.py)."""
    return TaskSource(
        settings,
        instance_id,
        stats.errors,
        releasing,
        stats.skipped,
        client_errors,
        faults,
        names.step_tier_rank,
    )


def worker_probe(
    settings: Settings,
    names: TopicNames,
    queues: Sequence[str],
    instance_id: str,
    threads: ThreadWatch,
) -> WorkerProbe:
    """What its health endpoints answer from (health.py), with its queues' lag."""
    topics = {t: q for q in queues for t in names.step_topics(q)}
    lag = QueueLag(settings, topics) if settings.health_port else None
    return WorkerProbe(instance_id, lag, threads=threads)


def read_topics(
    producer: Producer, names: TopicNames, queues: Sequence[str]
) -> tuple[dict[str, int], dict[str, int]]:
    """The partition counts of the queues' steps topics and of the wakeup topics."""
    topics = [t for q in queues for t in names.step_topics(q)]
    try:
        steps = topic_partitions(producer, topics, START_TRY_S)
    except MissingTopic:
        missing = ", ".join(queues)
        raise MissingTopic(
            f"a steps topic of queue(s) {missing} does not exist: register a workflow"
            f" that uses the queue, or run `ductor topics create --queue {missing}`"
        ) from None
    return steps, topic_partitions(producer, names.wakeup_topics(), START_TRY_S)
