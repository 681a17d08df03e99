"""The run page's sections of what a run was given and gave (processor/ui/run_view.py, the
run.html template): its input, its steps' outputs, its failures with their tracebacks and its
signals, every value escaped (a step's output or exception message holding markup is text),
a cut value marked as cut, and a run of many items shown by its first ones."""

from __future__ import annotations

from typing import Any

from processor.core.shown import shown
from processor.ui.pages import environment
from processor.ui.run_view import FAILURES_SHOWN, OUTPUTS_SHOWN, run_sections

HOSTILE = "<script>alert('owned')</script>"


def _attempt(node: str, attempt: int, **result: Any) -> dict[str, Any]:
    return {
        "node": node,
        "attempt": attempt,
        "dispatched": None,
        "started": "2026-05-01T12:00:00+00:00",
        "ended": "2026-05-01T12:00:01+00:00",
        "worker": "w-1",
        "executions": 1,
        "duration_s": 1.0,
        "outcome": "failed" if result.get("error") else "succeeded",
        "output": None,
        "error": None,
        "error_type": None,
        "error_message": None,
        "traceback": None,
        "heartbeat": None,
        "running": False,
        "execution_ended": None,
        "holds_slots": [],
    } | result


def _run(**fields: Any) -> dict[str, Any]:
    return {
        "run_id": "r-1",
        "workflow": "charges",
        "version": 1,
        "status": "failed",
        "failure_reason": None,
        "tier": "t1",
        "tags": {},
        "created_at": "2026-05-01T12:00:00+00:00",
        "updated_at": "2026-05-01T12:00:00+00:00",
        "start_at": None,
        "next_wakeup_at": None,
        "quarantine_reason": None,
        "output": None,
        "input": shown('{"order": 7}', 12).document(),
        "nodes": [],
        "attempts": [],
        "signals": [],
        "signal_count": 0,
    } | fields


def _page(run: dict[str, Any]) -> str:
    return (
        environment()
        .get_template("run.html")
        .render(
            run=run,
            dag=None,
            timeline=None,
            refresh_ms=0,
            done=None,
            token_configured=False,
            read_token_required=False,
            logged_in=False,
            here="/runs/r-1",
            can_retry=False,
            can_cancel=False,
            **run_sections(run),
        )
    )


def test_markup_a_step_returned_or_raised_is_shown_as_text() -> None:
    output = shown(f'{{"html": "{HOSTILE}"}}', 50).document()
    failed = _attempt(
        "charge",
        1,
        error=f"ValueError: {HOSTILE}",
        error_type="ValueError",
        error_message=HOSTILE,
        traceback=f'Traceback (most recent call last):\n  File "s.py"\nValueError: {HOSTILE}',
    )
    run = _run(
        input=shown(f'"{HOSTILE}"', 40).document(),
        nodes=[{"node": "fetch", "attempt": 1, "output": output}],
        attempts=[_attempt("fetch", 1, output=output), failed],
        signals=[
            {
                "signal_id": HOSTILE,
                "name": "approved",
                "received_at": "2026-05-01T12:00:02+00:00",
                "payload": shown(f'"{HOSTILE}"', 40).document(),
            }
        ],
        signal_count=1,
    )
    html = _page(run)
    # The one script is the page's own refresher (static/ui.js); none came from the run.
    assert html.count("<script") == 1 and '<script src="/static/ui.js" defer>' in html
    escaped = "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;"
    assert html.count(escaped) >= 6  # input, output, message, traceback, signal id, payload
    assert '<code class="error-type">ValueError</code>' in html


def test_a_cut_value_is_marked_and_a_failure_without_traceback_says_so() -> None:
    big = shown('"' + "x" * 9000 + '"', 9002)
    run = _run(
        input=big.document(),
        attempts=[_attempt("load", 1, error="abandoned: its deadline passed")],
    )
    html = _page(run)
    assert "Cut: the first 4000 of its 9002 characters of JSON." in html
    assert 'class="muted no-traceback">No traceback' in html


def test_a_run_of_many_items_shows_the_first_outputs_and_failures_and_says_how_many() -> None:
    value = shown("1", 1).document()
    n = max(OUTPUTS_SHOWN, FAILURES_SHOWN) + 5
    run = _run(
        nodes=[{"node": f"m[{i}]", "attempt": 1, "output": value} for i in range(n)],
        attempts=[
            _attempt(f"m[{i}]", 1, error="KeyError: 'k'", error_type="KeyError") for i in range(n)
        ],
    )
    sections = run_sections(run)
    assert len(sections["outputs"]) == OUTPUTS_SHOWN and sections["outputs_total"] == n
    assert len(sections["failures"]) == FAILURES_SHOWN and sections["failures_total"] == n
    html = _page(run)
    assert f"The first {OUTPUTS_SHOWN} of {n} outputs" in html
    assert f"The first {FAILURES_SHOWN} of {n} failed attempts" in html
