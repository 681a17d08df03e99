"""The tasks a worker holds, from the moment it polls them until their offset may move on.

Every task goes through these states, each change made on the worker's loop thread:

    RECEIVED -> CLAIMING -> READY -> RUNNING -> RECORDING -> SENDING
                    |-> HELD (someone else holds it) -> RECEIVED, a moment later
                    |-> SUSPECT (a worker died running it) -> claimed as a rerun -> READY
                    |-> done (skipped), or RECORDING (its attempt fails without running)

and leaves the book when it is done (its wakeup acknowledged, or nothing to send), when it is
abandoned, or when its partition was taken away before it was claimed. ``in_hand`` counts
what waits to run (the worker's prefetch: claims are asked in groups, ahead of the free
slots), ``running`` what holds a slot.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from enum import IntEnum
from typing import Any

from processor.core.envelope import MAX_EPOCH_MS
from processor.core.records import Headers
from processor.core.routing import TIERS
from processor.core.shapes import TopicPartition
from processor.core.step_task import AttemptKey, StepData, StepTask
from processor.worker.handles import StepHandle


class State(IntEnum):
    """(An IntEnum: the book counts by state, a few times per task, and an Enum's hash is a
    Python call.)"""

    RECEIVED = 0  # polled, its claim not asked yet
    CLAIMING = 1  # its claim is with the database
    READY = 2  # claimed: runs when a slot is free
    HELD = 3  # someone else holds its attempt: claimed again shortly
    SUSPECT = 4  # a worker died running it: claimed again as a rerun
    RUNNING = 5  # its step function runs
    RECORDING = 6  # its result is with the database
    SENDING = 7  # its wakeup is on its way to the broker


_IN_HAND = (State.RECEIVED, State.CLAIMING, State.READY)


class Task:
    """One polled step task and everything the worker knows about it (loop thread only,
    but for ``handle``, which its step function shares)."""

    __slots__ = (
        "abandoned",
        "asked_at",
        "beat_reported_at",
        "beats_reported",
        "claim_at",
        "claim_seq",
        "claimed_ns",
        "data",
        "details_reported",
        "handle",
        "headers",
        "key",
        "offset",
        "produced_ms",
        "revoked",
        "span",
        "start_reported",
        "started_ns",
        "starts",
        "state",
        "step",
        "tp",
    )

    def __init__(
        self,
        step: StepTask,
        tp: TopicPartition,
        offset: int,
        headers: Headers,
        produced_ms: int | None,
    ) -> None:
        self.step = step
        self.key: AttemptKey = step.key
        self.tp = tp
        self.offset = offset
        self.headers = headers  # the record's trace context, carried on to the wakeup
        self.produced_ms = produced_ms  # when the coordinator produced it (record timestamp)
        self.state = State.RECEIVED
        self.data: StepData | None = step.data
        # Its deadline is set when it starts (runners.begin: its start plus its timeout); a
        # task from before start-to-close has its own.
        self.handle = StepHandle(step.deadline_ms if step.timeout_ms is None else MAX_EPOCH_MS)
        self.starts = 0  # which execution of the attempt this worker begins (from its claim)
        self.claim_at = 0.0  # HELD: when to claim it again (monotonic)
        # Its claim's number: it may start once the worker's start permit reaches it
        # (io/postgres/step_attempts.py). 0: it may start at once (a rerun starts at its claim).
        self.claim_seq = 0
        self.asked_at = 0.0  # when its claim was asked (monotonic)
        self.started_ns = 0
        # What was reported of its execution (flow.py): when its claim was answered
        # (monotonic ns), whether its late start was looked at, the heartbeats and details
        # recorded, and when the last beat was (monotonic).
        self.claimed_ns = 0
        self.start_reported = False
        self.beats_reported = 0
        self.details_reported: str | None = None
        self.beat_reported_at = 0.0
        self.revoked = False  # its partition was taken away: its offset is not ours any more
        self.abandoned = False  # given up while its step still ran
        self.span: Any = None  # the execution's span, while it runs


class TaskBook:
    """The tasks in hand, by attempt, and how many are in each state."""

    def __init__(self) -> None:
        self._tasks: dict[AttemptKey, Task] = {}
        self._counts: dict[State, int] = dict.fromkeys(State, 0)

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[Task]:
        return iter(list(self._tasks.values()))

    def holds(self, key: AttemptKey) -> bool:
        return key in self._tasks

    def get(self, key: AttemptKey) -> Task | None:
        return self._tasks.get(key)

    def has(self, task: Task) -> bool:
        """Whether ``task`` itself is in the book (not only another delivery of its attempt)."""
        return self._tasks.get(task.key) is task

    def add(self, task: Task) -> None:
        self._tasks[task.key] = task
        self._counts[task.state] += 1

    def move(self, task: Task, state: State) -> None:
        """A task in the book changes state. One that left it (its partition went, the worker
        stops) keeps its state to itself: the counts are of the book's tasks only."""
        if self._tasks.get(task.key) is task:
            self._counts[task.state] -= 1
            self._counts[state] += 1
        task.state = state

    def remove(self, task: Task) -> None:
        if self._tasks.get(task.key) is task:
            del self._tasks[task.key]
            self._counts[task.state] -= 1

    def count(self, state: State) -> int:
        return self._counts[state]

    @property
    def in_hand(self) -> int:
        """Tasks waiting to run: for their claim, or claimed and waiting for a slot."""
        return sum(self._counts[s] for s in _IN_HAND)

    def in_state(self, state: State) -> list[Task]:
        return [t for t in self._tasks.values() if t.state is state]

    def of_partitions(self, tps: set[TopicPartition]) -> list[Task]:
        return [t for t in self._tasks.values() if t.tp in tps]


class ByTier:
    """Tasks in the order they came, but a higher tier's first (t0, then t1, then t2): the
    received tasks waiting to be claimed, so an interactive run's step is claimed (and run)
    before the bulk ones read ahead of it."""

    def __init__(self) -> None:
        self._lines: tuple[deque[Task], ...] = tuple(deque() for _ in TIERS)

    def __bool__(self) -> bool:
        return any(self._lines)

    def __len__(self) -> int:
        return sum(len(line) for line in self._lines)

    def append(self, task: Task) -> None:
        self._lines[_TIER_RANK.get(task.step.tier, 1)].append(task)

    def popleft(self) -> Task:
        return next(line for line in self._lines if line).popleft()

    def peek(self) -> Task:
        """The task ``popleft`` would take."""
        return next(line for line in self._lines if line)[0]

    def clear(self) -> None:
        for line in self._lines:
            line.clear()


_TIER_RANK = {tier: rank for rank, tier in enumerate(TIERS)}
