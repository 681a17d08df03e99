"""A worker's start permit: which of its claimed tasks may start.

Claims are numbered in the order they go out, and a task starts only once its number is within
the permit stored in the worker's instance row (io/postgres/step_attempts.py). A worker that dies
therefore leaves its claims past the permit as never started: the next worker takes them as
new tasks, and only those within it come back as reruns. The permit is kept as far ahead of
what runs as the claim pace's start window (core/claim_pace.py): enough that a freed slot
rarely waits for it, few enough that a crash leaves few reruns.
"""

from __future__ import annotations

from collections import deque

from processor.worker.tasks import State, Task, TaskBook


class StartPermits:
    def __init__(self, book: TaskBook) -> None:
        self._book = book
        self._last = 0  # the last number given
        self._numbered: deque[tuple[int, Task]] = deque()  # claims not started, in order
        self._stored = 0  # the permit stored
        self._asked = 0  # the permit asked for (stored, or on its way)

    def number(self, task: Task) -> None:
        """``task`` is being claimed: it takes the next number."""
        self._last += 1
        task.claim_seq = self._last
        self._numbered.append((self._last, task))

    def stored(self, through: int) -> None:
        """Postgres stored a permit up to ``through``."""
        self._stored = max(self._stored, through)

    def allows(self, task: Task) -> bool:
        return task.claim_seq <= self._stored

    def not_asked_for(self, task: Task) -> bool:
        """Whether no permit asked for so far (stored or on its way) covers ``task``."""
        return task.claim_seq > self._asked

    def to_ask(self, window: int) -> int:
        """The permit to ask for now, covering the next ``window`` claims that may still
        start; 0 when the one asked already covers them."""
        numbered = self._numbered
        while numbered and not self._may_start(*numbered[0]):
            numbered.popleft()
        through = 0
        budget = window
        for seq, task in numbered:
            if budget <= 0:
                break
            if self._may_start(seq, task):
                budget -= 1
                through = seq
        if through <= self._asked:
            return 0
        self._asked = through
        return through

    def _may_start(self, seq: int, task: Task) -> bool:
        """Whether the claim numbered ``seq`` is still one that may start later."""
        return (
            task.claim_seq == seq
            and task.state in (State.CLAIMING, State.READY)
            and self._book.has(task)
        )
