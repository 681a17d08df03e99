"""Consumer flow control without Kafka (processor/flow.py): TierQueues and PauseBook."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from processor.core.flow import PauseBook, TierQueues
from processor.core.shapes import TopicPartition

from .strategies import FAST

WEIGHTS = {"t0": 8, "t1": 4, "t2": 1, "delay": 4}


def _filled(sizes: dict[str, int], weights: dict[str, int] | None = None) -> TierQueues[str]:
    queues: TierQueues[str] = TierQueues(weights or WEIGHTS)
    for tier, n in sizes.items():
        for i in range(n):
            queues.push(tier, f"{tier}-{i}")
    return queues


def _tiers(items: list[str]) -> Counter[str]:
    return Counter(item.rsplit("-", 1)[0] for item in items)


def test_weights_must_be_positive() -> None:
    with pytest.raises(ValueError, match="weight >= 1"):
        TierQueues({})
    with pytest.raises(ValueError, match="weight >= 1"):
        TierQueues({"t0": 1, "t1": 0})


def test_take_keeps_fifo_order_within_a_tier() -> None:
    queues = _filled({"t1": 10})
    assert queues.take(100) == [f"t1-{i}" for i in range(10)]
    assert len(queues) == 0
    assert queues.take(5) == []


def test_one_round_under_backlog_follows_the_weights() -> None:
    queues = _filled({"t0": 100, "t1": 100, "t2": 100, "delay": 100})
    taken = queues.take(17)  # exactly one round
    assert taken[:8] == [f"t0-{i}" for i in range(8)]
    assert _tiers(taken) == Counter({"t0": 8, "t1": 4, "t2": 1, "delay": 4})
    assert queues.size("t0") == 92 and queues.size("t2") == 99
    assert len(queues) == 400 - 17


@FAST
@given(
    weights=st.fixed_dictionaries({t: st.integers(1, 10) for t in ("t0", "t1", "t2", "delay")}),
    rounds=st.integers(1, 6),
    extra=st.integers(0, 40),
)
def test_each_full_round_gives_every_backlogged_tier_its_weight(
    weights: dict[str, int], rounds: int, extra: int
) -> None:
    per_round = sum(weights.values())
    backlog = per_round * (rounds + 2) + extra
    queues = _filled(dict.fromkeys(weights, backlog), weights)
    taken = queues.take(per_round * rounds)
    assert _tiers(taken) == Counter({t: w * rounds for t, w in weights.items()})


@FAST
@given(
    sizes=st.fixed_dictionaries({t: st.integers(0, 60) for t in ("t0", "t1", "t2", "delay")}),
    limit=st.integers(0, 200),
)
def test_take_never_exceeds_the_limit_and_serves_every_non_empty_tier(
    sizes: dict[str, int], limit: int
) -> None:
    queues = _filled(sizes)
    taken = queues.take(limit)
    assert len(taken) == min(limit, sum(sizes.values()))
    assert len(set(taken)) == len(taken)
    counts = _tiers(taken)
    if limit >= sum(WEIGHTS.values()):
        # at least one full round: every non-empty tier got min(its size, its weight) or more
        for tier, size in sizes.items():
            assert counts[tier] >= min(size, WEIGHTS[tier])
    for tier, size in sizes.items():
        assert queues.size(tier) == size - counts[tier]


def test_a_flood_in_t2_does_not_starve_t0() -> None:
    queues = _filled({"t2": 10_000})
    for i in range(20):
        queues.push("t0", f"t0-{i}")
    taken = queues.take(30)
    assert _tiers(taken)["t0"] == 20
    assert taken[:8] == [f"t0-{i}" for i in range(8)]


def test_a_flood_in_t0_leaves_a_share_to_t2_when_taking_full_rounds() -> None:
    queues = _filled({"t0": 10_000, "t2": 3, "delay": 2})
    taken = queues.take(51)  # 3 rounds of 17
    assert _tiers(taken)["t2"] == 3
    assert _tiers(taken)["delay"] == 2


# Fixed (flow.py TierQueues.take): every call starts a new round at the first tier, so a
# caller that takes fewer items than the first tier's weight is served from that tier only, for
# as long as it has a backlog. The runner does exactly that: _feed_coordinator takes
# `batch_size - coordinator.ready_count(...)` items, which is small whenever the coordinator is
# near capacity. Inputs: weights t0=8, t1=4, t2=1, delay=4; 10_000 records in t0, 1 in t2 and 1
# in delay; take(4) called 100 times. Expected: t2 and delay are served within a few calls ("a
# flood in one tier cannot starve the others"). Actual: all 400 items come from t0; the t2 and
# delay records (timers, conflict requeues) wait until the t0 flood is gone.
def test_small_takes_under_a_t0_flood_do_not_starve_the_other_tiers() -> None:
    queues = _filled({"t0": 10_000, "t2": 1, "delay": 1})
    taken: list[str] = []
    for _ in range(100):
        taken += queues.take(4)
    assert "t2-0" in taken
    assert "delay-0" in taken


def test_drop_removes_matching_items_from_every_tier() -> None:
    queues: TierQueues[tuple[str, int]] = TierQueues(WEIGHTS)
    for tier in ("t0", "t1", "delay"):
        for partition in range(3):
            queues.push(tier, (tier, partition))
    dropped = queues.drop(lambda item: item[1] == 1)
    assert sorted(dropped) == [("delay", 1), ("t0", 1), ("t1", 1)]
    assert len(queues) == 6
    assert (("t0", 1)) not in queues.take(100)


# ---------------------------------------------------------------------------------------------
# PauseBook

A: TopicPartition = ("ductor.delay.100", 0)
B: TopicPartition = ("ductor.wakeup.t0", 1)


def test_due_time_alone() -> None:
    book = PauseBook()
    book.pause_until(A, 10.0)
    assert book.is_paused(A) and not book.held(A)
    assert book.next_resume_at() == 10.0
    assert book.due_to_resume(9.99) == []
    assert book.due_to_resume(10.0) == [A]
    assert not book.is_paused(A)
    assert book.due_to_resume(11.0) == []
    assert book.next_resume_at() is None


def test_backpressure_alone() -> None:
    book = PauseBook()
    assert book.hold([A, B]) == [A, B]
    assert book.hold([A]) == []  # already held
    assert book.held(A) and book.paused() == {A, B}
    assert book.release([A]) == [A]
    assert book.release([A]) == []  # not held any more
    assert book.paused() == {B}


def test_a_due_partition_still_under_backpressure_stays_paused_until_released() -> None:
    book = PauseBook()
    book.pause_until(A, 5.0)
    assert book.hold([A]) == []  # already paused by its due time: nothing new to pause
    assert book.due_to_resume(6.0) == []  # due, but backpressure still holds it
    assert book.is_paused(A)
    assert book.delayed() == {}
    assert book.release([A]) == [A]
    assert not book.is_paused(A)


def test_released_backpressure_does_not_resume_a_partition_not_due_yet() -> None:
    book = PauseBook()
    book.hold([A])
    book.pause_until(A, 5.0)
    assert book.release([A]) == []  # its head record is not due: stay paused
    assert book.is_paused(A)
    assert book.due_to_resume(5.0) == [A]


def test_due_entries_survive_on_revoked_but_backpressure_does_not() -> None:
    book = PauseBook()
    book.pause_until(A, 7.0)
    book.hold([A, B])
    book.on_revoked(A)
    book.on_revoked(B)
    assert book.delayed() == {A: 7.0}
    assert not book.held(A) and not book.held(B)
    assert book.paused() == {A}
    assert book.due_to_resume(7.0) == [A]


def test_pause_until_again_moves_the_due_time() -> None:
    book = PauseBook()
    book.pause_until(A, 7.0)
    book.pause_until(A, 3.0)
    assert book.next_resume_at() == 3.0
    assert book.due_to_resume(3.0) == [A]


PARTS: list[TopicPartition] = [
    ("ductor.delay.100", 0),
    ("ductor.delay.100", 1),
    ("ductor.wakeup.t1", 0),
]


class PauseMachine(RuleBasedStateMachine):
    """A consumer that pauses/resumes exactly what the book tells it to: whatever the sequence,
    the partitions it has paused are the ones the book says are paused, and none stays paused
    once its due time passed and its backpressure is lifted."""

    def __init__(self) -> None:
        super().__init__()
        self.book = PauseBook()
        self.now = 0.0
        self.assigned: set[TopicPartition] = set(PARTS)
        self.consumer_paused: set[TopicPartition] = set()
        self.until: dict[TopicPartition, float] = {}
        self.pressure: set[TopicPartition] = set()

    @precondition(lambda self: bool(self.assigned))
    @rule(data=st.data(), wait=st.floats(0, 5))
    def head_not_due(self, data: st.DataObject, wait: float) -> None:
        tp = data.draw(st.sampled_from(sorted(self.assigned)))
        self.book.pause_until(tp, self.now + wait)
        self.consumer_paused.add(tp)
        self.until[tp] = self.now + wait

    @rule(dt=st.floats(0, 3))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        for tp in self.book.due_to_resume(self.now):
            if tp in self.assigned:
                self.consumer_paused.discard(tp)
        self.until = {tp: at for tp, at in self.until.items() if at > self.now}

    @rule(tps=st.sets(st.sampled_from(PARTS)))
    def hold(self, tps: set[TopicPartition]) -> None:
        tps &= self.assigned
        newly = self.book.hold(sorted(tps))
        assert not (set(newly) & self.consumer_paused), "told to pause an already paused one"
        self.consumer_paused.update(newly)
        self.pressure |= tps

    @rule(tps=st.sets(st.sampled_from(PARTS)))
    def release(self, tps: set[TopicPartition]) -> None:
        resumable = self.book.release(sorted(tps))
        for tp in resumable:
            assert tp in self.consumer_paused
            assert tp not in self.until
            self.consumer_paused.discard(tp)
        self.pressure -= tps

    @precondition(lambda self: bool(self.assigned))
    @rule(data=st.data())
    def revoke(self, data: st.DataObject) -> None:
        tp = data.draw(st.sampled_from(sorted(self.assigned)))
        self.book.on_revoked(tp)
        self.assigned.discard(tp)
        self.consumer_paused.discard(tp)
        self.pressure.discard(tp)

    @precondition(lambda self: self.assigned != set(PARTS))
    @rule(data=st.data())
    def assign_again(self, data: st.DataObject) -> None:
        tp = data.draw(st.sampled_from(sorted(set(PARTS) - self.assigned)))
        self.assigned.add(tp)
        if tp in self.book.delayed():  # the runner re-applies a remembered due time
            self.consumer_paused.add(tp)

    @invariant()
    def consumer_agrees_with_the_book(self) -> None:
        for tp in self.assigned:
            assert (tp in self.consumer_paused) == self.book.is_paused(tp), tp
            assert self.book.held(tp) == (tp in self.pressure)
            # A due time counts until the consumer's next due_to_resume poll picks it up.
            expected = tp in self.pressure or tp in self.until
            assert self.book.is_paused(tp) == expected, tp
        assert set(self.book.delayed()) == set(self.until)


PauseMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestPauseMachine = PauseMachine.TestCase
