"""The backlog phase's judgement of each run (processor/tools/chaos_backlog.py): what counts
as failed for queue time, what a worker's kill explains, and the checks of the whole phase.
The phase itself runs on the real services in tests/integration/test_chaos_backlog.py."""

from __future__ import annotations

from collections import Counter

from processor.tools.chaos_backlog import (
    KILLED,
    NODE,
    OTHER,
    QUEUE,
    UNEXPLAINED,
    BacklogPlan,
    RunFacts,
    check,
    classify,
    kill_at,
)

TIMEOUT = "step 'only' failed after 1 attempt(s): attempt 1 timed out after 1000 ms"


def _run(
    status: str = "failed",
    reason: str | None = TIMEOUT,
    started: float | None = 100.0,
    ended: float = 101.2,
    waited: float | None = 5.0,
    run_id: str = "r",
    starts: int = 1,
) -> RunFacts:
    return RunFacts(run_id, status, reason, started, ended, waited, starts)


def test_a_succeeded_run_is_no_failure() -> None:
    assert classify(_run(status="succeeded", reason=None), 1000, []) is None


def test_a_timeout_of_an_attempt_no_worker_started_is_queue_time() -> None:
    assert classify(_run(started=None, waited=None), 1000, [100.5]) == QUEUE


def test_a_timeout_judged_before_its_start_plus_its_timeout_is_queue_time() -> None:
    # Started at 100 s, failed at 100.4 s: its deadline counted from before its start.
    assert classify(_run(ended=100.4), 1000, [100.2]) == QUEUE


def test_a_kill_while_it_ran_explains_its_timeout() -> None:
    assert classify(_run(), 1000, [100.5]) == KILLED
    assert classify(_run(), 1000, [101.0]) == KILLED  # at its deadline, to the ms


def test_a_kill_before_its_start_or_after_its_deadline_explains_nothing() -> None:
    assert classify(_run(), 1000, [99.0, 102.0]) == UNEXPLAINED
    assert classify(_run(), 1000, []) == UNEXPLAINED


def test_a_rerun_after_a_kill_that_timed_out_was_cut_short_by_the_kill() -> None:
    # The row keeps the rerun's start (101.8 s), after the coordinator had timed the attempt
    # out (101.2 s) from its first start, which a kill at 100.5 s cut short.
    assert classify(_run(started=101.8, starts=2), 1000, [100.5]) == KILLED
    # The rerun itself timed out (its child process started too slowly): the kill's cost.
    assert classify(_run(started=101.8, ended=108.0, starts=2), 1000, [100.5]) == KILLED
    # No kill before its end: nothing explains a second start.
    assert classify(_run(started=101.8, starts=2), 1000, [110.0]) == QUEUE


def test_an_attempt_whose_worker_died_each_time_it_started_was_cut_short_by_kills() -> None:
    died = (
        "step 'only' failed after 1 attempt(s): the worker running this step died (2 times,"
        " the step's own process included): not started again; see the worker's crash-reruns"
        " setting"
    )
    assert classify(_run(reason=died, starts=2), 1000, [100.5]) == KILLED


def test_another_failure_or_end_is_its_own_kind() -> None:
    assert classify(_run(reason="no step function registered for type 'fast'"), 1000, []) == OTHER
    assert classify(_run(status="cancelled", reason=None), 1000, []) == OTHER


def test_the_phase_passes_with_kills_explaining_every_failure() -> None:
    facts = [_run(status="succeeded", reason=None, run_id=f"ok-{i}") for i in range(3)]
    facts += [_run(run_id="cut"), _run(run_id="claimed")]
    runs = Counter({(f"ok-{i}", NODE, 1): 1 for i in range(3)} | {("cut", NODE, 1): 1})
    problems: list[str] = []
    report = check(BacklogPlan(timeout_ms=1000), facts, [100.5], runs, 5, 30.0, problems)
    assert report.ok, problems
    assert report.kinds == Counter({"succeeded": 3, KILLED: 2})
    assert report.killed_unrun == 1  # "claimed": its step had not begun
    assert "(1 of them claimed, their step not begun yet)" in "\n".join(report.lines())
    assert report.waited_longer == 5
    assert "PASSED" in report.lines()[-1]


def test_queue_time_failures_are_problems_named_with_examples() -> None:
    facts = [_run(started=None, waited=None, run_id=f"q-{i}") for i in range(5)]
    facts.append(_run(status="succeeded", reason=None, run_id="ok"))
    problems: list[str] = []
    report = check(BacklogPlan(), facts, [], Counter({("ok", NODE, 1): 1}), 6, 1.0, problems)
    assert not report.ok
    assert report.kinds[QUEUE] == 5
    assert problems[0].startswith(f"5 runs {QUEUE}, e.g. q-0 ")
    assert "q-3" not in problems[0]  # three examples at most


def test_the_phase_fails_when_it_tested_nothing_or_lost_runs() -> None:
    quick = [_run(status="succeeded", reason=None, waited=0.2, run_id="ok")]
    problems: list[str] = []
    check(BacklogPlan(), quick, [], Counter({("ok", NODE, 1): 1}), 2, 1.0, problems)
    assert any("tested nothing" in p for p in problems)
    assert any("1 runs found of 2" in p for p in problems)
    assert any("no worker was killed" in p for p in problems)


def test_a_succeeded_run_whose_step_never_ran_is_a_problem() -> None:
    problems: list[str] = []
    check(BacklogPlan(), [_run(status="succeeded", reason=None)], [], Counter(), 1, 1.0, problems)
    assert any("succeeded without running its step" in p for p in problems)


def test_the_kills_are_spread_over_the_backlog() -> None:
    plan = BacklogPlan(runs=3000, kills=8)
    assert [kill_at(done, plan) for done in range(8)] == [1, 375, 750, 1125, 1500, 1875, 2250, 2625]
