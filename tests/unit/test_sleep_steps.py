"""Sleep steps and waits that continue on their timeout, in the pure tick and the definitions.

A sleep step is its node's due time: no task is sent for it, it ends at its time (a duration
from its start, or the time its ``until`` selector found in the run), never before, whatever
wakes the run, and its end is applied once. Hypothesis: for any sequence of clocks and
duplicate wakeups, a sleep completes exactly once and never before its due time, ticks are
deterministic, and a terminal run absorbs everything. A wait step with ``on_timeout:
continue`` succeeds with its default when its last attempt times out.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import Workflow
from processor.core.model import StepOutcome, StepResult
from processor.core.run_state import NodeStatus, RunState, RunStatus, initial_state
from processor.core.selectors import BadSelector, parse_selector
from processor.core.sleeps import Selected, instant_ms
from processor.core.tick import tick
from processor.core.tick_decision import NOOP, Decision
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import MAX_BACKOFF_MS, ValidationError, WorkflowDef
from processor.io.shipped.workflow_schema import workflow_validator

SCHEMA = workflow_validator()

NAP: dict[str, Any] = {
    "name": "nap",
    "version": 1,
    "steps": [
        {"name": "first", "type": "first"},
        {"name": "pause", "kind": "sleep", "duration_ms": 5_000, "depends_on": ["first"]},
        {"name": "after", "type": "after", "depends_on": ["pause"]},
    ],
    "output": "pause",
}
WF = parse_workflow(NAP)

REMIND: dict[str, Any] = {
    "name": "remind",
    "version": 1,
    "steps": [
        {"name": "plan", "type": "plan"},
        {
            "name": "wait",
            "kind": "sleep",
            "until": "$.steps.plan.output.at",
            "depends_on": ["plan"],
        },
        {"name": "send", "type": "send", "depends_on": ["wait"]},
    ],
}
UNTIL = parse_workflow(REMIND)

OK = StepOutcome.SUCCEEDED
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _after_first(wf: WorkflowDef, now: int, **selected: Selected) -> Decision:
    """The run's first step done at ``now``: what the tick does with the sleep."""
    started = tick(initial_state(wf), wf, (), (), now - 1).new_state
    assert started is not None
    return tick(
        started,
        wf,
        [StepResult(wf.steps[0].name, 1, OK)],
        (),
        now,
        selected={_until(wf, step): found for step, found in selected.items()},
    )


def _until(wf: WorkflowDef, step: str) -> str:
    """What the load's findings for sleep step ``step`` are keyed by: its selector's text."""
    until = wf.step_map[step].until
    assert until is not None
    return until.text


def test_a_sleep_starts_without_a_task_and_is_due_at_its_time() -> None:
    decision = _after_first(WF, 1_000)
    assert decision.new_state is not None
    pause = decision.new_state.node("pause")
    assert pause.status is NodeStatus.DISPATCHED and pause.due_ms == 6_000
    assert decision.dispatches == ()  # no worker is sent anything for it
    assert decision.timers == (6_000,)  # woken at its time
    assert decision.new_state.next_due_ms() == 6_000  # and kept on the row: next_wakeup_at


def test_a_sleep_never_ends_before_its_time_and_then_once_with_its_output() -> None:
    sleeping = _after_first(WF, 1_000).new_state
    assert sleeping is not None
    for early in (1_000, 3_000, 5_999):
        assert tick(sleeping, WF, [StepResult("first", 1, OK)], (), early) == NOOP
    woke = tick(sleeping, WF, (), (), 6_000)
    assert woke.new_state is not None
    assert woke.new_state.node("pause").status is NodeStatus.SUCCEEDED
    assert woke.settled == (("pause", 1, '{"slept_until_ms":6000}'),)
    assert [d.node for d in woke.dispatches] == ["after"]  # what follows starts at once
    assert tick(woke.new_state, WF, (), (), 9_000) == NOOP  # applied once


def test_a_sleep_until_a_time_read_from_an_output() -> None:
    at = Selected(True, "2030-01-01T00:00:00Z")
    decision = _after_first(UNTIL, 1_000, wait=at)
    assert decision.new_state is not None
    assert decision.new_state.node("wait").due_ms == 1_893_456_000_000
    assert decision.timers == ()  # more than a week ahead: the watchdog's sweep wakes it


def test_a_sleep_until_a_time_past_ends_in_the_tick_that_starts_it() -> None:
    decision = _after_first(UNTIL, 10_000, wait=Selected(True, 2_000))
    assert decision.new_state is not None
    assert decision.new_state.node("wait").status is NodeStatus.SUCCEEDED
    assert decision.settled == (("wait", 1, '{"slept_until_ms":2000}'),)
    assert [d.node for d in decision.dispatches] == ["send"]


@pytest.mark.parametrize(
    ("found", "reason"),
    [
        (Selected(True, "tomorrow"), "'tomorrow': not an ISO-8601 time"),
        (Selected(True, "2030-01-01T09:00:00"), "not an ISO-8601 time with a zone"),
        (Selected(True, None), "is null: not a time"),
        (Selected(True, True), "True: not a time"),
        (Selected(True, -5), "must be between 0 and"),
        (Selected(False), "found nothing in the run"),
    ],
)
def test_an_until_that_is_no_time_fails_the_step_and_the_run_with_why(
    found: Selected, reason: str
) -> None:
    decision = _after_first(UNTIL, 1_000, wait=found)
    assert decision.new_state is not None
    assert decision.new_state.status is RunStatus.FAILED
    node = decision.new_state.node("wait")
    assert node.status is NodeStatus.FAILED and node.error is not None
    assert "until $.steps.plan.output.at" in node.error and reason in node.error
    assert decision.dispatches == ()


def test_an_until_not_recorded_yet_waits_for_the_next_tick_with_a_timer_for_now() -> None:
    decision = _after_first(UNTIL, 1_000)  # the load found no output of plan recorded
    assert decision.new_state is not None
    assert decision.new_state.node("wait").status is NodeStatus.PENDING
    assert decision.timers == (1_000,)
    again = tick(
        decision.new_state,
        UNTIL,
        (),
        (),
        1_050,
        selected={"$.steps.plan.output.at": Selected(True, 9)},
    )
    assert again.new_state is not None
    assert again.new_state.node("wait").status is NodeStatus.SUCCEEDED


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("2030-01-01T00:00:00Z", 1_893_456_000_000),
        ("2030-01-01T02:00:00+02:00", 1_893_456_000_000),
        ("2029-12-31T19:30:00.250-04:30", 1_893_456_000_250),
        ("2024-02-29 12:00Z", 1_709_208_000_000),
        (1_893_456_000_000, 1_893_456_000_000),
        (1.5e3, 1_500),
    ],
)
def test_times_are_read_as_iso_8601_with_a_zone_or_epoch_ms(text: Any, ms: int) -> None:
    assert instant_ms(text, "until") == ms


@pytest.mark.parametrize("text", ["2023-02-29T00:00:00Z", "2030-13-01T00:00:00Z", "12:00Z", ""])
def test_what_is_no_time_is_said_so(text: str) -> None:
    assert isinstance(instant_ms(text, "until"), str)


@given(st.integers(0, 253_402_300_799_999))
def test_an_epoch_ms_written_as_iso_8601_reads_back(ms: int) -> None:
    text = (EPOCH + timedelta(milliseconds=ms)).isoformat(timespec="milliseconds")
    assert instant_ms(text, "until") == ms


def test_selectors_are_tiny_and_checked() -> None:
    assert parse_selector("$.input") == ("$.input", None, ())
    assert parse_selector("$.input.a.b") == ("$.input.a.b", None, ("a", "b"))
    assert parse_selector("$.steps.plan.output.at") == ("$.steps.plan.output.at", "plan", ("at",))
    assert parse_selector("$.input.a[0].b") == ("$.input.a.0.b", None, ("a", "0", "b"))
    for bad in ("input.a", "$.input[a]", "$.steps.plan.at", "$.input..a", "$.input[-1]", 5):
        with pytest.raises(BadSelector):
            parse_selector(bad)


@pytest.mark.parametrize(
    ("step", "message"),
    [
        ({"name": "s", "kind": "sleep"}, "either duration_ms or until"),
        ({"name": "s", "kind": "sleep", "duration_ms": 1, "until": "$.input"}, "either"),
        ({"name": "s", "kind": "sleep", "duration_ms": -1}, "must be between 0"),
        ({"name": "s", "kind": "sleep", "until": "$.steps.x.output"}, "one of the steps it"),
        ({"name": "s", "kind": "sleep", "until": "tomorrow"}, "is not a selector"),
        ({"name": "s", "kind": "sleep", "duration_ms": 1, "type": "t"}, "unknown field(s) type"),
        ({"name": "w", "kind": "wait", "signal": "a", "on_timeout": "skip"}, "'fail' or"),
        ({"name": "w", "kind": "wait", "signal": "a", "default": 1}, "only a step with"),
    ],
)
def test_a_wrong_sleep_or_wait_step_is_refused_by_parser_and_schema(
    step: dict[str, Any], message: str
) -> None:
    raw = {"name": "x", "version": 1, "steps": [step]}
    with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_workflow(raw)
    # (the schema ties neither a default to on_timeout nor an until to the dependencies)
    if "default" not in step and step.get("until") != "$.steps.x.output":
        assert list(SCHEMA.iter_errors(raw)) != []


def test_sleep_and_continuing_wait_in_code_are_their_json_form() -> None:
    raw = {
        "name": "flow",
        "version": 1,
        "steps": [
            {"name": "plan", "type": "plan"},
            {
                "name": "ok",
                "kind": "wait",
                "signal": "ok",
                "on_timeout": "continue",
                "default": {"ok": False},
                "timeout_ms": 60_000,
                "depends_on": ["plan"],
            },
            {"name": "pause", "kind": "sleep", "duration_ms": 1_500, "depends_on": ["ok"]},
            {
                "name": "remind",
                "kind": "sleep",
                "until": "$.steps.plan.output.at",
                "depends_on": ["plan", "pause"],
            },
        ],
    }
    wf = parse_workflow(raw)
    assert list(SCHEMA.iter_errors(raw)) == []
    code = Workflow("flow")

    @code.step
    def plan(ctx: Any) -> None: ...

    code.wait(
        "ok", signal="ok", after=[plan], timeout="1m", on_timeout="continue", default={"ok": False}
    )
    code.sleep("pause", duration="1.5s", after=["ok"])
    code.sleep("remind", until="$.steps.plan.output.at", after=[plan, "pause"])
    assert code.definition() == wf
    assert parse_workflow(workflow_to_json(wf)) == wf


# -- waits that continue on their timeout ----------------------------------------------------

GATE = parse_workflow(
    {
        "name": "gate",
        "version": 1,
        "steps": [
            {
                "name": "ok",
                "kind": "wait",
                "signal": "ok",
                "timeout_ms": 1_000,
                "on_timeout": "continue",
                "default": {"approved": False},
            },
            {"name": "go", "type": "go", "depends_on": ["ok"]},
        ],
    }
)


def test_a_wait_that_continues_succeeds_with_its_default_at_its_timeout() -> None:
    waiting = tick(initial_state(GATE), GATE, (), (), 0).new_state
    assert waiting is not None and waiting.node("ok").due_ms == 1_000
    assert tick(waiting, GATE, (), (), 999) == NOOP
    timed_out = tick(waiting, GATE, (), (), 1_000)
    assert timed_out.new_state is not None
    assert timed_out.new_state.status is RunStatus.RUNNING
    assert timed_out.new_state.node("ok").status is NodeStatus.SUCCEEDED
    assert timed_out.settled == (("ok", 1, '{"approved":false}'),)
    assert [d.node for d in timed_out.dispatches] == ["go"]


def test_a_wait_that_continues_without_a_default_gives_null_and_fail_stays_the_default() -> None:
    raw = GATE.steps[0]
    bare = WorkflowDef("g", 1, (replace(raw, default_output=None), GATE.steps[1]))
    waiting = tick(initial_state(bare), bare, (), (), 0).new_state
    assert waiting is not None
    assert tick(waiting, bare, (), (), 1_000).settled == (("ok", 1, "null"),)
    failing = WorkflowDef("g", 1, (replace(raw, on_timeout="fail"), GATE.steps[1]))
    waiting = tick(initial_state(failing), failing, (), (), 0).new_state
    assert waiting is not None
    ended = tick(waiting, failing, (), (), 1_000).new_state
    assert ended is not None and ended.status is RunStatus.FAILED


# -- properties -------------------------------------------------------------------------------


def _run(
    wf: WorkflowDef, clocks: list[int], repeats: list[int], selected: dict[str, Selected]
) -> tuple[RunState, list[tuple[int, Decision]]]:
    """Tick a run through ``clocks`` (each tick repeated ``repeats[i]`` times on the state
    loaded before it, as duplicate wakeups are), answering every task at once."""
    state = initial_state(wf)
    history: list[tuple[int, Decision]] = []
    results: list[StepResult] = []
    for i, now in enumerate(clocks):
        decision = tick(state, wf, results, (), now, selected=selected)
        for _ in range(repeats[i % len(repeats)]):
            assert tick(state, wf, results, (), now, selected=selected) == decision  # determinism
        history.append((now, decision))
        if decision.new_state is not None:
            state = decision.new_state
            results = results + [StepResult(d.node, d.attempt, OK) for d in decision.dispatches]
    return state, history


clocks = st.lists(st.integers(0, 30_000), min_size=1, max_size=25).map(sorted)


@settings(max_examples=300, deadline=None)
@given(
    clocks,
    st.lists(st.integers(0, 2), min_size=1, max_size=5),
    st.one_of(st.integers(0, 40_000), st.text(max_size=5), st.none()),
)
def test_a_sleep_completes_once_and_never_before_its_due_time(
    times: list[int], repeats: list[int], until: Any
) -> None:
    for wf, selected in ((WF, {}), (UNTIL, {"$.steps.plan.output.at": Selected(True, until)})):
        state, history = _run(wf, times, repeats, selected)
        sleep = wf.sleeps[0].name
        started = [
            (now, d.new_state.node(sleep).due_ms)
            for now, d in history
            if d.new_state is not None and d.new_state.node(sleep).attempt == 1
        ]
        ends = [(now, d) for now, d in history for n, _, _ in d.settled if n == sleep]
        assert len(ends) <= 1  # applied once
        for now, decision in ends:
            slept_until = orjson.loads(decision.settled[0][2])["slept_until_ms"]
            assert now >= slept_until  # never before its time
            due = started[0][1]
            assert due is None or due == slept_until
        if ends and state.node(sleep).status is NodeStatus.SUCCEEDED:
            assert state.node(sleep).attempt == 1
        planned = state.node("plan").status is NodeStatus.SUCCEEDED if wf is UNTIL else False
        if isinstance(until, int) and planned:
            # due at the time it read: ends at the first tick at or past it
            assert bool(ends) == any(now >= until for now, _ in history[1:])


@settings(max_examples=200, deadline=None)
@given(clocks, st.lists(st.integers(0, 2), min_size=1, max_size=5))
def test_a_run_that_ended_absorbs_every_later_tick(times: list[int], repeats: list[int]) -> None:
    state, _ = _run(WF, [*times, times[-1] + 10_000, times[-1] + 20_000], repeats, {})
    if state.status.terminal:
        for later in (0, 10**6, 10**13):
            assert tick(state, WF, [StepResult("pause", 1, OK)], (), later) == NOOP


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**12), st.integers(0, 2 * MAX_BACKOFF_MS))
def test_a_sleep_is_woken_by_a_timer_only_within_the_ladder_horizon(now: int, ms: int) -> None:
    wf = parse_workflow(
        {
            "name": "s",
            "version": 1,
            "steps": [
                {"name": "s", "kind": "sleep", "duration_ms": ms},
                {"name": "t", "type": "t", "depends_on": ["s"]},
            ],
        }
    )
    decision = tick(initial_state(wf), wf, (), (), now)
    assert decision.new_state is not None
    if ms == 0:
        assert decision.new_state.node("s").status is NodeStatus.SUCCEEDED
    else:
        assert decision.timers == ((now + ms,) if ms <= MAX_BACKOFF_MS else ())
        assert decision.new_state.next_due_ms() == now + ms
