"""`ductor ui` in a real browser, against the real services: headless Chromium (Debian's
chromium and chromedriver, `make tools`: tests/integration/fix_browser.py) driven by selenium
loads each page of a `ductor ui` subprocess: the runs with their filters and pages, a run's DAG,
timeline (the flaky step's two failed attempts red, then its third green) and attempts, the
workflows with their runs by status and a version's definition, the live workers, the dead
letters and the schedules (each look at the runs and the letters reads a window of time). It
logs in with the token (a wrong one is refused with 403), clicks retry on the failed run and
waits for its second attempt in the database; a page served without a token shows no button
and refuses every action. The screenshots it takes are the ones docs/operations/web-ui.md and
docs/usage.md show (docs/images/ui-*.png): it writes them there on purpose."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select

from processor import client
from processor.client import RunFilter
from processor.core.routing import TopicNames
from processor.core.run_state import RunStatus
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow

from .browser import Page, post, start_ui
from .children import Spawned, run_ductor
from .instances import WorkerThread
from .runs import step_attempts
from .samples import REPO
from .waiting import wait_for

pytestmark = pytest.mark.integration

IMAGES = REPO / "docs" / "images"
TOKEN = f"ui-test-token-{uuid.uuid4().hex}"
# validate, then charge and notify side by side, then a receipt: charge always fails, once.
CHARGES = {
    "name": "charges",
    "version": 1,
    "steps": [
        {"name": "validate", "type": "fast"},
        {
            "name": "charge",
            "type": "fail",
            "depends_on": ["validate"],
            "retry": {"max_attempts": 1},
        },
        {"name": "notify", "type": "fast", "depends_on": ["validate"]},
        {"name": "receipt", "type": "fast", "depends_on": ["charge", "notify"]},
    ],
}


def test_the_pages_in_a_browser_and_a_retry_behind_the_token(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    spawn: Callable[..., Spawned],
    browser: WebDriver,
) -> None:
    t = uuid.uuid4().hex[:4]
    register_workflow(pg, parse_workflow(CHARGES))
    schedule = f"nightly-sample-{t}"
    created = run_ductor(
        settings, "schedules", "create", schedule, "--cron", "0 3 * * *", "--workflow", "sample"
    )
    assert created.returncode == 0, created.stderr
    orders = [f"order-{t}-{i}" for i in range(1, 4)]
    failed = f"charge-{t}-17"
    client.start_runs(settings, "sample", orders, {"n": 1}, tags={"customer": "ada"})
    client.start_run(settings, "charges", failed, {}, tags={"customer": "bob"})
    triggered = run_ductor(settings, "schedules", "trigger", schedule)
    assert triggered.returncode == 0, triggered.stderr
    fired = triggered.stdout.strip()
    # A start for a workflow nobody registered, and a wakeup that is not JSON: the processor
    # dead-letters both.
    client.request_starts(settings, "no-such-workflow", [f"ghost-{t}"])
    producer = Producer(producer_config(settings, "test-ui"))
    produce(producer, TopicNames(settings.topic_prefix).wakeup("t1"), b"hello?", b"bad-1", 0)
    assert producer.flush(30) == 0

    processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        everything = [*orders, fired]
        wait_for(
            lambda: (
                client.count_runs(settings, RunFilter(statuses=(RunStatus.SUCCEEDED,))) == 4
                and client.get_run(settings, failed).status is RunStatus.FAILED
            ),
            90,
            "the runs to end",
        )
        wait_for(lambda: len(read_dead_letters(settings)) == 2, 60, "the dead letters")
        # One more, started with the processor and the worker up: its timeline is the steps'
        # own times, not the wait for them to start (the picture docs/usage.md shows).
        late = f"order-{t}-9"
        client.start_run(settings, "sample", late, {"n": 1}, tags={"customer": "ada"})
        wait_for(lambda: client.get_run(settings, late).status is RunStatus.SUCCEEDED, 60, "late")
        everything.append(late)

        port = start_ui(spawn, settings, TOKEN, "ui")
        page = Page(browser, port, IMAGES)
        _check_runs(page, [*everything, failed], failed)
        _check_run_and_retry(page, settings, pg, port, failed, late)
        _check_dead_letters(page, t)
        page.open("/schedules")
        assert page.column("#schedules", 1) == [schedule]
        assert page.column("#schedules", 2) == ["0 3 * * *"]
        assert page.column("#schedules", 3) == ["sample"]

        _check_workflows_and_workers(page, worker)

        bare = start_ui(spawn, settings, "", "ui-read-only")
        _check_read_only(Page(browser, bare, IMAGES), bare, failed, browser)
    finally:
        worker.stop()
        pg.execute("DELETE FROM eec_schedule WHERE name = %s", (schedule,))


def _check_runs(page: Page, every: list[str], failed: str) -> None:
    """The list, its filters (as `runs list` reads them) and its pages."""
    page.open("/")
    assert sorted(page.column("#runs", 1)) == sorted(every)
    assert page.text("#count") == f"{len(every)} runs match, newest first"
    # The count reads a window of time (the last day by default), and says so.
    assert page.text("#window").startswith("Created from ")
    assert "the page reads at most 7 days at a time" in page.text("#window")
    assert page.column("#runs", 3).count("failed") == 1
    page.screenshot("ui-runs.png")

    page.driver.find_element(By.CSS_SELECTOR, "input[name=status][value=failed]").click()
    page.driver.find_element(By.CSS_SELECTOR, "input[name=tag]").send_keys("customer=bob")
    page.driver.find_element(By.ID, "apply").click()
    page.until(lambda: "status=failed" in page.driver.current_url, "the filtered list")
    assert page.column("#runs", 1) == [failed]
    assert page.text("#count") == "1 run matches, newest first"
    (reason,) = page.column("#runs", 6)
    assert reason.startswith("step 'charge' failed after 1 attempt(s)")
    assert page.column("#runs", 7) == ["customer=bob"]

    # Pages of two through the cursor: every run once, in the listing's order.
    page.open("/?limit=2")
    seen = page.column("#runs", 1)
    while page.has("#next-page"):
        page.driver.find_element(By.ID, "next-page").click()
        page.until(lambda: "cursor=" in page.driver.current_url, "the next page")
        seen += page.column("#runs", 1)
    assert sorted(seen) == sorted(every) and len(seen) == len(every)

    page.open("/?since=yesterday")
    assert "since 'yesterday': expected an ISO 8601 time" in page.text("#filter-error")


def _check_run_and_retry(
    page: Page,
    settings: Settings,
    pg: psycopg.Connection[Any],
    port: int,
    failed: str,
    succeeded: str,
) -> None:
    """A succeeded run's DAG and output; the failed run's DAG and attempts, the login (a wrong
    token refused), and the retry button, whose run gets its second attempt."""
    page.open(f"/runs/{succeeded}")
    nodes = page.driver.find_elements(By.CSS_SELECTOR, "#dag g.node")
    assert {n.get_attribute("data-step"): n.get_attribute("data-status") for n in nodes} == {
        "fetch": "succeeded",
        "transform": "succeeded",
        "enrich": "succeeded",
        "publish": "succeeded",
    }
    edges = page.driver.find_elements(By.CSS_SELECTOR, "#dag path.edge")
    assert len(edges) == 4
    # The attempts as the timeline reads them, by their start: fetch first, publish last (not
    # by the steps' names, which would put enrich first).
    steps, started = page.column("#attempts", 1), page.column("#attempts", 4)
    assert steps[0] == "fetch" and steps[-1] == "publish", steps
    assert "-" not in started and started == sorted(started), started
    # The flaky step's two failed attempts and its third, each with its worker.
    attempts = list(zip(steps, page.column("#attempts", 9), strict=True))
    assert [a for a in attempts if a[0] == "transform"] == [
        ("transform", "failed"),
        ("transform", "failed"),
        ("transform", "succeeded"),
    ]
    _check_timeline(page)
    page.screenshot("ui-run-timeline.png")

    page.open(f"/runs/{failed}")
    assert page.text("#run-status") == "failed"
    states = {
        n.get_attribute("data-step"): n.get_attribute("data-status")
        for n in page.driver.find_elements(By.CSS_SELECTOR, "#dag g.node")
    }
    assert states["validate"] == "succeeded" and states["charge"] == "failed"
    assert set(states) == {"validate", "charge", "notify", "receipt"}
    assert ("charge", "failed") in zip(
        page.column("#attempts", 1), page.column("#attempts", 9), strict=True
    )
    assert not page.has("#retry")  # not logged in: a link to the login instead
    page.driver.find_element(By.ID, "login-to-act").click()

    page.until(lambda: page.has("#token"), "the login form")
    page.driver.find_element(By.ID, "token").send_keys("not-the-token-at-all")
    page.driver.find_element(By.ID, "login-submit").click()
    page.until(lambda: page.has("#login-error"), "the refusal")
    assert page.text("#login-error") == "Wrong token."
    assert post(port, "/login", {"token": "not-the-token-at-all"}, {}) == 403
    page.driver.find_element(By.ID, "token").send_keys(TOKEN)
    page.driver.find_element(By.ID, "login-submit").click()
    page.until(lambda: page.has("#retry"), "the run page with its retry button")
    assert page.driver.current_url.endswith(f"/runs/{failed}")
    page.screenshot("ui-run.png")

    session = page.driver.get_cookie("ductor_ui_session")
    assert session is not None and session["httpOnly"] and session["sameSite"] == "Strict"
    cookie = {"Cookie": f"ductor_ui_session={session['value']}"}
    # The session is refused from another site's form, and no session is no action.
    elsewhere = cookie | {"Origin": "http://evil.example"}
    forged = {"Cookie": "ductor_ui_session=v1.1.x"}
    for headers in (elsewhere, {}, forged):
        assert post(port, "/actions/retry", {"run_id": failed}, headers) == 403, headers
    assert [a for a, _ in step_attempts(pg, failed)["charge"]] == [1]

    page.driver.find_element(By.ID, "retry").click()
    page.until(lambda: page.has("#done"), "the retry's answer")
    assert page.text("#done") == "Retried: the failed steps run again."
    wait_for(
        lambda: [a for a, _ in step_attempts(pg, failed).get("charge", [])] == [1, 2],
        60,
        "the retried step's second attempt",
    )
    wait_for(
        lambda: client.get_run(settings, failed).status is RunStatus.FAILED,
        60,
        "the retried run to fail again",
    )


def _check_timeline(page: Page) -> None:
    """The sample run's timeline: a lane per step, the flaky step's two failed attempts red
    and its third green, left to right, with the two waits between them."""
    lanes = [
        g.get_attribute("data-step")
        for g in page.driver.find_elements(By.CSS_SELECTOR, "#timeline g.lane")
    ]
    assert lanes == ["fetch", "transform", "enrich", "publish"]
    bars = page.driver.find_elements(
        By.CSS_SELECTOR, '#timeline rect.attempt[data-step="transform"]'
    )
    assert [(b.get_attribute("data-attempt"), b.get_attribute("data-state")) for b in bars] == [
        ("1", "failed"),
        ("2", "failed"),
        ("3", "succeeded"),
    ]
    xs = [float(b.get_attribute("x") or "nan") for b in bars]
    assert xs == sorted(xs) and len(set(xs)) == 3
    red, green = "rgb(200, 50, 45)", "rgb(31, 138, 76)"
    fills = [str(page.script("return getComputedStyle(arguments[0]).fill", b)) for b in bars]
    assert fills == [red, red, green]
    gaps = page.driver.find_elements(
        By.CSS_SELECTOR, '#timeline line.gap.retry[data-step="transform"]'
    )
    assert len(gaps) == 2
    # The publish step starts after both of its dependencies ended.
    (publish,) = page.driver.find_elements(By.CSS_SELECTOR, '#timeline rect[data-step="publish"]')
    assert float(publish.get_attribute("x") or "0") >= xs[2]


def _check_workflows_and_workers(page: Page, worker: WorkerThread) -> None:
    """The registered versions with their runs by status (each count a link to those runs),
    a version's definition, and the live worker with its queue, step types and slots."""
    page.open("/workflows")
    rows = {
        r.get_attribute("data-workflow"): r
        for r in page.driver.find_elements(By.CSS_SELECTOR, "#workflows tbody tr")
    }
    assert {"sample", "charges"} <= set(rows)
    counts = {
        a.get_attribute("data-status"): a.text
        for a in rows["charges"].find_elements(By.CSS_SELECTOR, "a.status")
    }
    assert counts == {"failed": "1 failed"}
    sample = [a.text for a in rows["sample"].find_elements(By.CSS_SELECTOR, "a.status")]
    assert sample == ["5 succeeded"]
    page.screenshot("ui-workflows.png")
    rows["charges"].find_element(By.CSS_SELECTOR, "a.status").click()
    page.until(lambda: "workflow=charges" in page.driver.current_url, "the runs of one status")
    assert page.column("#runs", 3) == ["failed"]

    page.open("/workflows")
    page.driver.find_element(By.CSS_SELECTOR, 'tr[data-workflow="charges"] a.version').click()
    page.until(lambda: page.has("#definition"), "a version's page")
    assert '"name": "charges"' in page.text("#definition")
    drawn = page.driver.find_elements(By.CSS_SELECTOR, "#dag g.node")
    assert [n.get_attribute("data-step") for n in drawn] == [
        "validate",
        "charge",
        "notify",
        "receipt",
    ]

    page.open("/workers")
    (row,) = page.driver.find_elements(
        By.CSS_SELECTOR, f'#workers tr[data-worker="{worker.worker.instance_id}"]'
    )
    cells = row.find_elements(By.CSS_SELECTOR, "td")
    assert cells[3].text.split()[0] == "default"
    assert {"fast", "flaky", "fail"} <= set(cells[4].text.split())
    assert cells[5].text == "0 of 4"
    page.screenshot("ui-workers.png")


def _check_dead_letters(page: Page, t: str) -> None:
    page.open("/dead-letters")
    assert page.text("#count").startswith("2 dead letters. ")
    assert page.text("#window").startswith("Written from ")
    assert sorted(page.column("#letters", 2)) == ["not_json", "unknown_workflow"]
    page.screenshot("ui-dead-letters.png")
    Select(page.driver.find_element(By.NAME, "reason")).select_by_value("unknown_workflow")
    page.driver.find_element(By.ID, "apply-reason").click()
    page.until(lambda: "reason=" in page.driver.current_url, "the letters of one reason")
    assert page.column("#letters", 2) == ["unknown_workflow"]
    assert f"ghost-{t}" in page.column("#letters", 5)[0]
    page.open("/dead-letters?reason=oversize")
    assert page.text("#count").startswith("0 dead letters with reason oversize")


def _check_read_only(page: Page, port: int, failed: str, browser: WebDriver) -> None:
    """Served without a token: no button, no login, every action refused, even with the
    session another server's token made."""
    page.open(f"/runs/{failed}")
    assert page.text("#run-status") == "failed"
    assert page.has("#read-only")
    assert not page.has("#retry") and not page.has("#cancel") and not page.has("#login-to-act")
    page.open("/login")
    assert page.has("#read-only-note") and not page.has("#token")
    other = browser.get_cookie("ductor_ui_session")  # the cookie is the host's, any port
    assert other is not None
    cookie = {"Cookie": f"ductor_ui_session={other['value']}"}
    assert post(port, "/actions/retry", {"run_id": failed}, cookie) == 403
    assert post(port, "/actions/cancel", {"run_id": failed}, cookie) == 403
    assert post(port, "/login", {"token": ""}, {}) == 403
