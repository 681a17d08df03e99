"""A task's first stage (flow.py, 1): its attempt **claimed** in Postgres, together with the
other tasks that arrived meanwhile, then handed to its runner in the order they came once the
start permit reaches it (permits.py). Claims go ahead of the free slots as far as
core/claim_pace.py says. What each claim's verdict makes of its task is flow.py's."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from processor.core.claim_pace import ClaimPace
from processor.io.runtime.clock import Clock
from processor.worker.messages import ClaimReruns, ClaimTasks, Request, StorePermit, Unclaim
from processor.worker.permits import StartPermits
from processor.worker.runs import Runs
from processor.worker.tasks import ByTier, State, Task, TaskBook

# A task someone else holds is claimed again after this long.
RECLAIM_AFTER_S = 1.0


class Claims:
    def __init__(
        self,
        *,
        book: TaskBook,
        clock: Clock,
        concurrency: int,
        held_limit: int,
        runs: Runs,
        ask: Callable[[Request], None],
    ) -> None:
        self._book = book
        self._clock = clock
        self._runs = runs
        self._ask = ask
        self._to_claim = ByTier()  # received, in the order they came, t0's first
        self._ready: deque[Task] = deque()  # claimed, in the order they came
        self._suspects: deque[Task] = deque()  # reruns, to be claimed as such
        # Claims are numbered; those within the stored start permit may start (permits.py).
        self._permits = StartPermits(book)
        self.pace = ClaimPace(concurrency, held_limit, clock.monotonic())

    def add(self, task: Task) -> None:
        """A received task, to be claimed."""
        self._book.add(task)
        self._to_claim.append(task)

    def again(self, task: Task) -> None:
        """A held task whose wait is over: claimed again."""
        self._book.move(task, State.RECEIVED)
        self._to_claim.append(task)

    def ready(self, task: Task) -> None:
        """A claimed task, to run in its turn."""
        self._book.move(task, State.READY)
        self._ready.append(task)

    def suspect(self, task: Task) -> None:
        """A worker died running it: claimed again as a rerun."""
        self._book.move(task, State.SUSPECT)
        self._suspects.append(task)

    def hold(self, task: Task) -> None:
        """Someone else holds its attempt: claimed again a moment later."""
        self._book.move(task, State.HELD)
        task.claim_at = self._clock.monotonic() + RECLAIM_AFTER_S

    def permitted(self, through: int) -> None:
        self._permits.stored(through)

    def clear(self) -> None:
        """Nothing more is claimed (the worker stops)."""
        self._to_claim.clear()
        self._suspects.clear()

    def give_back(self, tasks: list[Task]) -> None:
        """Claimed tasks that will not run here (the worker stops, the partition went): their
        claims are given back, so the next worker takes them as never started."""
        if tasks:
            self._ask(Unclaim(tasks))
            for task in tasks:
                self._book.remove(task)

    def ask(self, now: float) -> None:
        """Start what may start, then ask for this turn's claims, the start permit riding on
        them (or going alone when a claimed task waits for it and no claim goes out)."""
        self._dispatch()
        claims = self._claims_to_ask(now) if self._to_claim else []
        if claims:
            self._ask(ClaimTasks(claims, self._permit_for(now)))
        elif self._ready and self._permits.not_asked_for(self._ready[0]):
            permit = self._permit_for(now)
            if permit:
                self._ask(StorePermit(permit))

    def _claims_to_ask(self, now: float) -> list[Task]:
        """The received tasks to claim now, numbered, in the order they came: as far ahead
        of the free slots as the pace says, each within its horizon (core/claim_pace.py)."""
        book = self._book
        ahead = (
            book.count(State.CLAIMING) + book.count(State.READY) + self._runs.waiting_for_a_slot()
        )
        room = self.pace.limit(now) - ahead
        claims: list[Task] = []
        while self._to_claim and len(claims) < room:
            head = self._to_claim.peek()
            if not self.pace.within_horizon(ahead + len(claims), head.step.timeout_ms):
                break
            task = self._to_claim.popleft()
            if task.state is State.RECEIVED and book.has(task):
                book.move(task, State.CLAIMING)
                task.asked_at = now
                self._permits.number(task)
                claims.append(task)
        return claims

    def _dispatch(self) -> None:
        """Hand claimed tasks to their runner, in the order they came (a free slot takes the
        next at once) as far as the start permit goes, raising it ahead of them, and claim
        the reruns that came meanwhile: attempts a worker that died had started, taken by a
        claim of their own (core/claims.py) and run in a child process of their own, beside
        everything else."""
        ready = self._ready
        while ready:
            task = ready[0]
            if task.state is not State.READY or not self._book.has(task):
                ready.popleft()
            elif self._permits.allows(task):
                ready.popleft()
                self._runs.start(task)
            else:
                break
        reruns: list[Task] = []
        while self._suspects:
            task = self._suspects.popleft()
            if task.state is State.SUSPECT and self._book.has(task):
                self._book.move(task, State.CLAIMING)
                task.asked_at = self._clock.monotonic()
                task.claim_seq = 0  # a rerun starts at its claim
                reruns.append(task)
        if reruns:
            self._ask(ClaimReruns(reruns))

    def _permit_for(self, now: float) -> int:
        """The start permit to ask for now, 0 when the one asked covers enough: the claims
        that start next, as many as the pace's start window (core/claim_pace.py) less those
        already waiting in a runner for a thread."""
        window = self.pace.start_window(now) - self._runs.waiting_for_a_slot()
        return self._permits.to_ask(window)
