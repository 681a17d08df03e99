"""The tools' one way to wait (processor/tools/waiting.py): a condition is asked at once and
never given up on before its deadline."""

from __future__ import annotations

from processor.tools.waiting import eventually, polls


def test_a_deadline_already_past_still_asks_once() -> None:
    asked: list[int] = []

    def never() -> bool:
        asked.append(1)
        return False

    assert not eventually(never, timeout_s=-1.0)
    assert asked == [1]
    assert len(list(polls(-1.0, 0.0))) == 1


def test_a_condition_that_comes_true_ends_the_wait_at_once() -> None:
    answers = iter([False, False, True, False])
    assert eventually(lambda: next(answers), timeout_s=60.0, interval_s=0.001)
    assert list(answers) == [False]  # asked until true, not once more


def test_the_polls_are_monotonic_times_and_a_loop_ends_by_its_break() -> None:
    times = []
    for now in polls(60.0, 0.001):
        times.append(now)
        if len(times) == 3:
            break
    else:
        raise AssertionError("timed out")
    assert times == sorted(times) and len(set(times)) == 3
