"""The page a person keeps open, in headless Chromium against the real services: a run's page
follows the run by itself (read-only, and after a Retry behind the token) without being
reloaded, and so does the runs list (a new run, a status that changed); with script off the
list and a run's page are whole, and the user's reload refreshes them; a map whose item
failed is drawn red, not as a cancelled step; a dead letter whose value is binary or one long
unbroken string keeps the table's width. The screenshots are kept as the test's artefacts: in
``$UI_TEST_SCREENSHOTS/<test>/`` when that is set, else in its tmp folder
(tests/integration/fix_browser.py)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Producer
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from processor import client
from processor.core.routing import TopicNames
from processor.core.run_state import RunStatus
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow
from processor.worker.steps import NonRetryable, StepContext, StepFailed, StepRegistry

from .browser import Page, start_ui
from .children import Spawned
from .instances import WorkerThread
from .waiting import wait_for

pytestmark = pytest.mark.integration

TOKEN = f"ui-live-token-{uuid.uuid4().hex}"
RED = "rgb(200, 50, 45)"
# A step each of whose attempts waits for the test to let it end, then fails: the page is
# open on the run while it runs, and must show the end without being reloaded.
GATED = {
    "name": "gated",
    "version": 1,
    "steps": [
        {"name": "prepare", "type": "quick"},
        {
            "name": "charge",
            "type": "gated",
            "depends_on": ["prepare"],
            "retry": {"max_attempts": 1},
            "timeout_ms": 120_000,
        },
    ],
}


def _claimed(pg: psycopg.Connection[Any], run_id: str, node: str) -> list[int]:
    """The attempts of a step a worker claimed (running, or ended)."""
    rows = pg.execute(
        "SELECT attempt FROM eec_step_attempt WHERE run_id = %s AND node_id = %s ORDER BY 1",
        (run_id, node),
    ).fetchall()
    return [r[0] for r in rows]


def _marked(page: Page) -> bool:
    """Whether the page is the one the test marked (no reload, no navigation since)."""
    return bool(page.script("return window.testMark === 'still here'"))


def test_a_run_s_page_shows_its_end_and_a_retry_s_end_by_itself(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    spawn: Callable[..., Spawned],
    browser: WebDriver,
    shots: Path,
) -> None:
    register_workflow(pg, parse_workflow(GATED))
    gates = {1: threading.Event(), 2: threading.Event()}
    registry = StepRegistry()

    @registry.step("quick")
    def quick(ctx: StepContext) -> dict[str, str]:
        return {"ok": ctx.node}

    @registry.step("gated")
    def gated(ctx: StepContext) -> None:
        gates[ctx.attempt].wait(120)
        raise StepFailed(f"attempt {ctx.attempt} was let fail")

    run_id = f"gated-{uuid.uuid4().hex[:6]}"
    processor_thread(settings)
    worker = WorkerThread(settings, registry)
    try:
        client.start_run(settings, "gated", run_id, {})
        wait_for(
            lambda: _claimed(pg, run_id, "charge") == [1],
            60,
            "the gated step's first attempt",
        )
        # Read-only (no token): the page follows the run through its script alone.
        bare = Page(browser, start_ui(spawn, settings, "", "ui-read-only"), shots)
        bare.open(f"/runs/{run_id}")
        assert bare.text("#run-status") == "running"
        bare.until(lambda: bare.text("#live").startswith("live · updated"), "the live note")
        bare.script("window.testMark = 'still here'")
        bare.screenshot("live-running.png")
        gates[1].set()
        bare.until(lambda: bare.text("#run-status") == "failed", "the page to show the end", 60)
        assert _marked(bare)  # the same page: not reloaded
        assert bare.has('#timeline rect.attempt.failed[data-step="charge"]')
        assert bare.text("#reason").startswith("step 'charge' failed after 1 attempt(s)")
        bare.screenshot("live-failed.png")

        # Behind the token: Retry, then the retried attempt's end, with no reload.
        page = Page(browser, start_ui(spawn, settings, TOKEN, "ui"), shots)
        page.open(f"/login?next=/runs/{run_id}")
        page.driver.find_element(By.ID, "token").send_keys(TOKEN)
        page.driver.find_element(By.ID, "login-submit").click()
        page.until(lambda: page.has("#retry"), "the retry button")
        page.driver.find_element(By.ID, "retry").click()
        page.until(lambda: page.has("#done"), "the retry's answer")
        wait_for(
            lambda: _claimed(pg, run_id, "charge") == [1, 2],
            60,
            "the retried step's second attempt",
        )
        page.until(
            lambda: page.has('#timeline rect.attempt.running[data-attempt="2"]'),
            "the second attempt running on the page",
        )
        assert page.text("#run-status") == "running" and not page.has("#retry")
        page.script("window.testMark = 'still here'")
        gates[2].set()
        page.until(lambda: page.text("#run-status") == "failed", "the retry's end", 60)
        assert _marked(page)
        assert client.get_run(settings, run_id).status is RunStatus.FAILED
        page.until(lambda: page.has("#retry"), "the retry button again")
        bars = page.driver.find_elements(By.CSS_SELECTOR, '#timeline rect[data-step="charge"]')
        assert [b.get_attribute("data-state") for b in bars] == ["failed", "failed"]
        page.screenshot("live-retried.png")
    finally:
        for gate in gates.values():
            gate.set()
        worker.stop()


def test_the_runs_list_shows_a_new_run_and_a_status_change_by_itself(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    spawn: Callable[..., Spawned],
    browser: WebDriver,
    shots: Path,
) -> None:
    """The runs list open (read-only) before anything runs: a run started after it loaded
    appears in it, and its status moves from pending to succeeded, with no reload."""
    register_workflow(pg, parse_workflow(GATED))
    first = f"listed-{uuid.uuid4().hex[:6]}"
    client.start_run(settings, "gated", first, {})  # no processor yet: it stays pending
    page = Page(browser, start_ui(spawn, settings, "", "ui-read-only"), shots)
    page.open("/")
    assert page.column("#runs", 1) == [first] and page.column("#runs", 3) == ["pending"]
    page.until(lambda: page.text("#live").startswith("live · updated"), "the live note")
    page.script("window.testMark = 'still here'")

    later = f"later-{uuid.uuid4().hex[:6]}"
    client.start_run(settings, "gated", later, {})
    page.until(lambda: later in page.column("#runs", 1), "the run started later in the list", 60)
    assert page.text("#count") == "2 runs match, newest first"
    assert _marked(page)
    page.screenshot("list-new-run.png")

    registry = StepRegistry()  # both steps end at once: the runs succeed
    registry.step("quick")(lambda ctx: None)
    registry.step("gated")(lambda ctx: None)
    processor_thread(settings)
    worker = WorkerThread(settings, registry)
    try:
        page.until(
            lambda: page.column("#runs", 3) == ["succeeded", "succeeded"],
            "both runs succeeded in the list",
            90,
        )
        assert _marked(page)  # the same page: not reloaded
        page.screenshot("list-succeeded.png")
    finally:
        worker.stop()


def test_the_pages_are_whole_without_script(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    spawn: Callable[..., Spawned],
    browser: WebDriver,
    shots: Path,
) -> None:
    """With JavaScript off in the browser, the runs list and a run's page are served whole
    (the list, the DAG, the timeline, the attempts: HTML from the server, nothing built by a
    script); nothing refreshes by itself and no live note shows; the user's reload is the
    refresh, and shows what changed."""
    register_workflow(pg, parse_workflow(GATED))
    run_id = f"plain-{uuid.uuid4().hex[:6]}"
    client.start_run(settings, "gated", run_id, {})
    page = Page(browser, start_ui(spawn, settings, "", "ui-read-only"), shots)
    browser.execute_cdp_cmd("Emulation.setScriptExecutionDisabled", {"value": True})

    page.open("/")
    assert page.column("#runs", 1) == [run_id] and page.column("#runs", 3) == ["pending"]
    assert page.text("#count") == "1 run matches, newest first"
    assert not page.driver.find_element(By.ID, "live").is_displayed()  # the script shows it
    page.screenshot("no-script-list.png")
    page.open(f"/runs/{run_id}")
    assert page.text("#run-status") == "pending"
    assert page.has('#dag g.node[data-step="charge"]')

    registry = StepRegistry()
    registry.step("quick")(lambda ctx: {"ok": ctx.node})
    registry.step("gated")(lambda ctx: None)
    processor_thread(settings)
    worker = WorkerThread(settings, registry)
    try:
        wait_for(
            lambda: client.get_run(settings, run_id).status is RunStatus.SUCCEEDED, 60, "the run"
        )
    finally:
        worker.stop()
    assert page.text("#run-status") == "pending"  # no script: as it was served
    page.driver.refresh()  # the user's reload
    assert page.text("#run-status") == "succeeded"
    assert page.column("#attempts", 1) == ["prepare", "charge"]
    assert page.has('#timeline rect.attempt.succeeded[data-step="charge"]')
    assert not page.driver.find_element(By.ID, "live").is_displayed()
    assert page.driver.find_element(By.TAG_NAME, "body").get_attribute("data-refreshed") is None
    page.screenshot("no-script-run.png")
    page.open("/")
    assert page.column("#runs", 3) == ["succeeded"]


def test_a_map_whose_item_failed_is_drawn_red(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    spawn: Callable[..., Spawned],
    browser: WebDriver,
    shots: Path,
) -> None:
    """Item 3 fails for good: the run fails, and its map node, in flight, is cancelled with
    the rest; the page draws the step failed (red), with its failed item counted in red."""
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": "shouts",
                "version": 1,
                "steps": [
                    {"name": "shout", "kind": "map", "type": "shout", "parallelism": 2},
                    {"name": "publish", "type": "shout", "depends_on": ["shout"]},
                ],
            }
        ),
    )
    registry = StepRegistry()

    @registry.step("shout")
    def shout(ctx: StepContext) -> str:
        if ctx.index == 3:
            raise NonRetryable("item 3 cannot be said")
        return str(ctx.item).upper()

    run_id = f"shouts-{uuid.uuid4().hex[:6]}"
    processor_thread(settings)
    worker = WorkerThread(settings, registry)
    try:
        client.start_run(settings, "shouts", run_id, [f"w{i}" for i in range(6)])
        wait_for(lambda: client.get_run(settings, run_id).status is RunStatus.FAILED, 60, "the run")
    finally:
        worker.stop()
    document = client.inspect_run(settings, run_id)
    nodes = {n["node"]: n["status"] for n in document["nodes"]}
    assert nodes["shout"] == "cancelled" and nodes["shout[3]"] == "failed"  # as stored

    page = Page(browser, start_ui(spawn, settings, "", "ui"), shots)
    page.open(f"/runs/{run_id}")
    box = '#dag g.node[data-step="shout"]'
    node = page.driver.find_element(By.CSS_SELECTOR, box)
    assert "failed" in (node.get_attribute("class") or "").split()
    assert node.get_attribute("data-status") == "failed"
    assert page.style(f"{box} rect", "stroke") == RED
    assert page.style(f"{box} tspan.item.failed", "fill") == RED
    # The step after it never started: not run, not "cancelled".
    publish = page.driver.find_element(By.CSS_SELECTOR, '#dag g.node[data-step="publish"]')
    assert publish.get_attribute("data-status") == "not_run"
    row = page.driver.find_element(By.CSS_SELECTOR, '#steps tr[data-step="shout"] .status')
    assert (
        row.text == "failed"
        and page.style('#steps tr[data-step="shout"] .status', "backgroundColor") == RED
    )
    # The timeline: the map's lane failed, its failed item's attempt red.
    assert page.has('#timeline rect.attempt.failed[data-step="shout"]')
    assert page.style('#timeline rect.attempt.failed[data-step="shout[3]"]', "fill") == RED
    page.screenshot("map-failed.png")


def test_a_binary_dead_letter_keeps_the_table_s_width(
    settings: Settings,
    processor_thread: Any,
    spawn: Callable[..., Spawned],
    browser: WebDriver,
    shots: Path,
) -> None:
    """A wakeup that is not JSON is dead-lettered with its bytes: a short text one first, then
    one of bytes that are not UTF-8 and one that is a single 5,000-character word with a key
    as long. Each is shown escaped or in hex, wrapped inside its cell; the table keeps its
    width and the page never scrolls sideways."""
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    producer = Producer(producer_config(settings, "test-ui-live"))
    produce(producer, topic, b"hello?", b"bad-1", 0)
    assert producer.flush(30) == 0
    processor_thread(settings)
    wait_for(lambda: len(read_dead_letters(settings)) == 1, 60, "the first dead letter")

    page = Page(browser, start_ui(spawn, settings, "", "ui"), shots)
    page.open("/dead-letters")
    width = page.script("return document.getElementById('letters').getBoundingClientRect().width")
    viewport = page.script("return document.documentElement.clientWidth")
    page.screenshot("letters-before.png")

    binary = bytes(range(128, 256)) * 8
    word = b"A" * 5000
    produce(producer, topic, binary, b"\xfe\xff" * 40, 1)
    produce(producer, topic, orjson.dumps({"run_id": word.decode()}), word, 2)
    assert producer.flush(30) == 0
    wait_for(lambda: len(read_dead_letters(settings)) == 3, 60, "the two other dead letters")
    page.open("/dead-letters")
    assert page.text("#count").startswith("3 dead letters.")
    values = page.column("#letters", 5)
    hexed = next(v for v in values if v.startswith("hex "))
    assert hexed.startswith("hex 80 81 82 83") and "(1024 bytes) (not UTF-8)" in hexed
    assert any(v.startswith('{"run_id":"AAAA') and "(5013 bytes)" in v for v in values)
    after = page.script("return document.getElementById('letters').getBoundingClientRect().width")
    assert after == width
    assert page.script("return document.documentElement.scrollWidth") <= viewport
    assert page.script(
        "return [...document.querySelectorAll('#letters td')]"
        ".every(td => td.scrollWidth <= td.clientWidth + 1)"
    )
    page.screenshot("letters-binary.png")
