"""Where records go: topic names, the priority tiers, the delay ladder, and a run's partition.

All of it is naming and arithmetic. Creating the topics is the shell's job (io/kafka/topics.py).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

TIERS = ("t0", "t1", "t2")
DEFAULT_QUEUE = "default"  # the queue of a step that names none (core/workflow.py)
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


def run_shard(run_id: str) -> int:
    """A stable hash of the run id: it picks the run's wakeup partition and its sweep shard."""
    return zlib.crc32(run_id.encode())


def partition_for(run_id: str, partitions: int) -> int:
    """The partition of a run's records on a topic of ``partitions`` partitions.

    Every producer of wakeups (start, workers, requeues, sweeps) uses this, so a run's wakeups
    meet on one partition and coalesce in one instance's batch, while the Kafka key stays
    ``run_id:requeue_seq``.
    """
    return run_shard(run_id) % partitions


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
        """The steps topic of the default queue."""
        return f"{self.prefix}.steps"

    def steps_for(self, queue: str, tier: str = "t1") -> str:
        """The steps topic of a queue for the tasks of runs on ``tier``. A queue has one per
        tier, so a flood of bulk (t2) tasks never stands in front of interactive (t0) ones in
        a partition, and a worker serves the higher tier first (worker/source.py). The t1
        topic of the default queue is the topic it always had (``steps``); a queue's name
        has no '.', so ``steps.<queue>.<tier>`` names no other queue's topic."""
        base = self.steps if queue == DEFAULT_QUEUE else f"{self.prefix}.steps.{queue}"
        if tier == "t1":
            return base
        if tier not in TIERS:
            raise ValueError(f"unknown tier {tier!r}; expected one of {', '.join(TIERS)}")
        return f"{self.prefix}.steps.{queue}.{tier}"

    def step_topics(self, queue: str) -> list[str]:
        """The steps topics of a queue, one per tier, the highest first."""
        return [self.steps_for(queue, tier) for tier in TIERS]

    def step_tier_rank(self, topic: str) -> int:
        """A steps topic's priority: 0 for t0 (served first), 1 for t1, 2 for t2."""
        for rank, tier in enumerate(TIERS):
            if tier != "t1" and topic.endswith(f".{tier}"):
                return rank
        return TIERS.index("t1")

    @property
    def dlq(self) -> str:
        return f"{self.prefix}.dlq"

    @property
    def requests(self) -> str:
        """Where upstream producers write start and signal requests (core/requests.py)."""
        return f"{self.prefix}.requests"

    def wakeup_topics(self) -> list[str]:
        return [self.wakeup(t) for t in TIERS]

    def delay_topics(self) -> list[str]:
        return [self.delay(r) for r in DELAY_RUNGS_MS]

    def coordinator_topics(self) -> list[str]:
        """What a processor instance subscribes to."""
        return [*self.wakeup_topics(), *self.delay_topics(), self.requests]

    def tier_of(self, topic: str) -> str:
        """'t0'/'t1'/'t2' for a wakeup topic, 'delay' for a rung topic, 'requests' for the
        requests topic: the source a record is counted and paused by."""
        for tier in TIERS:
            if topic == self.wakeup(tier):
                return tier
        if topic.startswith(f"{self.prefix}.delay."):
            return "delay"
        if topic == self.requests:
            return "requests"
        raise ValueError(f"{topic!r} is not a coordinator topic")

    def source_of(self, topic: str) -> str:
        """What a consumed topic is counted and paused as: its tier (``tier_of``) for a
        coordinator topic, 'trigger' for any other (a trigger's source topic)."""
        try:
            return self.tier_of(topic)
        except ValueError:
            return "trigger"

    def rung_of(self, topic: str) -> int:
        return int(topic.rsplit(".", 1)[1])
