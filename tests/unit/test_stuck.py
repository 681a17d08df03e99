"""The stuck sweep's verdict (core/stuck.py): a run is failed as stuck only when a tick with
everything recorded for it cannot move it."""

from __future__ import annotations

from dataclasses import replace

from processor.core.model import LoadedRun, Started, Starts, StepOutcome, StepResult, UnreadableRun
from processor.core.routing import TopicNames
from processor.core.run_state import NodeState, NodeStatus, RunStatus, initial_state, state_checksum
from processor.core.stuck import Fail, Leave, Wake, judge_stuck

from .fakes import NOW_MS, WF

NAMES = TopicNames("ductor")


def _running(
    due_ms: int | None, results: tuple[StepResult, ...] = (), starts: Starts | None = None
) -> LoadedRun:
    """The first step in flight (attempt 1, due at ``due_ms``), seq 1; ``starts``: what the
    load read of its start."""
    initial = initial_state(WF)
    nodes = initial.node_map()
    nodes["first"] = NodeState(NodeStatus.DISPATCHED, 1, due_ms)
    state = replace(initial.with_nodes(nodes), status=RunStatus.RUNNING, seq=1)
    return LoadedRun(
        "r", WF, state, 3, "t0", results, stored_checksum=state_checksum(state), starts=starts
    )


def test_a_run_whose_recorded_result_a_tick_would_apply_is_woken_on_its_tier() -> None:
    result = StepResult("first", 1, StepOutcome.SUCCEEDED, None)
    assert judge_stuck(_running(None, (result,)), 1, NOW_MS, NAMES) == Wake("t0")


def test_a_run_whose_deadline_passed_or_that_never_started_is_woken() -> None:
    started_long_ago = (("first", Started(1, NOW_MS - 3_600_000)),)
    assert judge_stuck(_running(NOW_MS - 1, starts=started_long_ago), 1, NOW_MS, NAMES) == Wake(
        "t0"
    )
    pending = initial_state(WF)
    never = LoadedRun("r", WF, pending, 1, "t2", stored_checksum=state_checksum(pending))
    assert judge_stuck(never, 0, NOW_MS, NAMES) == Wake("t2")


def test_a_run_whose_attempt_no_worker_started_is_failed_once_stuck() -> None:
    """Its step has no schedule-to-start bound and its task is in no worker's hands (no
    start recorded) for longer than the stuck threshold: nothing moves it (core/tick.py,
    rule 4: time in a queue never times an attempt out), and the watchdog ends it."""
    run = _running(NOW_MS - 3_600_000, starts=())
    assert isinstance(judge_stuck(run, 1, NOW_MS, NAMES), Fail)


def test_a_run_nothing_can_move_is_failed_on_its_loaded_checksum() -> None:
    run = _running(None)
    verdict = judge_stuck(run, 1, NOW_MS, NAMES)
    assert isinstance(verdict, Fail)
    assert verdict.write.loaded_checksum == run.stored_checksum
    assert verdict.write.state.status is RunStatus.FAILED and verdict.write.state.seq == 2
    assert verdict.workflow == WF.name  # counted as an end of its workflow


def test_a_run_that_moved_ended_or_cannot_be_read_is_left_alone() -> None:
    assert judge_stuck(_running(None), 0, NOW_MS, NAMES) == Leave()  # its seq moved on
    assert judge_stuck(None, 1, NOW_MS, NAMES) == Leave()
    assert judge_stuck(UnreadableRun("x"), 1, NOW_MS, NAMES) == Leave()
    done = replace(_running(None).state, status=RunStatus.SUCCEEDED)
    ended = LoadedRun("r", WF, done, 3, "t0", stored_checksum=state_checksum(done))
    assert ended.checksum_ok
    assert judge_stuck(ended, 1, NOW_MS, NAMES) == Leave()
