"""The reconnect backoff (processor/core/backoff.py): a pure schedule, doubling to a cap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.backoff import FIRST_RETRY_S, MAX_RETRY_S, retry_delay_s


def test_the_default_schedule_doubles_from_100_ms_to_5_s() -> None:
    assert [retry_delay_s(n) for n in range(9)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    )
    assert (FIRST_RETRY_S, MAX_RETRY_S) == (0.1, 5.0)


def test_a_very_long_outage_stays_at_the_cap() -> None:
    assert retry_delay_s(10**6) == MAX_RETRY_S  # no overflow however many retries


@given(st.integers(0, 10_000), st.floats(0.001, 10.0), st.floats(0.0, 100.0))
def test_never_shrinks_never_passes_the_cap(retries: int, first: float, extra: float) -> None:
    cap = first + extra
    delay = retry_delay_s(retries, first, cap)
    assert first <= delay <= cap
    assert retry_delay_s(retries + 1, first, cap) >= delay


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="retries_made"):
        retry_delay_s(-1)
    with pytest.raises(ValueError, match="first_s"):
        retry_delay_s(0, first_s=0.0)
    with pytest.raises(ValueError, match="first_s"):
        retry_delay_s(0, first_s=2.0, cap_s=1.0)
