"""The records a worker read ahead of the tasks in hand (source.py reads them, pauses and
resumes the partitions by what this says: why at those bounds is said there)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from confluent_kafka import Message

from processor.core.shapes import TopicPartition


class Backlog:
    """The records read ahead of the tasks in hand, one line per tier (the steps topics of a
    queue are one per tier: core/routing.py), handed out highest tier first, so a task of an
    interactive run read behind a bulk flood runs before it. Bounded by count and by the
    values' bytes: full at either bound (the lower tiers' partitions pause; the top tier's
    only once its own line is full), low again once both are at half (they resume). Half of
    it covers the second a resumed partition takes to deliver again, at the ~10,000 tasks a
    second claims reach here."""

    LIMIT = 20_000
    LIMIT_BYTES = 16_777_216  # 16 MiB (a literal: mypyc compiles this module)

    def __init__(self, rank: Callable[[str], int] = lambda _topic: 0) -> None:
        self._rank = rank  # a record's topic -> its line (0 first)
        self._lines: list[deque[Message]] = [deque() for _ in range(3)]
        self._count = 0
        self._bytes = 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def append(self, message: Message) -> None:
        self._lines[self.rank_of(message)].append(message)
        self._count += 1
        self._bytes += len(message.value() or b"")

    def rank_of(self, message: Message) -> int:
        return min(self._rank(message.topic() or ""), len(self._lines) - 1)

    def popleft(self) -> Message:
        line = next(line for line in self._lines if line)
        message = line.popleft()
        self._count -= 1
        self._bytes -= len(message.value() or b"")
        return message

    def space(self) -> int:
        """How many more records may be read now."""
        return 0 if self._bytes >= self.LIMIT_BYTES else self.LIMIT - self._count

    def full(self) -> bool:
        return self.space() <= 0

    def top_full(self) -> bool:
        """The top tier's own line is full: its partitions pause too."""
        return len(self._lines[0]) >= self.LIMIT

    def low(self) -> bool:
        return self._count <= self.LIMIT // 2 and self._bytes <= self.LIMIT_BYTES // 2

    def drop(self, tps: set[TopicPartition]) -> None:
        """Forget the records of these partitions (they went)."""
        kept = [m for line in self._lines for m in line if (m.topic(), m.partition()) not in tps]
        self.clear()
        for message in kept:
            self.append(message)

    def clear(self) -> None:
        for line in self._lines:
            line.clear()
        self._count = 0
        self._bytes = 0
