"""The run book (core/pending.py) against a plain model of it: whatever the order of adds,
takes, parks, settles and revokes, it hands out exactly the works whose time has come, each
once, with every record in order, and its record count stays exact."""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from processor.core.envelope import Wakeup
from processor.core.pending import RunBook, RunWork
from processor.core.records import Inbound

from .strategies import FAST

RUNS = ("a", "b", "c", "d")
PARTITIONS = (0, 1)


class BookMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.book: RunBook[None] = RunBook()
        self.now = 0.0
        self.offset = 0
        self.model: dict[str, tuple[float, list[int]]] = {}  # run -> (ready_at, offsets)
        self.in_flight: dict[str, RunWork[None]] = {}
        self.partition_of: dict[int, int] = {}  # record offset -> its partition

    @rule(run=st.sampled_from(RUNS), partition=st.sampled_from(PARTITIONS))
    def add(self, run: str, partition: int) -> None:
        self.offset += 1
        record = Inbound(("t", partition), self.offset, None, None, [], "t1", Wakeup(run, "start"))
        self.book.add(record)
        self.partition_of[self.offset] = partition
        ready_at, offsets = self.model.get(run, (0.0, []))
        self.model[run] = (ready_at, [*offsets, self.offset])

    # As the executor does: the next batch is taken once every work of the previous one was
    # parked or settled.
    @precondition(lambda self: not self.in_flight)
    @rule(limit=st.integers(1, 5))
    def take(self, limit: int) -> None:
        due = {r for r, (at, _) in self.model.items() if at <= self.now}
        taken = self.book.take_ready(self.now, limit)
        assert len(taken) == min(limit, len(due))
        for work in taken:
            assert work.run_id in due
            assert [r.offset for r in work.records] == self.model.pop(work.run_id)[1]
            self.in_flight[work.run_id] = work

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data(), wait=st.sampled_from([0.0, 0.01, 1.0]))
    def park(self, data: st.DataObject, wait: float) -> None:
        run = data.draw(st.sampled_from(sorted(self.in_flight)))
        work = self.in_flight.pop(run)
        mine = [r.offset for r in work.records]
        self.book.park(work, self.now + wait)
        if run in self.model:  # records came meanwhile: merged, the earlier time wins
            at, offsets = self.model[run]
            self.model[run] = (min(at, self.now + wait), mine + offsets)
        else:
            self.model[run] = (self.now + wait, mine)

    @precondition(lambda self: bool(self.in_flight))
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        del self.in_flight[data.draw(st.sampled_from(sorted(self.in_flight)))]

    @rule(partition=st.sampled_from(PARTITIONS))
    def revoke(self, partition: int) -> None:
        dropped = {w.run_id for w in self.book.drop_partitions({("t", partition)})}
        for run, (at, offsets) in list(self.model.items()):
            kept = [o for o in offsets if self.partition_of[o] != partition]
            if kept:
                self.model[run] = (at, kept)
            else:
                assert run in dropped
                del self.model[run]

    @rule(step=st.sampled_from([0.005, 0.5, 2.0]))
    def tick(self, step: float) -> None:
        self.now += step

    @invariant()
    def counts_match(self) -> None:
        assert len(self.book) == len(self.model)
        assert self.book.records == sum(len(o) for _, o in self.model.values())
        due = sum(1 for at, _ in self.model.values() if at <= self.now)
        assert self.book.ready_count(self.now) == due


TestRunBook = BookMachine.TestCase
TestRunBook.settings = FAST
