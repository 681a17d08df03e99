"""Which offset of each partition is safe to store.

Records of one partition finish out of order (a run waiting 1 s for a conflict retry must not
hold back the runs after it), but the stored offset may only move past a record once it and
every record before it are done: at-least-once, with no record skipped.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

TopicPartition = tuple[str, int]


@dataclass
class _PartitionOffsets:
    in_flight: set[int] = field(default_factory=set)
    heap: list[int] = field(default_factory=list)  # min-heap of in-flight offsets (lazy deletes)
    highest_done: int = -1  # the highest offset seen finished

    def lowest_in_flight(self) -> int | None:
        while self.heap and self.heap[0] not in self.in_flight:
            heapq.heappop(self.heap)
        return self.heap[0] if self.heap else None


class OffsetTracker:
    def __init__(self) -> None:
        self._partitions: dict[TopicPartition, _PartitionOffsets] = {}
        self._stored: dict[TopicPartition, int] = {}

    def started(self, tp: TopicPartition, offset: int) -> None:
        part = self._partitions.get(tp)
        if part is None:  # (not setdefault: that would build a new one on every call)
            part = self._partitions[tp] = _PartitionOffsets()
        if offset not in part.in_flight:
            part.in_flight.add(offset)
            heapq.heappush(part.heap, offset)

    def done(self, tp: TopicPartition, offset: int) -> None:
        part = self._partitions.get(tp)
        if part is None or offset not in part.in_flight:
            return  # the partition was revoked meanwhile: its new owner redoes the record
        part.in_flight.discard(offset)
        part.highest_done = max(part.highest_done, offset)

    def committable(self) -> dict[TopicPartition, int]:
        """Partitions whose safe position moved since the last call: tp -> next offset to read."""
        moved: dict[TopicPartition, int] = {}
        for tp, part in self._partitions.items():
            if part.highest_done < 0:
                continue  # nothing finished yet: nothing new to store
            lowest = part.lowest_in_flight()
            position = lowest if lowest is not None else part.highest_done + 1
            if position > self._stored.get(tp, -1):
                moved[tp] = position
                self._stored[tp] = position
        return moved

    def in_flight(self, tp: TopicPartition) -> int:
        part = self._partitions.get(tp)
        return 0 if part is None else len(part.in_flight)

    def total_in_flight(self) -> int:
        return sum(len(p.in_flight) for p in self._partitions.values())

    def forget(self, tp: TopicPartition) -> None:
        """The partition was revoked: whatever is in flight is the next owner's to redo."""
        self._partitions.pop(tp, None)
        self._stored.pop(tp, None)
