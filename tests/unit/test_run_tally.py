"""Runs started and ended (core/run_tally.py): a start is the one transition out of pending
that is not a cancel, an end each transition to a final status, force-fails ends only; over
any life a run can have, it starts at most once and each end is counted once."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from processor.core.decide import tick_batch
from processor.core.run_state import RunStatus
from processor.core.run_tally import RunTally

from .fakes import NAMES, NOW_MS, loaded

PENDING, RUNNING = RunStatus.PENDING, RunStatus.RUNNING
SUCCEEDED, FAILED, CANCELLED = RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED


def test_a_first_tick_starts_the_run_and_a_final_status_ends_it() -> None:
    tally = RunTally()
    tally.committed("orders", PENDING, RUNNING)
    tally.committed("orders", RUNNING, RUNNING)  # a step dispatched: neither
    tally.committed("orders", RUNNING, SUCCEEDED)
    tally.committed("orders", PENDING, FAILED)  # its first tick failed it (a map's list)
    assert tally.started == {"orders": 2}
    assert tally.ended == {("orders", SUCCEEDED): 1, ("orders", FAILED): 1}


def test_a_run_cancelled_or_force_failed_before_it_started_only_ends() -> None:
    tally = RunTally()
    tally.committed("orders", PENDING, CANCELLED)
    tally.force_failed("orders")
    assert not tally.started
    assert tally.ended == {("orders", CANCELLED): 1, ("orders", FAILED): 1}


def test_a_run_finished_by_its_first_tick_starts_and_ends_in_one_transition() -> None:
    tally = RunTally()
    tally.committed("empty-map", PENDING, SUCCEEDED)
    assert tally.started == {"empty-map": 1}
    assert tally.ended == {("empty-map", SUCCEEDED): 1}


def test_the_tick_of_a_new_run_is_a_start() -> None:
    run = loaded("r")
    commit = tick_batch({"r": run}, NOW_MS, NAMES)["r"]
    tally = RunTally()
    tally.committed(run.wf.name, run.state.status, commit.state.status)
    assert tally.started == {run.wf.name: 1} and not tally.ended


def test_tallies_add_up_and_an_empty_one_is_false() -> None:
    total, batch = RunTally(), RunTally()
    assert not batch
    batch.committed("a", PENDING, RUNNING)
    batch.committed("b", RUNNING, FAILED)
    assert batch
    total.add(batch)
    total.add(batch)
    total.add(RunTally())
    assert total.started == {"a": 2}
    assert total.ended == {("b", FAILED): 2}


# The transitions a run's status can make: the tick's (out of pending, to an end), a
# force-fail of a live run, and `ductor runs retry` taking a failed run back to running.
_NEXT = {
    PENDING: [RUNNING, SUCCEEDED, FAILED, CANCELLED],
    RUNNING: [RUNNING, SUCCEEDED, FAILED, CANCELLED],
    FAILED: [RUNNING],  # resumed
    SUCCEEDED: [],
    CANCELLED: [],
}


@st.composite
def _lives(draw: st.DrawFn) -> list[tuple[RunStatus, RunStatus, bool]]:
    """A run's life: its transitions (before, after, whether a force-fail wrote it)."""
    status, life = PENDING, []
    for _ in range(draw(st.integers(0, 12))):
        if not _NEXT[status]:
            break
        after = draw(st.sampled_from(_NEXT[status]))
        forced = after is FAILED and status is not FAILED and draw(st.booleans())
        life.append((status, after, forced))
        status = after
    return life


@given(st.lists(_lives(), max_size=6), st.integers(1, 4))
def test_over_any_lives_each_run_starts_at_most_once_and_each_end_counts_once(
    lives: list[list[tuple[RunStatus, RunStatus, bool]]], batches: int
) -> None:
    total = RunTally()
    for index, life in enumerate(lives):
        workflow = f"wf-{index % 2}"
        # The transitions spread over several batches' tallies, added up as the shell does.
        tallies = [RunTally() for _ in range(batches)]
        for step, (before, after, forced) in enumerate(life):
            tally = tallies[step % batches]
            if forced:
                tally.force_failed(workflow)
            else:
                tally.committed(workflow, before, after)
        for tally in tallies:
            total.add(tally)
    expected_started: Counter[str] = Counter()
    expected_ended: Counter[tuple[str, RunStatus]] = Counter()
    for index, life in enumerate(lives):
        workflow = f"wf-{index % 2}"
        left_pending = [a for b, a, forced in life if b is PENDING and not forced]
        if left_pending and left_pending[0] is not CANCELLED:
            expected_started[workflow] += 1
        for before, after, _forced in life:
            if after.terminal and before is not after:
                expected_ended[(workflow, after)] += 1
    assert total.started == expected_started
    assert total.ended == expected_ended
    assert all(n <= len(lives) for n in total.started.values())
