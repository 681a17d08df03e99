"""The conflict policy (processor/policy.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.outcomes import ForceFailReason
from processor.core.policy import (
    IN_PROCESS_BACKOFF_MS,
    MAX_IN_PROCESS_TRIES,
    ForceFail,
    NextRequeue,
    after_exhausted_conflicts,
    retry_wait_ms,
)
from processor.core.routing import DELAY_RUNGS_MS

from .strategies import FAST


def test_in_process_waits_are_0_10_20_40_1000_then_none() -> None:
    assert [retry_wait_ms(n) for n in range(8)] == [0, 10, 20, 40, 1000, None, None, None]
    assert IN_PROCESS_BACKOFF_MS == (0, 10, 20, 40, 1000)
    assert MAX_IN_PROCESS_TRIES == 5
    assert retry_wait_ms(10**9) is None


def test_first_exhaustion_requeues_on_the_first_rung() -> None:
    decision = after_exhausted_conflicts(
        requeue_count=0, requeue_seq=0, observed_seq=None, current_seq=7, livelock_requeues=8
    )
    assert decision == NextRequeue(requeue_count=1, requeue_seq=1, delay_ms=100, observed_seq=7)


def test_a_run_that_never_progresses_is_force_failed_after_the_limit() -> None:
    limit = 8
    count, requeue_seq, observed = 0, 0, None
    delays: list[int] = []
    for _ in range(limit):
        decision = after_exhausted_conflicts(
            requeue_count=count,
            requeue_seq=requeue_seq,
            observed_seq=observed,
            current_seq=42,
            livelock_requeues=limit,
        )
        assert isinstance(decision, NextRequeue)
        delays.append(decision.delay_ms)
        count, requeue_seq, observed = (
            decision.requeue_count,
            decision.requeue_seq,
            decision.observed_seq,
        )
    assert delays == [100, 200, 400, 800, 1600, 3200, 6400, 10000]
    final = after_exhausted_conflicts(
        requeue_count=count,
        requeue_seq=requeue_seq,
        observed_seq=observed,
        current_seq=42,
        livelock_requeues=limit,
    )
    assert final == ForceFail(reason=ForceFailReason.LIVELOCK, requeues=limit)


def test_progress_restarts_the_count_even_past_the_limit() -> None:
    decision = after_exhausted_conflicts(
        requeue_count=50, requeue_seq=60, observed_seq=3, current_seq=4, livelock_requeues=8
    )
    assert decision == NextRequeue(requeue_count=1, requeue_seq=61, delay_ms=100, observed_seq=4)


def test_limit_of_one_fails_at_the_first_non_progressing_round() -> None:
    first = after_exhausted_conflicts(
        requeue_count=0, requeue_seq=0, observed_seq=None, current_seq=1, livelock_requeues=1
    )
    assert first == NextRequeue(1, 1, 100, 1)
    second = after_exhausted_conflicts(
        requeue_count=1, requeue_seq=1, observed_seq=1, current_seq=1, livelock_requeues=1
    )
    assert second == ForceFail(ForceFailReason.LIVELOCK, 1)


@pytest.mark.parametrize("n", range(12))
def test_delay_of_the_nth_non_progressing_requeue(n: int) -> None:
    decision = after_exhausted_conflicts(
        requeue_count=n, requeue_seq=n, observed_seq=5, current_seq=5, livelock_requeues=1000
    )
    assert isinstance(decision, NextRequeue)
    assert decision.delay_ms == min(100 * 2**n, 10_000)
    assert decision.delay_ms in DELAY_RUNGS_MS
    assert decision.requeue_count == n + 1


@FAST
@given(
    limit=st.integers(1, 12),
    start_seq=st.integers(0, 1000),
    progress=st.lists(st.booleans(), min_size=1, max_size=40),
)
def test_requeue_lineage(limit: int, start_seq: int, progress: list[bool]) -> None:
    """Follow one run's lineage of requeues: each round the run either progressed (its seq
    moved since the envelope's observed_seq) or not; model the expected count alongside."""
    count, requeue_seq, observed = 0, 0, None
    seq = start_seq
    expected_non_progressing = 0
    keys: list[int] = []
    for moved in progress:
        if moved:
            seq += 1
        non_progressing = expected_non_progressing if (observed is not None and not moved) else 0
        decision = after_exhausted_conflicts(
            requeue_count=count,
            requeue_seq=requeue_seq,
            observed_seq=observed,
            current_seq=seq,
            livelock_requeues=limit,
        )
        if non_progressing >= limit:
            assert decision == ForceFail(reason=ForceFailReason.LIVELOCK, requeues=non_progressing)
            assert not moved and observed == seq
            return
        assert isinstance(decision, NextRequeue)
        assert decision.requeue_count == non_progressing + 1
        assert decision.requeue_seq == requeue_seq + 1  # strictly increasing: distinct Kafka keys
        assert decision.delay_ms == min(100 * 2**non_progressing, 10_000)
        assert decision.delay_ms in DELAY_RUNGS_MS
        assert decision.observed_seq == seq
        keys.append(decision.requeue_seq)
        count, requeue_seq, observed = (
            decision.requeue_count,
            decision.requeue_seq,
            decision.observed_seq,
        )
        expected_non_progressing = decision.requeue_count
        assert count <= limit
    assert keys == sorted(set(keys))


@FAST
@given(
    count=st.integers(0, 10_000),
    requeue_seq=st.integers(0, 10**6),
    observed=st.one_of(st.none(), st.integers(0, 10**6)),
    current=st.integers(0, 10**6),
    limit=st.integers(1, 1000),
)
def test_decision_shape(
    count: int, requeue_seq: int, observed: int | None, current: int, limit: int
) -> None:
    decision = after_exhausted_conflicts(
        requeue_count=count,
        requeue_seq=requeue_seq,
        observed_seq=observed,
        current_seq=current,
        livelock_requeues=limit,
    )
    progressed = observed is None or observed != current
    if isinstance(decision, ForceFail):
        assert not progressed
        assert decision.reason == "livelock"
        assert decision.requeues == count >= limit
    else:
        assert decision.requeue_count == (1 if progressed else count + 1)
        assert decision.requeue_seq == requeue_seq + 1
        assert decision.delay_ms in DELAY_RUNGS_MS
        assert decision.observed_seq == current
