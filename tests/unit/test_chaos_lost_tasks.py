"""Which timed-out attempts the chaos run counts as lost tasks (processor/tools/chaos_steps.py):
only those no worker took. A step's timeout counts from its start, so an attempt whose worker
was killed while running it, and whose rerun did not end in time, times out with no result:
the kill's cost, not a lost task."""

from __future__ import annotations

from processor.tools.chaos_steps import never_ran

ATTEMPT = ("chaos-ab12cd-172", "transform", 2)


def test_an_attempt_no_worker_took_is_lost() -> None:
    assert never_ran(ATTEMPT, result_recorded=False, reached=set())
    assert never_ran(ATTEMPT, result_recorded=False, reached={("chaos-ab12cd-172", "fetch", 2)})


def test_an_attempt_a_worker_took_and_died_running_is_not_lost() -> None:
    assert not never_ran(ATTEMPT, result_recorded=False, reached={ATTEMPT})


def test_an_attempt_with_a_result_is_not_lost() -> None:
    assert not never_ran(ATTEMPT, result_recorded=True, reached=set())
