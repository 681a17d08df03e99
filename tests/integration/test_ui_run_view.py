"""A run a person can read, against the real services: a step that raises KeyError keeps its
type, message and traceback, whose first frame is the user's step function, and `ductor
inspect` (text and `-o json`), the client and the run's page in headless Chromium show it,
with the run's input (cut, marked so), each step's output, the attempts' start, end, worker
and duration and the signals the run received. A step whose process died says there is no
traceback and why; markup a step returned or raised is text on the page, never markup.

The worker runs the tests' own steps module with ``--isolation process``: the failure crosses
the pipe from the step's child process as it does in production."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import orjson
import psycopg
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from processor import client
from processor.core.run_state import RunStatus
from processor.core.shown import SHOWN_CHARS
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from .browser import Page, start_ui
from .children import Spawned, run_ductor
from .failing_steps import HOSTILE
from .samples import REPO
from .waiting import wait_for

pytestmark = pytest.mark.integration

STEPS_FILE = "tests/integration/failing_steps.py"
# The page's screenshot is one of docs/usage.md's pictures, taken here as test_ui takes its own.
IMAGES = REPO / "docs" / "images"


def _workflows(t: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """An order that waits for an approval, then charges (and fails: KeyError); and one
    whose two steps fail otherwise (a message of markup, a process killed)."""
    once = {"max_attempts": 1}
    order = {
        "name": f"rv-order-{t}",
        "version": 1,
        "steps": [
            {"name": "fetch", "type": "echo"},
            {"name": "approval", "kind": "wait", "signal": "approved", "depends_on": ["fetch"]},
            {"name": "charge", "type": "charge", "depends_on": ["approval"], "retry": once},
        ],
    }
    broken = {
        "name": f"rv-broken-{t}",
        "version": 1,
        "steps": [
            {"name": "hostile", "type": "hostile", "retry": once},
            {"name": "crash", "type": "crash", "retry": once},
        ],
    }
    return order, broken


def _frames(trace: str) -> list[str]:
    return [line.strip() for line in trace.split("\n") if line.strip().startswith("File ")]


def test_a_failed_step_is_shown_with_its_traceback_input_outputs_and_signals(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    spawn: Callable[..., Spawned],
    browser: WebDriver,
) -> None:
    t = uuid.uuid4().hex[:6]
    order, broken = _workflows(t)
    for definition in (order, broken):
        register_workflow(pg, parse_workflow(definition))
    order_wf, broken_wf = order["name"], broken["name"]
    run_id, broken_id = f"rv-order-{t}", f"rv-broken-{t}"
    blob = "x" * (2 * SHOWN_CHARS)
    client.start_run(settings, order_wf, run_id, {"order": 7, "blob": blob})
    client.start_run(settings, broken_wf, broken_id, {})
    # Sent before the wait is reached: it still counts (docs/usage.md#signals-and-wait-steps).
    client.send_signal(settings, run_id, "approved", "approval-1", {"by_hand": HOSTILE})

    processor_thread(settings)
    app = "tests.integration.failing_steps:registry"
    spawn(["worker", "--app", app, "--isolation", "process"], settings, "worker")
    wait_for(
        lambda: all(
            client.get_run(settings, r).status is RunStatus.FAILED for r in (run_id, broken_id)
        ),
        90,
        "both runs to fail",
    )

    # -- inspect -o json, and the client: the same document ------------------------------------
    answer = run_ductor(settings, "-o", "json", "inspect", run_id)
    assert answer.returncode == 0, answer.stderr
    document = orjson.loads(answer.stdout)
    assert document["status"] == "failed"
    assert document["input"]["truncated"] is True
    assert document["input"]["chars"] == len(f'{{"blob": "{blob}", "order": 7}}')  # as jsonb
    assert document["input"]["preview"].startswith('{"blob": "xxx')
    nodes = {n["node"]: n for n in document["nodes"]}
    assert nodes["fetch"]["output"]["value"] == {"order": 7, "note": HOSTILE}
    assert nodes["approval"]["output"]["value"] == {"by_hand": HOSTILE}
    assert nodes["charge"]["output"] is None
    (charge,) = [a for a in document["attempts"] if a["node"] == "charge"]
    assert charge["outcome"] == "failed" and charge["error"] == "KeyError: 'by'"
    assert charge["error_type"] == "KeyError" and charge["error_message"] == "'by'"
    trace = charge["traceback"]
    assert trace.startswith("Traceback (most recent call last):")
    frames = _frames(trace)
    assert frames[0].endswith("in charge") and STEPS_FILE in frames[0]  # the user's first
    assert frames[-1].endswith("in payer")
    assert "processor/worker" not in trace
    assert trace.split("\n")[-1] == "KeyError: 'by'"
    assert charge["started"] and charge["ended"] and charge["worker"]
    assert charge["duration_s"] is not None and charge["duration_s"] >= 0
    (signal,) = document["signals"]
    assert (signal["name"], signal["signal_id"]) == ("approved", "approval-1")
    assert signal["payload"]["value"] == {"by_hand": HOSTILE} and signal["received_at"]
    assert document["signal_count"] == 1
    assert client.inspect_run(settings, run_id) == document

    broken_doc = client.inspect_run(settings, broken_id)
    attempts = {a["node"]: a for a in broken_doc["attempts"]}
    assert attempts["hostile"]["error_type"] == "ValueError"
    assert attempts["hostile"]["error_message"] == HOSTILE
    assert attempts["crash"]["error_type"] is None
    assert attempts["crash"]["error"].startswith("the step's process died (killed by signal")
    assert attempts["crash"]["traceback"].startswith(
        "No traceback: the step's process died (killed by signal SIGKILL)."
    )

    # -- inspect, as text ----------------------------------------------------------------------
    text = run_ductor(settings, "inspect", run_id)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.split("\n")
    (shown_input,) = [line for line in lines if line.startswith("input ")]
    assert shown_input.endswith(f"... (cut: {document['input']['chars']} characters)")
    assert any(line.strip().startswith('output {"note":') for line in lines)
    at = lines.index("attempts:")
    (charge_line,) = [line for line in lines[at:] if line.startswith("  charge #1  failed")]
    assert f"worker {charge['worker']}" in charge_line and " took " in charge_line
    below = lines[lines.index(charge_line) + 1 :]
    assert below[0] == "    error: KeyError: 'by'"
    assert below[1] == "    Traceback (most recent call last):"
    assert below[2].strip().startswith(f'File "{frames[0].split(chr(34))[1]}"')
    assert below[2].endswith("in charge")
    assert "signals (1):" in lines
    (signal_line,) = [line for line in lines if "approval-1" in line]
    assert "approved" in signal_line and "by_hand" in signal_line

    # -- the page --------------------------------------------------------------------------------
    port = start_ui(spawn, settings, "", "ui")
    page = Page(browser, port, IMAGES)
    page.open(f"/runs/{run_id}")
    failure = browser.find_element(By.CSS_SELECTOR, "#failures .failure[data-step=charge]")
    assert failure.find_element(By.CSS_SELECTOR, ".error-type").text == "KeyError"
    assert failure.find_element(By.CSS_SELECTOR, ".error-message").text == "'by'"
    shown_trace = failure.find_element(By.CSS_SELECTOR, ".traceback").text
    assert _frames(shown_trace)[0].endswith("in charge")
    assert shown_trace.split("\n")[-1] == "KeyError: 'by'"
    assert page.text("#input").startswith('{"blob": "xxx')
    assert "Cut: the first 4000 of its" in page.text(".cut")
    assert '"order": 7' in page.text("#outputs tr[data-step=fetch] pre")
    assert page.column("#signals", 2) == ["approved"]
    assert HOSTILE in page.text("#outputs tr[data-step=fetch] pre")  # as text
    assert HOSTILE in page.text("#signals tbody")
    assert not page.has("main script") and browser.title != "owned"
    page.screenshot("ui-run-failure.png")

    page.open(f"/runs/{broken_id}")
    hostile = browser.find_element(By.CSS_SELECTOR, "#failures .failure[data-step=hostile]")
    assert hostile.find_element(By.CSS_SELECTOR, ".error-message").text == HOSTILE
    assert HOSTILE in hostile.find_element(By.CSS_SELECTOR, ".traceback").text
    crashed = browser.find_element(By.CSS_SELECTOR, "#failures .failure[data-step=crash]")
    assert crashed.find_element(By.CSS_SELECTOR, ".traceback").text.startswith("No traceback:")
    assert not page.has("main script") and browser.title != "owned"
