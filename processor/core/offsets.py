"""Which offset of each partition is safe to store, and which records past it are done.

Records of one partition finish out of order (a run waiting 1 s for a conflict retry must not
hold back the runs after it), but the stored offset may only move past a record once it and
every record before it are done: at-least-once, with no record skipped.

The records done past that offset would be redone by the partition's next owner: a
dead-lettered record dead-lettered again, a hop sent twice. So the commit says which they are,
in its metadata (``Finished``, encoded by ``encode_finished``): "every offset below ``end``
is done but these". The next owner's tracker learns it when the partition is assigned and
skips what is done (``done_before``), and says it again in its own commit until it has read
past it, as Confluent's parallel consumer does with its offset maps.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import NamedTuple

from processor.core.shapes import TopicPartition

# The broker refuses commit metadata over offset.metadata.max.bytes (4,096 by default): what
# does not fit is left out (those records are redone, as without it).
METADATA_LIMIT = 3000
_PREFIX = "ductor-done-1:"


class Finished(NamedTuple):
    """Every offset from the committed one up to ``end`` (exclusive) is done but ``pending``."""

    end: int
    pending: frozenset[int]

    def covers(self, offset: int) -> bool:
        """Whether the record at ``offset`` is done."""
        return offset < self.end and offset not in self.pending

    def merge(self, other: Finished | None) -> Finished:
        """Done by either: what one owner finished and what the previous one had."""
        if other is None:
            return self
        pending = {o for o in self.pending if not other.covers(o)}
        pending.update(o for o in other.pending if not self.covers(o))
        return Finished(max(self.end, other.end), frozenset(pending))


def encode_finished(position: int, finished: Finished, limit: int = METADATA_LIMIT) -> str:
    """``finished`` as commit metadata for the committed ``position``: the end and each
    pending offset as a step from the one before (base 36). Pending offsets past what fits in
    ``limit`` characters end it early (what follows is redone)."""
    end = finished.end
    steps: list[str] = []
    size = len(_PREFIX) + 12
    previous = position
    for offset in sorted(o for o in finished.pending if o >= position):
        if offset >= end:
            break
        step = _base36(offset - previous)
        size += len(step) + 1
        if size > limit:
            end = offset  # known done only below it
            break
        steps.append(step)
        previous = offset
    if end <= position:
        return ""
    return f"{_PREFIX}{_base36(end - position)}:{','.join(steps)}"


def decode_finished(position: int, metadata: str | None) -> Finished | None:
    """What a commit's ``metadata`` says is done past its ``position`` (None: nothing, or
    metadata this code did not write, or cannot read)."""
    if not metadata or not metadata.startswith(_PREFIX):
        return None
    try:
        span, _, steps = metadata[len(_PREFIX) :].partition(":")
        end = position + int(span, 36)
        pending: set[int] = set()
        offset = position
        for step in steps.split(",") if steps else ():
            offset += int(step, 36)
            pending.add(offset)
    except ValueError:
        return None
    return Finished(end, frozenset(pending))


def _base36(n: int) -> str:
    if n < 0:
        raise ValueError("offsets ascend")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out


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
        # What the partitions' previous owners committed as done past their offsets.
        self._before: dict[TopicPartition, Finished] = {}

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

    def learn(self, tp: TopicPartition, finished: Finished | None) -> None:
        """What the partition's previous owner committed as done past its offset."""
        if finished is None:
            self._before.pop(tp, None)
        else:
            self._before[tp] = finished

    def done_before(self, tp: TopicPartition, offset: int) -> bool:
        """Whether the previous owner did the record at ``offset`` (then it is done here
        too, without being done again)."""
        if not self._before:
            return False
        before = self._before.get(tp)
        if before is None:
            return False
        if offset >= before.end:
            del self._before[tp]  # read past it: this tracker knows the rest itself
            return False
        if not before.covers(offset):
            return False
        self.started(tp, offset)
        self.done(tp, offset)
        return True

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

    def position(self, tp: TopicPartition) -> int | None:
        """The safe position now (None: nothing finished there yet)."""
        part = self._partitions.get(tp)
        if part is None or part.highest_done < 0:
            return None
        lowest = part.lowest_in_flight()
        return lowest if lowest is not None else part.highest_done + 1

    def commit_metadata(self, tp: TopicPartition, position: int) -> str:
        """The commit metadata for ``position``: what is done past it, here or before."""
        here = self.finished_past(tp)
        before = self._before.get(tp)
        finished = before if here is None else here.merge(before)
        return "" if finished is None else encode_finished(position, finished)

    def finished_past(self, tp: TopicPartition) -> Finished | None:
        """The records done past the safe position (None: none)."""
        part = self._partitions.get(tp)
        if part is None or not part.in_flight:
            return None
        lowest = part.lowest_in_flight()
        if lowest is None or part.highest_done < lowest:
            return None
        return Finished(part.highest_done + 1, frozenset(part.in_flight))

    def in_flight(self, tp: TopicPartition) -> int:
        part = self._partitions.get(tp)
        return 0 if part is None else len(part.in_flight)

    def total_in_flight(self) -> int:
        return sum(len(p.in_flight) for p in self._partitions.values())

    def forget(self, tp: TopicPartition) -> None:
        """The partition was revoked: whatever is in flight is the next owner's to redo."""
        self._partitions.pop(tp, None)
        self._stored.pop(tp, None)
        self._before.pop(tp, None)
