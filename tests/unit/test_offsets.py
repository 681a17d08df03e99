"""OffsetTracker (processor/offsets.py): the stored position never passes a record in flight."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from processor.core.offsets import Finished, OffsetTracker, decode_finished, encode_finished
from processor.core.shapes import TopicPartition

from .strategies import FAST

PARTITIONS: list[TopicPartition] = [
    ("ductor.wakeup.t0", 0),
    ("ductor.wakeup.t0", 1),
    ("d.delay.100", 0),
]


def test_out_of_order_completion() -> None:
    tracker = OffsetTracker()
    tp = ("t", 0)
    for offset in (10, 11, 12):
        tracker.started(tp, offset)
    assert tracker.committable() == {}  # nothing done yet
    tracker.done(tp, 12)
    assert tracker.committable() == {tp: 10}  # 10 is still in flight: stay before it
    tracker.done(tp, 11)
    assert tracker.committable() == {}  # not moved
    tracker.done(tp, 10)
    assert tracker.committable() == {tp: 13}
    assert tracker.committable() == {}
    assert tracker.in_flight(tp) == 0


def test_done_twice_or_unknown_is_ignored() -> None:
    tracker = OffsetTracker()
    tp = ("t", 0)
    tracker.started(tp, 5)
    tracker.started(tp, 5)  # a record started twice counts once
    assert tracker.in_flight(tp) == 1
    tracker.done(tp, 4)
    tracker.done(("other", 0), 5)
    assert tracker.committable() == {}
    tracker.done(tp, 5)
    tracker.done(tp, 5)
    assert tracker.committable() == {tp: 6}


def test_forget_drops_a_partition() -> None:
    tracker = OffsetTracker()
    a, b = ("t", 0), ("t", 1)
    for offset in (0, 1, 2):
        tracker.started(a, offset)
        tracker.started(b, offset)
    tracker.done(a, 0)
    tracker.done(b, 0)
    assert tracker.committable() == {a: 1, b: 1}
    assert tracker.total_in_flight() == 4
    tracker.forget(a)
    assert tracker.in_flight(a) == 0
    assert tracker.total_in_flight() == 2
    tracker.done(a, 1)  # finished after the revocation: the new owner redoes it
    tracker.done(b, 1)
    assert tracker.committable() == {b: 2}
    # Assigned again: the partition starts afresh from the committed position.
    tracker.started(a, 1)
    tracker.done(a, 1)
    assert tracker.committable() == {a: 2}


@FAST
@given(
    st.lists(st.integers(1, 3), min_size=1, max_size=40),  # gaps between offsets
    st.integers(0, 10**6),
    st.integers(0, 2**32 - 1),
)
def test_random_completion_order_reaches_last_plus_one(
    gaps: list[int], first: int, seed: int
) -> None:
    rng = random.Random(seed)
    tp = ("t", 3)
    offsets = []
    position = first
    for gap in gaps:
        offsets.append(position)
        position += gap
    tracker = OffsetTracker()
    pending = list(offsets)  # not started yet (Kafka hands them out in order)
    in_flight: set[int] = set()
    stored = -1
    while pending or in_flight:
        if pending and (not in_flight or rng.random() < 0.5):
            offset = pending.pop(0)
            tracker.started(tp, offset)
            in_flight.add(offset)
        else:
            offset = rng.choice(sorted(in_flight))
            tracker.done(tp, offset)
            in_flight.discard(offset)
        if rng.random() < 0.5:
            moved = tracker.committable()
            if tp in moved:
                assert moved[tp] > stored
                stored = moved[tp]
                assert all(o >= stored for o in in_flight), (stored, in_flight)
    tracker.committable()
    final = tracker.committable()
    assert final == {}
    # Everything is done: the position is one past the last offset.
    tracker.started(tp, offsets[-1] + 1)
    tracker.done(tp, offsets[-1] + 1)
    assert tracker.committable() == {tp: offsets[-1] + 2}


class OffsetMachine(RuleBasedStateMachine):
    """Several partitions, records started in offset order, finished in any order, partitions
    revoked and assigned again; the model knows which offsets are in flight."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker = OffsetTracker()
        self.next_offset: dict[TopicPartition, int] = {}
        self.in_flight: dict[TopicPartition, set[int]] = {}
        self.done_up_to: dict[TopicPartition, int] = {}  # highest offset finished
        self.stored: dict[TopicPartition, int] = {}

    @initialize(starts=st.lists(st.integers(0, 1000), min_size=3, max_size=3))
    def assign(self, starts: list[int]) -> None:
        for tp, start in zip(PARTITIONS, starts, strict=True):
            self.next_offset[tp] = start
            self.in_flight[tp] = set()

    @rule(tp=st.sampled_from(PARTITIONS), gap=st.integers(0, 2))
    def start(self, tp: TopicPartition, gap: int) -> None:
        offset = self.next_offset[tp] + gap
        self.next_offset[tp] = offset + 1
        self.tracker.started(tp, offset)
        self.in_flight[tp].add(offset)

    @precondition(lambda self: any(self.in_flight.values()))
    @rule(data=st.data())
    def finish(self, data: st.DataObject) -> None:
        tp = data.draw(st.sampled_from([tp for tp in PARTITIONS if self.in_flight[tp]]))
        offset = data.draw(st.sampled_from(sorted(self.in_flight[tp])))
        self.tracker.done(tp, offset)
        self.in_flight[tp].discard(offset)
        self.done_up_to[tp] = max(self.done_up_to.get(tp, -1), offset)

    @rule(tp=st.sampled_from(PARTITIONS))
    def revoke_and_reassign(self, tp: TopicPartition) -> None:
        self.tracker.forget(tp)
        assert self.tracker.in_flight(tp) == 0
        # The new assignment resumes from the last stored position (or where we were).
        self.next_offset[tp] = self.stored.get(tp, self.next_offset[tp])
        self.in_flight[tp] = set()
        self.done_up_to.pop(tp, None)
        self.stored.pop(tp, None)

    def _safe_position(self, tp: TopicPartition) -> int | None:
        """Where reading must resume: the lowest offset in flight, else one past the highest
        finished (offsets may have gaps: compaction, transaction markers)."""
        if tp not in self.done_up_to:
            return None  # nothing finished since the assignment: nothing to store
        if self.in_flight[tp]:
            return min(self.in_flight[tp])
        return self.done_up_to[tp] + 1

    @rule()
    def commit(self) -> None:
        moved = self.tracker.committable()
        for tp in PARTITIONS:
            expected = self._safe_position(tp)
            if tp in moved:
                position = moved[tp]
                assert position > self.stored.get(tp, -1), "the stored position never moves back"
                assert all(o >= position for o in self.in_flight[tp]), "passed a record in flight"
                assert position == expected
                self.stored[tp] = position
            else:
                assert expected is None or expected <= self.stored.get(tp, -1)
        assert self.tracker.committable() == {}  # nothing moves twice

    @invariant()
    def counts_match(self) -> None:
        for tp in PARTITIONS:
            assert self.tracker.in_flight(tp) == len(self.in_flight.get(tp, ()))
        assert self.tracker.total_in_flight() == sum(len(s) for s in self.in_flight.values())

    def teardown(self) -> None:
        # Finish everything: each partition that finished anything ends one past its last.
        for tp in PARTITIONS:
            for offset in sorted(self.in_flight.get(tp, ())):
                self.tracker.done(tp, offset)
                self.done_up_to[tp] = max(self.done_up_to.get(tp, -1), offset)
        moved = self.tracker.committable()
        for tp in PARTITIONS:
            if tp in self.done_up_to:
                assert {**self.stored, **moved}[tp] == self.done_up_to[tp] + 1


OffsetMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
TestOffsetMachine = OffsetMachine.TestCase


# -- what is done past the committed offset (the commit's metadata) -------------------------


def test_the_records_done_past_a_record_in_flight_are_what_the_commit_says() -> None:
    tracker = OffsetTracker()
    tp = ("t", 0)
    for offset in range(10, 20):
        tracker.started(tp, offset)
    for offset in (11, 12, 14, 15, 16, 19):
        tracker.done(tp, offset)
    assert tracker.position(tp) == 10
    finished = tracker.finished_past(tp)
    assert finished == Finished(20, frozenset({10, 13, 17, 18}))
    decoded = decode_finished(10, encode_finished(10, finished))
    assert decoded is not None
    assert [o for o in range(10, 25) if decoded.covers(o)] == [11, 12, 14, 15, 16, 19]


def test_nothing_past_the_position_says_nothing() -> None:
    tracker = OffsetTracker()
    tp = ("t", 0)
    assert tracker.position(tp) is None and tracker.finished_past(tp) is None
    tracker.started(tp, 5)
    tracker.done(tp, 5)
    assert tracker.position(tp) == 6 and tracker.finished_past(tp) is None
    assert decode_finished(6, "") is None
    assert decode_finished(6, "someone else's metadata") is None
    assert decode_finished(6, "ductor-done-1:zz!:") is None


@given(
    position=st.integers(min_value=0, max_value=10**12),
    span=st.integers(min_value=1, max_value=5000),
    data=st.data(),
)
@settings(FAST)
def test_encoding_keeps_what_is_done_within_the_limit(
    position: int, span: int, data: st.DataObject
) -> None:
    """Decoded, the metadata never says a record is done that was not, and says every done
    one up to where it ends; it fits the limit the broker allows."""
    pending = data.draw(st.frozensets(st.integers(position, position + span - 1)))
    finished = Finished(position + span, pending)
    metadata = encode_finished(position, finished, limit=300)
    assert len(metadata) <= 300
    decoded = decode_finished(position, metadata)
    assert decoded is not None and position < decoded.end <= finished.end
    assert all(finished.covers(o) == decoded.covers(o) for o in range(position, decoded.end))
    assert not decoded.covers(decoded.end)


def test_the_next_owner_skips_what_was_done_and_says_it_again_when_it_gives_up() -> None:
    """A's commit (position 10, done: 11, 12, 14) reaches B; B does 10 and 13, then gives the
    partition up having read up to 13: its commit carries what it did and what A had done."""
    tp = ("t", 0)
    tracker = OffsetTracker()
    tracker.learn(tp, decode_finished(10, encode_finished(10, Finished(15, frozenset({10, 13})))))
    for offset in (10, 11, 12, 13):
        if not tracker.done_before(tp, offset):
            tracker.started(tp, offset)
    assert tracker.in_flight(tp) == 2  # 10 and 13: A had not done them
    tracker.done(tp, 13)
    position = tracker.position(tp)
    assert position == 10
    decoded = decode_finished(10, tracker.commit_metadata(tp, 10))
    assert decoded is not None
    assert [o for o in range(10, 16) if decoded.covers(o)] == [11, 12, 13, 14]
    assert not tracker.done_before(tp, 15)  # read past what A said: nothing more to skip
    assert OffsetTracker().commit_metadata(tp, 10) == ""


def test_merged_records_are_done_by_either() -> None:
    a = Finished(10, frozenset({3, 7}))
    b = Finished(8, frozenset({5, 7}))
    merged = a.merge(b)
    assert merged == Finished(10, frozenset({7}))
    assert a.merge(None) is a
