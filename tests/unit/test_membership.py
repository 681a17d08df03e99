"""When a group member is stuck (core/membership.py): records waiting on a partition that the
broker gives it (held or targeted) and it does not hold, or that it reads and does not fetch;
never records that another member holds, that no member holds, or that wait on a paused
partition."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processor.core.membership import GroupView, Holding, IdleWatch, judge

T = "steps"


def _view(owners: dict[int, str], committed: dict[int, int], ends: dict[int, int]) -> GroupView:
    return GroupView(
        {(T, p): o for p, o in committed.items()},
        {(T, p): e for p, e in ends.items()},
        {(T, p): m for p, m in owners.items()},
    )


def _holding(held: set[int], reading: set[int] | None = None, at: int = 10) -> Holding:
    reading = held if reading is None else reading
    return Holding(
        "me", {(T, p) for p in held}, {(T, p) for p in reading}, {(T, p): at for p in reading}
    )


def test_partitions_the_group_gives_it_but_it_does_not_hold_are_stuck() -> None:
    stuck = judge(_view({0: "me", 1: "me"}, {0: 3, 1: 10}, {0: 10, 1: 10}), _holding(set()))
    assert stuck is not None
    assert stuck.reason == "the group gives it steps[0], which it does not hold"
    assert stuck.waiting == 7  # (partition 1 has nothing waiting)


def test_records_no_member_holds_are_the_coordinators_to_give() -> None:
    """Right after a broker restart many partitions are held by no member for a moment: a
    member that joined again then only added to the churn."""
    assert judge(_view({}, {0: 3}, {0: 5}), _holding(set())) is None


def test_a_partition_the_coordinator_means_for_it_and_it_does_not_hold_is_stuck() -> None:
    view = GroupView({(T, 0): 3}, {(T, 0): 5}, owners={}, targets={(T, 0): "me"})
    stuck = judge(view, _holding(set()))
    assert stuck is not None and stuck.reason.startswith("the group gives it steps[0]")


def test_a_held_partition_read_but_not_fetched_is_stuck() -> None:
    stuck = judge(_view({0: "me"}, {0: 3}, {0: 9}), _holding({0}, at=3))
    assert stuck is not None and "fetches nothing" in stuck.reason
    # Fetched (the records are in hand, not done yet): not stuck.
    assert judge(_view({0: "me"}, {0: 3}, {0: 9}), _holding({0}, at=9)) is None


def test_a_paused_partition_waits_by_choice() -> None:
    assert judge(_view({0: "me"}, {0: 3}, {0: 9}), _holding({0}, reading=set())) is None


def test_records_another_member_holds_are_its_own() -> None:
    assert judge(_view({0: "other"}, {0: 0}, {0: 1000}), _holding(set())) is None


def test_a_partition_never_committed_counts_from_its_start() -> None:
    view = GroupView({(T, 0): 4}, {(T, 0): 4}, {})  # the start is 4: nothing waits
    assert view.waiting() == {}


@given(
    st.dictionaries(st.integers(0, 5), st.sampled_from(["me", "other"])),
    st.dictionaries(st.integers(0, 5), st.integers(0, 50)),
    st.dictionaries(st.integers(0, 5), st.integers(0, 50)),
    st.sets(st.integers(0, 5)),
)
def test_nothing_waiting_is_never_stuck(
    owners: dict[int, str], committed: dict[int, int], ends: dict[int, int], held: set[int]
) -> None:
    """Whatever is held or owned, partitions at their ends make no member stuck; and a
    member with records waiting only on others' partitions is never stuck."""
    caught_up = dict(ends)
    assert judge(_view(owners, caught_up, ends), _holding(held, at=0)) is None
    others = dict.fromkeys(ends, "other")
    assert judge(_view(others, committed, ends), _holding(set())) is None


def test_the_watch_looks_after_a_quiet_time_then_once_per_quiet_time() -> None:
    watch = IdleWatch(5.0, now=0.0)
    assert not watch.turn(4.9, took=False)
    assert watch.turn(5.0, took=False)
    watch.looked(5.0)
    assert not watch.turn(9.0, took=False)
    assert watch.turn(10.0, took=False)
    assert not watch.turn(11.0, took=True)
    assert not watch.turn(15.9, took=False)
    assert watch.turn(16.0, took=False)
