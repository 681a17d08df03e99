"""The start permit (worker/permits.py): claims are numbered as they go out; the permit asked
for covers the next claims that may still start, as many as the window, skipping those that
started, went or were given up; nothing is asked while the permit asked covers them."""

from __future__ import annotations

from processor.core.step_task import StepTask
from processor.worker.permits import StartPermits
from processor.worker.tasks import State, Task, TaskBook


def _claims(book: TaskBook, permits: StartPermits, n: int) -> list[Task]:
    tasks = []
    for i in range(n):
        task = Task(StepTask(f"r{i}", "s", 1, "fast", 10**13), ("steps", 0), i, [], None)
        book.add(task)
        book.move(task, State.CLAIMING)
        permits.number(task)
        tasks.append(task)
    return tasks


def test_the_permit_covers_the_window_of_claims_that_may_still_start() -> None:
    book = TaskBook()
    permits = StartPermits(book)
    tasks = _claims(book, permits, 6)
    assert [t.claim_seq for t in tasks] == [1, 2, 3, 4, 5, 6]
    assert permits.to_ask(2) == 2
    assert permits.to_ask(2) == 0  # asked already: nothing new to ask
    assert not permits.allows(tasks[0]) and permits.not_asked_for(tasks[2])
    permits.stored(2)
    assert permits.allows(tasks[1]) and not permits.allows(tasks[2])
    # The first two started; the third's partition went: the window moves past all three.
    book.move(tasks[0], State.RUNNING)
    book.move(tasks[1], State.RUNNING)
    book.remove(tasks[2])
    assert permits.to_ask(2) == 5
    permits.stored(5)
    permits.stored(2)  # an older answer arriving late never lowers the permit
    assert permits.allows(tasks[4]) and not permits.allows(tasks[5])


def test_no_claim_that_may_start_asks_for_nothing() -> None:
    book = TaskBook()
    permits = StartPermits(book)
    assert permits.to_ask(4) == 0
    _claims(book, permits, 1)
    assert permits.to_ask(0) == 0
    assert permits.to_ask(1) == 1
