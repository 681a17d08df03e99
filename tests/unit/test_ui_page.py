"""The web page's pure parts added for a page a person keeps open (processor/ui): a run's
timeline (each attempt from its start to its end, the waits between them), the states the
DAG draws (a map whose item failed is failed, a step cancelled before it started never ran),
a dead letter's bytes as its table cell shows them, and the script every page loads. The
pages themselves are driven in a browser by tests/integration/test_ui.py and test_ui_live.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.ui.dag import StepState, step_states
from processor.ui.http import HEADERS
from processor.ui.pages import (
    BYTES_SHOWN,
    HEX_SHOWN,
    environment,
    raw_bytes,
    script,
    stylesheet,
)
from processor.ui.run_view import run_sections
from processor.ui.timeline import LABEL_W, MAX_LANES, MIN_BAR_W, PLOT_W, timeline

T0 = 1_777_000_000.0


def _iso(offset_s: float | None) -> str | None:
    return None if offset_s is None else datetime.fromtimestamp(T0 + offset_s, UTC).isoformat()


def _attempt(
    node: str, attempt: int, started: float | None, ended: float | None, **kw: Any
) -> dict[str, Any]:
    return {
        "node": node,
        "attempt": attempt,
        "started": _iso(started),
        "ended": _iso(ended),
        "worker": kw.get("worker", "w-1"),
        "outcome": kw.get("outcome", None if ended is None else "succeeded"),
        "error": kw.get("error"),
    }


def _run(
    status: str,
    steps: list[dict[str, Any]],
    nodes: list[dict[str, Any]],
    attempts: list[dict[str, Any]],
    end: float = 10.0,
) -> dict[str, Any]:
    return {
        "status": status,
        "created_at": _iso(0),
        "updated_at": _iso(end),
        "steps": steps,
        "nodes": nodes,
        "attempts": attempts,
    }


def _step(name: str, *after: str, kind: str = "task") -> dict[str, Any]:
    return {"name": name, "kind": kind, "type": "t", "after": list(after)}


def _node(name: str, status: str, attempt: int, due: float | None = None) -> dict[str, Any]:
    return {"node": name, "status": status, "attempt": attempt, "due": _iso(due), "error": None}


def test_a_step_retried_twice_has_three_bars_two_red_and_the_waits_between() -> None:
    run = _run(
        "succeeded",
        [_step("fetch"), _step("transform", "fetch")],
        [_node("fetch", "succeeded", 1), _node("transform", "succeeded", 3)],
        [
            _attempt("fetch", 1, 0.0, 1.0),
            _attempt("transform", 1, 1.5, 2.0, outcome="failed", error="boom"),
            _attempt("transform", 2, 3.0, 4.0, outcome="failed", error="boom"),
            _attempt("transform", 3, 6.0, 10.0),
        ],
    )
    shown = timeline(run, now=T0 + 99)
    assert shown is not None
    fetch, transform = shown.lanes
    assert [(b.attempt, b.state) for b in transform.bars] == [
        (1, "failed"),
        (2, "failed"),
        (3, "succeeded"),
    ]
    # The axis: creation (0 s) to the last end (10 s), an ended run's, not ``now``.
    assert fetch.bars[0].x == LABEL_W
    assert transform.bars[2].x + transform.bars[2].width == pytest.approx(LABEL_W + PLOT_W)
    assert transform.bars[1].x == pytest.approx(LABEL_W + 0.3 * PLOT_W)
    # Its time in the queue (from fetch's end), then the waits between the attempts, each
    # from one's end to the next one's start.
    assert [(g.kind, round(g.x1), round(g.x2)) for g in transform.gaps] == [
        ("queued", round(LABEL_W + 0.1 * PLOT_W), round(LABEL_W + 0.15 * PLOT_W)),
        ("retry", round(LABEL_W + 0.2 * PLOT_W), round(LABEL_W + 0.3 * PLOT_W)),
        ("retry", round(LABEL_W + 0.4 * PLOT_W), round(LABEL_W + 0.6 * PLOT_W)),
    ]
    assert transform.gaps[2].title == "2.0 s before attempt 3"
    assert transform.bars[0].title == "transform attempt 1 on w-1: failed, 500 ms (boom)"
    assert shown.ticks[0].label == "+0 ms" and shown.ticks[-1].label == "+10.0 s"


def test_a_live_run_draws_to_now_its_attempt_in_flight_and_its_retry_to_its_due_time() -> None:
    run = _run(
        "running",
        [_step("a"), _step("b"), _step("c", "a")],
        [
            _node("a", "dispatched", 2),
            _node("b", "retry_wait", 1, due=30.0),
            _node("c", "pending", 0),
        ],
        [
            _attempt("a", 1, 0.0, None),  # superseded without a result: timed out
            _attempt("a", 2, 8.0, None),
            _attempt("b", 1, 0.0, 4.0, outcome="failed"),
        ],
    )
    shown = timeline(run, now=T0 + 20)
    assert shown is not None
    a, b, c = shown.lanes
    assert [(bar.state, round(bar.x + bar.width)) for bar in a.bars] == [
        ("lost", round(LABEL_W + 8 / 30 * PLOT_W)),
        ("running", round(LABEL_W + 20 / 30 * PLOT_W)),
    ]
    assert [(g.kind, round(g.x2)) for g in b.gaps] == [("retry_wait", LABEL_W + PLOT_W)]
    assert c.bars == () and c.gaps == ()


def test_a_wait_step_is_drawn_from_its_dependencies_end_and_a_task_waits_in_the_queue() -> None:
    run = _run(
        "running",
        [
            _step("a"),
            _step("approve", "a", kind="wait"),
            _step("b", "a"),
            _step("w", "b", kind="wait"),
        ],
        [
            _node("a", "succeeded", 1),
            _node("approve", "succeeded", 1),
            _node("b", "dispatched", 1),
            _node("w", "pending", 0),
        ],
        [
            _attempt("a", 1, 0.0, 2.0),
            {**_attempt("approve", 1, None, 5.0), "worker": None},
        ],
    )
    shown = timeline(run, now=T0 + 10)
    assert shown is not None
    lanes = {lane.node: lane for lane in shown.lanes}
    (approve,) = lanes["approve"].bars
    assert approve.state == "waited"
    assert approve.x == pytest.approx(LABEL_W + 0.2 * PLOT_W)
    assert approve.width == pytest.approx(0.3 * PLOT_W)
    assert [(g.kind, round(g.x1)) for g in lanes["b"].gaps] == [("queued", LABEL_W + 0.2 * PLOT_W)]


def test_a_map_lane_is_failed_when_an_item_failed_and_its_items_have_lanes_up_to_a_bound() -> None:
    items = [_node(f"m[{i}]", "succeeded", 1) for i in range(MAX_LANES + 5)]
    items[3] = _node("m[3]", "failed", 2)
    run = _run(
        "failed",
        [_step("m", kind="map")],
        [_node("m", "cancelled", 1), *items],
        [_attempt(f"m[{i}]", 1, 1.0, 2.0) for i in range(MAX_LANES + 5)],
    )
    shown = timeline(run, now=T0 + 50)
    assert shown is not None
    assert len(shown.lanes) == MAX_LANES and shown.more_lanes == 6
    assert [b.state for b in shown.lanes[0].bars] == ["failed"]


@given(
    st.lists(
        st.tuples(st.floats(0, 1000), st.floats(0, 1000), st.sampled_from(["succeeded", "failed"])),
        min_size=1,
        max_size=8,
    )
)
def test_every_bar_is_on_the_axis_and_seen(spans: list[tuple[float, float, str]]) -> None:
    attempts = [
        _attempt("s", i + 1, min(a, b), max(a, b), outcome=o) for i, (a, b, o) in enumerate(spans)
    ]
    run = _run("failed", [_step("s")], [_node("s", "failed", len(spans))], attempts, end=0.0)
    shown = timeline(run, now=T0)
    assert shown is not None
    for bar in shown.lanes[0].bars:
        assert LABEL_W <= bar.x <= LABEL_W + PLOT_W
        assert bar.width >= MIN_BAR_W


def test_no_timeline_for_a_run_that_cannot_be_loaded() -> None:
    assert timeline({"status": "failed", "load_error": "bad row", "attempts": []}, T0) is None


def _state(
    status: str, attempt: int, items: tuple[tuple[str, int], ...] = (), kind: str = "task"
) -> StepState:
    return StepState("s", kind, "t", (), status, attempt, items=items)


@pytest.mark.parametrize(
    ("state", "shown", "label"),
    [
        (
            _state("cancelled", 1, (("cancelled", 2), ("failed", 1), ("succeeded", 3)), "map"),
            "failed",
            "failed",
        ),
        (
            _state("dispatched", 1, (("dispatched", 2), ("succeeded", 1)), "map"),
            "dispatched",
            "dispatched",
        ),
        (_state("cancelled", 0), "not_run", "not run"),
        (_state("skipped", 0), "skipped", "skipped"),
        (_state("cancelled", 2), "cancelled", "cancelled"),
        (_state("failed", 3), "failed", "failed"),
        (_state("succeeded", 1), "succeeded", "succeeded"),
        (_state("pending", 0), "pending", "pending"),
        (_state("retry_wait", 1), "retry_wait", "retry wait"),
        (_state("limit_wait", 0), "limit_wait", "limit wait"),
        (_state("dispatched", 1, kind="wait"), "dispatched", "waiting for its signal"),
        (_state("dispatched", 1, kind="workflow"), "dispatched", "child run going"),
    ],
)
def test_each_state_the_dag_draws_says_what_happened(
    state: StepState, shown: str, label: str
) -> None:
    assert (state.shown, state.label) == (shown, label)


def test_every_state_drawn_has_a_colour_of_its_own_in_the_stylesheet() -> None:
    css = stylesheet().decode()
    for status in (
        "succeeded",
        "failed",
        "dispatched",
        "cancelled",
        "retry_wait",
        "limit_wait",
        "not_run",
        "pending",
        "skipped",
    ):
        assert f".dag .node.{status} rect" in css, status
    for state in ("succeeded", "failed", "lost", "running", "waited", "waiting"):
        assert f"rect.attempt.{state}" in css, state


def test_a_map_whose_item_failed_is_drawn_failed_from_the_run_s_document() -> None:
    document = {
        "steps": [_step("resize", kind="map")],
        "nodes": [
            _node("resize", "cancelled", 1),
            _node("resize[0]", "succeeded", 1),
            _node("resize[1]", "failed", 3),
            _node("resize[2]", "cancelled", 1),
        ],
    }
    (resize,) = step_states(document)
    assert resize.status == "cancelled" and resize.shown == "failed"


def test_a_dead_letter_s_bytes_are_text_when_utf8_and_hex_when_not() -> None:
    assert raw_bytes(None) == "(null)"
    assert raw_bytes(b'{"run_id": "r"}') == '{"run_id": "r"}'
    assert raw_bytes(b"a\nb\x00") == "a\\nb\\x00"
    assert raw_bytes("é".encode() * 100) == "é" * BYTES_SHOWN + " … (200 bytes)"
    binary = bytes(range(128, 256))
    assert raw_bytes(binary) == (
        "hex " + " ".join(f"{b:02x}" for b in binary[:HEX_SHOWN]) + " … (128 bytes) (not UTF-8)"
    )
    assert raw_bytes(b"\xff") == "hex ff (not UTF-8)"


@given(st.binary(max_size=2000))
def test_a_cell_is_bounded_whatever_the_bytes(raw: bytes) -> None:
    assert len(raw_bytes(raw)) <= 4 * BYTES_SHOWN + 40


def test_the_pages_load_only_their_own_script_and_read_only_their_own_site() -> None:
    policy = HEADERS["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    code = script().decode()
    assert "data-live" in code and "eval(" not in code and "innerHTML =" not in code
    html = (
        environment()
        .get_template("problem.html")
        .render(
            message="x",
            refresh_ms=0,
            token_configured=False,
            read_token_required=False,
            logged_in=False,
            here="/",
        )
    )
    assert '<script src="/static/ui.js" defer></script>' in html
    assert '<body data-refresh-ms="0">' in html and 'id="live"' not in html


def test_a_step_after_a_map_waits_from_the_map_s_last_item() -> None:
    run = _run(
        "running",
        [_step("m", kind="map"), _step("after", "m")],
        [
            _node("m", "succeeded", 1),
            _node("m[0]", "succeeded", 1),
            _node("m[1]", "succeeded", 1),
            _node("after", "dispatched", 1),
        ],
        [_attempt("m[0]", 1, 0.0, 2.0), _attempt("m[1]", 1, 1.0, 4.0)],
    )
    shown = timeline(run, now=T0 + 10)
    assert shown is not None
    lanes = {lane.node: lane for lane in shown.lanes}
    (bar,) = lanes["m"].bars
    assert (bar.state, bar.x, bar.x + bar.width) == ("succeeded", LABEL_W, LABEL_W + 0.4 * PLOT_W)
    assert [(g.kind, g.x1) for g in lanes["after"].gaps] == [("queued", LABEL_W + 0.4 * PLOT_W)]


def test_a_run_whose_saga_ran_shows_its_compensation_and_draws_its_undo_steps() -> None:
    steps = [_step("flight"), _step("hotel", "flight"), _step("car", "hotel")]
    nodes = [
        _node("flight", "succeeded", 1),
        _node("hotel", "succeeded", 1),
        _node("car", "failed", 1),
        _node("undo(hotel)", "failed", 2),
        _node("undo(flight)", "cancelled", 0),
    ]
    attempts = [
        _attempt("flight", 1, 0, 1),
        _attempt("hotel", 1, 1, 2),
        _attempt("car", 1, 2, 3, outcome="failed", error="no cars"),
        _attempt("undo(hotel)", 1, 3, 4, outcome="failed", error="closed"),
        _attempt("undo(hotel)", 2, 5, 6, outcome="failed", error="closed"),
    ]
    document = _run("failed", steps, nodes, attempts) | {
        "run_id": "trip-9",
        "workflow": "trip",
        "version": 1,
        "failure_reason": "step 'car' failed after 1 attempt(s): no cars",
        "compensation": {"outcome": "failed", "step": "hotel", "error": "closed"},
        "tier": "t1",
        "tags": {},
        "next_wakeup_at": None,
        "start_at": None,
        "quarantine_reason": None,
        "checksum_ok": True,
        "seq": 9,
        "input": None,
        "output": None,
        "signals": [],
        "signal_count": 0,
    }
    full = dict.fromkeys(
        ("dispatched", "duration_s", "output", "error_type", "error_message", "traceback"),
    ) | {"executions": 1, "heartbeat": None, "running": None, "execution_ended": None}
    document["attempts"] = [full | {"holds_slots": []} | a for a in attempts]
    document["nodes"] = [{"output": None, "skipped": None, "child_run": None} | n for n in nodes]
    drawn = timeline(document, T0 + 10)
    assert drawn is not None
    lanes = [lane.node for lane in drawn.lanes]
    assert "undo(hotel)" in lanes
    assert [s.name for s in step_states(document)] == ["flight", "hotel", "car"]
    html = (
        environment()
        .get_template("run.html")
        .render(
            refresh_ms=0,
            token_configured=False,
            read_token_required=False,
            logged_in=False,
            here="/runs/trip-9",
            run=document,
            dag=None,
            timeline=drawn,
            can_retry=False,
            can_cancel=False,
            done=None,
            **run_sections(document),
        )
    )
    assert '<dd id="compensation">failed (undoing hotel: closed)</dd>' in html
