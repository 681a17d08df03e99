"""Topic names, the delay ladder, and idempotent topic creation with the admin client."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from processor.config import Settings
from processor.kafka_io import topic_partitions

TIERS = ("t0", "t1", "t2")
# The backoff ladder of the seed: 100 ms * 2^n, capped at 10 s. One topic per rung keeps due
# times monotone within a partition, so a paused partition head is always the earliest due record.
DELAY_RUNGS_MS = (100, 200, 400, 800, 1600, 3200, 6400, 10000)


def requeue_delay_ms(requeue_number: int) -> int:
    """The delay of the n-th requeue (n from 0): 100 ms * 2^n, capped at 10 s."""
    if requeue_number < 0:
        raise ValueError("requeue_number must be >= 0")
    delay: int = 100 * 2 ** min(requeue_number, 16)
    return min(delay, DELAY_RUNGS_MS[-1])


def rung_for_delay(delay_ms: int) -> int:
    """The rung a wait of ``delay_ms`` travels on: the largest rung not longer than the wait.

    Waits longer than the top rung hop several times (the record is re-delayed when it comes
    due before its target); waits shorter than the first rung ride the first rung.
    """
    chosen = DELAY_RUNGS_MS[0]
    for rung in DELAY_RUNGS_MS:
        if rung <= delay_ms:
            chosen = rung
    return chosen


@dataclass(frozen=True)
class TopicNames:
    prefix: str

    def wakeup(self, tier: str) -> str:
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; expected one of {', '.join(TIERS)}")
        return f"{self.prefix}.wakeup.{tier}"

    def delay(self, rung_ms: int) -> str:
        if rung_ms not in DELAY_RUNGS_MS:
            raise ValueError(f"{rung_ms} ms is not a rung of the delay ladder")
        return f"{self.prefix}.delay.{rung_ms}"

    @property
    def steps(self) -> str:
        return f"{self.prefix}.steps"

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    def wakeup_topics(self) -> list[str]:
        return [self.wakeup(t) for t in TIERS]

    def delay_topics(self) -> list[str]:
        return [self.delay(r) for r in DELAY_RUNGS_MS]

    def coordinator_topics(self) -> list[str]:
        """What a processor instance subscribes to."""
        return self.wakeup_topics() + self.delay_topics()

    def tier_of(self, topic: str) -> str:
        """'t0'/'t1'/'t2' for a wakeup topic, 'delay' for a rung topic."""
        for tier in TIERS:
            if topic == self.wakeup(tier):
                return tier
        if topic.startswith(f"{self.prefix}.delay."):
            return "delay"
        raise ValueError(f"{topic!r} is not a coordinator topic")

    def rung_of(self, topic: str) -> int:
        return int(topic.rsplit(".", 1)[1])


def desired_topics(settings: Settings) -> dict[str, int]:
    """Every topic the system uses, with its partition count from the configuration."""
    names = TopicNames(settings.topic_prefix)
    topics = dict.fromkeys(names.wakeup_topics(), settings.wakeup_partitions)
    topics.update(dict.fromkeys(names.delay_topics(), settings.delay_partitions))
    topics[names.steps] = settings.step_partitions
    topics[names.dlq] = settings.dlq_partitions
    return topics


def create_topics(settings: Settings, timeout_s: float = 30.0) -> dict[str, str]:
    """Create missing topics; report 'created' or 'exists' per topic. Idempotent.

    A topic that exists with fewer partitions than configured is reported, not altered:
    adding partitions moves runs between partitions, which an operator should decide.
    """
    admin = AdminClient(dict(settings.kafka_common()))
    wanted = desired_topics(settings)
    existing = admin.list_topics(timeout=timeout_s).topics
    report: dict[str, str] = {}
    to_create: list[NewTopic] = []
    for topic, partitions in wanted.items():
        if topic in existing:
            have = len(existing[topic].partitions)
            report[topic] = "exists" if have >= partitions else f"exists with {have} partitions"
        else:
            to_create.append(
                NewTopic(
                    topic, num_partitions=partitions, replication_factor=settings.replication_factor
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
    # (a processor, a test) finds them all.
    topic_partitions(admin, list(wanted), timeout_s)
    return dict(sorted(report.items()))
