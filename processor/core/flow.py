"""Flow control of the consumer, free of Kafka calls so it can be tested on its own.

``PauseBook`` remembers why each partition is paused: a delay partition whose head record is
not due yet (until a time), or a tier whose local backlog is too long (backpressure). A
partition is resumed only when no reason is left, and due-time entries outlive a rebalance so
they can be re-applied when the partition is assigned again.

``TierQueues`` hands out accepted records by weighted round robin over the tiers, so a flood
in one tier cannot starve the others.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Generic, TypeVar

from processor.core.shapes import TopicPartition

T = TypeVar("T")


class PauseBook:
    def __init__(self) -> None:
        self._until: dict[TopicPartition, float] = {}
        self._backpressure: set[TopicPartition] = set()

    def pause_until(self, tp: TopicPartition, resume_at: float) -> None:
        self._until[tp] = resume_at

    def due_to_resume(self, now: float) -> list[TopicPartition]:
        """Partitions whose due time came, minus those still held by backpressure."""
        due = [tp for tp, at in self._until.items() if at <= now]
        for tp in due:
            del self._until[tp]
        return [tp for tp in due if tp not in self._backpressure]

    def hold(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Add backpressure; returns the partitions that were not paused before."""
        fresh = [tp for tp in tps if tp not in self._backpressure]
        self._backpressure.update(fresh)
        return [tp for tp in fresh if tp not in self._until]

    def release(self, tps: Iterable[TopicPartition]) -> list[TopicPartition]:
        """Lift backpressure; returns the partitions that can be resumed now."""
        lifted = [tp for tp in tps if tp in self._backpressure]
        self._backpressure.difference_update(lifted)
        return [tp for tp in lifted if tp not in self._until]

    def held(self, tp: TopicPartition) -> bool:
        return tp in self._backpressure

    def is_paused(self, tp: TopicPartition) -> bool:
        return tp in self._until or tp in self._backpressure

    def paused(self) -> set[TopicPartition]:
        return set(self._until) | self._backpressure

    def delayed(self) -> Mapping[TopicPartition, float]:
        return dict(self._until)

    def next_resume_at(self) -> float | None:
        return min(self._until.values()) if self._until else None

    def on_revoked(self, tp: TopicPartition) -> None:
        # Backpressure is local to this instance's buffers, which are dropped with the
        # partition; the due time stays, to be re-applied if the partition comes back.
        self._backpressure.discard(tp)


class TierQueues(Generic[T]):
    def __init__(self, weights: Mapping[str, int]) -> None:
        if not weights or any(w < 1 for w in weights.values()):
            raise ValueError("every tier needs a weight >= 1")
        self._weights = dict(weights)
        self._queues: dict[str, deque[T]] = {tier: deque() for tier in weights}
        self._turn = 0  # index of the tier whose turn it is
        self._served = 0  # items that tier gave in its current turn

    def push(self, tier: str, item: T) -> None:
        self._queues[tier].append(item)

    def size(self, tier: str) -> int:
        return len(self._queues[tier])

    def __len__(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def take(self, limit: int) -> list[T]:
        """Up to ``limit`` items by weighted round robin: each tier in turn gives up to its
        weight in items before the turn passes on. The turn persists across calls, so even
        takes smaller than a weight rotate through the tiers and none is starved."""
        taken: list[T] = []
        tiers = list(self._weights)
        while len(taken) < limit and len(self) > 0:
            tier = tiers[self._turn]
            queue = self._queues[tier]
            if queue and self._served < self._weights[tier]:
                taken.append(queue.popleft())
                self._served += 1
            else:
                self._turn = (self._turn + 1) % len(tiers)
                self._served = 0
        return taken

    def drop(self, predicate: Callable[[T], bool]) -> list[T]:
        """Remove and return the items matching ``predicate`` (records of a revoked partition)."""
        dropped: list[T] = []
        for tier, queue in self._queues.items():
            kept: deque[T] = deque()
            for item in queue:
                (dropped if predicate(item) else kept).append(item)
            self._queues[tier] = kept
        return dropped
