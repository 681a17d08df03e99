"""The claim's verdict (core/claims.py): what a worker does with a task it was handed, from
what the claim statement read. And the pace of claims ahead of the slots (claim_pace.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from processor.core.claim_pace import ClaimPace
from processor.core.claims import SKIPPED, ClaimFacts, ClaimVerdict, died_reason, verdict

MAX_STARTS = 2


def _facts(**changes: object) -> ClaimFacts:
    base = {
        "run_exists": True,
        "current": True,
        "ahead": False,
        "recorded": False,
        "starts": None,
        "starter_alive": False,
        "mine": False,
        "claimed_starts": None,
    }
    return ClaimFacts(**{**base, **changes})  # type: ignore[arg-type]


def test_a_claimed_attempt_runs() -> None:
    assert verdict(_facts(claimed_starts=1), MAX_STARTS, True) is ClaimVerdict.RUN


def test_stale_tasks_are_skipped() -> None:
    assert verdict(_facts(run_exists=False, current=False), 2, True) is ClaimVerdict.RUN_GONE
    assert verdict(_facts(current=False), MAX_STARTS, True) is ClaimVerdict.SUPERSEDED
    # Even one this worker started, or one whose result is in: the run moved on.
    assert verdict(_facts(current=False, mine=True, starts=1), 2, True) is ClaimVerdict.SUPERSEDED


def test_a_task_its_row_never_dispatched_wakes_its_run_and_is_not_run() -> None:
    # The commit that dispatched it was lost after its task went out: the run is woken to
    # dispatch it again from the row it has; this delivery never runs.
    ahead = _facts(current=False, ahead=True)
    assert verdict(ahead, MAX_STARTS, True) is ClaimVerdict.AHEAD
    assert verdict(ahead, MAX_STARTS, False) is ClaimVerdict.AHEAD  # waking costs one tick at most
    assert ClaimVerdict.AHEAD in SKIPPED
    assert verdict(_facts(run_exists=False, current=False), 2, True) is ClaimVerdict.RUN_GONE


def test_a_recorded_attempt_is_not_run_again_and_its_wakeup_is_resent_only_for_the_dead() -> None:
    alive = _facts(recorded=True, starts=1, starter_alive=True)
    dead = _facts(recorded=True, starts=1, starter_alive=False)
    assert verdict(alive, MAX_STARTS, True) is ClaimVerdict.RECORDED
    assert verdict(dead, MAX_STARTS, True) is ClaimVerdict.RESEND
    # Not sure yet who is gone (an outage of its own just ended): nothing sent twice.
    assert verdict(dead, MAX_STARTS, False) is ClaimVerdict.RECORDED


def test_an_attempt_this_worker_started_is_its_own_claim() -> None:
    # The answer to its claim was lost with the connection; the claim was asked again.
    assert verdict(_facts(starts=1, mine=True, starter_alive=True), 2, True) is ClaimVerdict.RUN


def test_an_attempt_a_live_worker_holds_waits() -> None:
    assert verdict(_facts(starts=1, starter_alive=True), MAX_STARTS, True) is ClaimVerdict.HELD
    # A claim that raced another one and lost (nothing read, nothing taken).
    assert verdict(_facts(), MAX_STARTS, True) is ClaimVerdict.HELD


def test_the_attempts_of_a_worker_that_died_run_again_once_then_fail() -> None:
    assert verdict(_facts(starts=1), MAX_STARTS, True) is ClaimVerdict.RERUN
    assert verdict(_facts(starts=2), MAX_STARTS, True) is ClaimVerdict.DIED
    assert verdict(_facts(starts=1), 1, True) is ClaimVerdict.DIED  # no reruns allowed
    # Without the right to judge, a silent worker is not taken for dead.
    assert verdict(_facts(starts=2), MAX_STARTS, False) is ClaimVerdict.HELD
    assert "died" in died_reason(2) and "2 times" in died_reason(2)


@given(
    run_exists=st.booleans(),
    current=st.booleans(),
    ahead=st.booleans(),
    recorded=st.booleans(),
    starts=st.none() | st.integers(1, 5),
    starter_alive=st.booleans(),
    mine=st.booleans(),
    claimed=st.none() | st.integers(1, 5),
    max_starts=st.integers(1, 4),
    may_judge=st.booleans(),
)
def test_a_step_never_runs_on_a_stale_attempt_nor_beside_a_live_holder(
    run_exists: bool,
    current: bool,
    ahead: bool,
    recorded: bool,
    starts: int | None,
    starter_alive: bool,
    mine: bool,
    claimed: int | None,
    max_starts: int,
    may_judge: bool,
) -> None:
    facts = ClaimFacts(run_exists, current, ahead, recorded, starts, starter_alive, mine, claimed)
    decided = verdict(facts, max_starts, may_judge)
    if claimed is None:
        # Without a claim, only its own start runs: never another live worker's, never a
        # stale or recorded attempt, never one past its starts.
        if decided is ClaimVerdict.RUN:
            assert mine and current and run_exists and not recorded
        if decided is ClaimVerdict.DIED:
            assert not starter_alive and may_judge and starts is not None
            assert starts >= max_starts
        if decided is ClaimVerdict.RESEND:
            assert recorded and not starter_alive and may_judge
        if decided is ClaimVerdict.AHEAD:
            assert ahead and not current and run_exists
    if current and run_exists and not recorded and starter_alive and not mine and not claimed:
        assert decided is ClaimVerdict.HELD


def test_claims_go_ahead_of_the_slots_by_what_they_finish_in_four_round_trips() -> None:
    pace = ClaimPace(slots=8, cap=512, now=0.0)
    assert pace.limit(0.0) == 16  # nothing known yet: two per slot
    now = 0.0
    for _ in range(40):  # 4,000 steps a second, claims taking 10 ms
        now += 0.25
        pace.ended(now, 1000)
        pace.claimed(0.010)
    assert 16 + 140 <= pace.limit(now + 0.3) <= 16 + 4 * 4000 * 0.010 + 1
    slow = ClaimPace(slots=8, cap=512, now=0.0)
    for i in range(1, 40):  # slow steps: a few a second
        slow.ended(i * 0.25, 1)
        slow.claimed(0.010)
    assert slow.limit(10.0) == 16
    capped = ClaimPace(slots=8, cap=64, now=0.0)
    for i in range(1, 40):
        capped.ended(i * 0.25, 100_000)
        capped.claimed(0.1)
    assert capped.limit(10.0) == 64


def test_the_start_window_is_the_slots_and_what_they_finish_in_two_round_trips() -> None:
    pace = ClaimPace(slots=8, cap=512, now=0.0)
    assert pace.start_window(0.0) == 8  # nothing known yet: a slot's worth
    now = 0.0
    for _ in range(40):  # 4,000 steps a second, claims taking 10 ms
        now += 0.25
        pace.ended(now, 1000)
        pace.claimed(0.010)
    window = pace.start_window(now + 0.3)
    assert 8 + 70 <= window <= 8 + 2 * 4000 * 0.010 + 1
    assert window < pace.limit(now + 0.3)  # a crash leaves fewer reruns than claims
    capped = ClaimPace(slots=8, cap=64, now=0.0)
    for i in range(1, 40):
        capped.ended(i * 0.25, 100_000)
        capped.claimed(0.1)
    assert capped.start_window(10.0) == 64


def test_a_task_is_claimed_ahead_only_as_far_as_a_quarter_of_its_timeout() -> None:
    pace = ClaimPace(slots=4, cap=5000, now=0.0)
    # Nothing known yet, or a free slot waiting: claimed whatever the timeout.
    assert pace.within_horizon(1000, 1000)
    for i in range(1, 40):  # 1,000 steps a second, claims taking 300 ms (a loaded database)
        pace.ended(i * 0.25, 250)
        pace.claimed(0.3)
    assert pace.limit(10.0) > 1000  # four round trips of work: more than a second of it
    assert pace.within_horizon(3, 1000)  # a slot's worth: always
    assert pace.within_horizon(250, 1000)  # a quarter of a second ahead of its start
    assert not pace.within_horizon(260, 1000)
    assert pace.within_horizon(2500, 10_000)  # a longer timeout, a longer horizon
    assert pace.within_horizon(100_000, None)  # no timeout: the limit alone
