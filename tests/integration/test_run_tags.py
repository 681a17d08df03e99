"""Tags set by steps (``ctx.tag``), on the real services: steps tag their runs, and `ductor runs
list --tag` (two tags ANDed), the client's ``list_runs(tags=...)``, `ductor inspect` and the web
page find and show exactly the tagged runs; a step's value replaces the one given at start; a
run keeps at most 16 keys set by its steps (the 17th set in one attempt fails that attempt; the
17th brought by another step's result is refused by the database, that step fails finally, and
the run's first 16 stay, even when two steps race for the last place); a failed attempt's tags
are dropped, its retry's recorded; tags cross the pipe of process isolation; retention deletes
them with their run."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import orjson
import psycopg
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver

from processor import client
from processor.core.model import StepOutcome
from processor.core.run_state import RunStatus
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.retention import cutoff, delete_finished
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.step_data import StepResultRow, insert_step_results
from processor.io.postgres.workflows import register_workflow
from processor.worker.options import WorkerOptions

from . import tagging_steps
from .browser import Page, start_ui
from .children import Spawned, run_ductor
from .instances import WorkerThread
from .runs import count_terminal, run_statuses, step_attempts
from .samples import REPO, sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.tagging_steps:registry"
SIXTEEN = {f"k{i:02}": f"v{i}" for i in range(16)}


def _workflow(pg: psycopg.Connection[Any], name: str) -> None:
    """Steps a, then b: each tags its run as the run's input says (tagging_steps.py)."""
    retry = {"max_attempts": 2, "backoff_ms": 50}
    steps = [
        {"name": "a", "type": "tagging", "retry": retry},
        {"name": "b", "type": "tagging", "depends_on": ["a"], "retry": retry},
    ]
    register_workflow(pg, parse_workflow({"name": name, "version": 1, "steps": steps}))


def _sets(**by_node: dict[str, str]) -> dict[str, Any]:
    """A run input whose steps set these tags at every attempt."""
    return {"by_node": {node: {"*": tags} for node, tags in by_node.items()}}


def _found(settings: Settings, **tags: str) -> set[str]:
    return {run.run_id for run in client.list_runs(settings, tags=tags, limit=100)}


def _error(pg: psycopg.Connection[Any], run_id: str, node: str, attempt: int) -> str:
    row = pg.execute(
        "SELECT error FROM eec_step_result WHERE run_id = %s AND node_id = %s AND attempt = %s",
        (run_id, node, attempt),
    ).fetchone()
    assert row is not None and row[0] is not None, (run_id, node, attempt)
    return str(row[0])


def test_steps_tag_their_runs_and_the_runs_are_found_by_them(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    t = uuid.uuid4().hex[:6]
    name = f"tagged-{t}"
    _workflow(pg, name)
    r1, r2, r3, r4, started, over, many, retried = (f"{name}-{i}" for i in range(1, 9))
    client.start_run(settings, name, r1, _sets(a={"customer": "c-42"}, b={"region": "eu"}))
    client.start_run(settings, name, r2, _sets(a={"customer": "c-42"}, b={"region": "us"}))
    client.start_run(settings, name, r3, _sets(a={"customer": "c-7"}, b={"region": "eu"}))
    client.start_run(settings, name, r4, {})
    # Given at start, then set by a step: the step's value replaces the start's.
    client.start_run(
        settings, name, started, _sets(b={"stage": "done"}), tags={"stage": "new", "team": "pay"}
    )
    # Step a sets 16 keys; step b sets one of them again and a 17th.
    client.start_run(settings, name, over, _sets(a=SIXTEEN, b={"k00": "again", "k16": "x"}))
    # Step a sets 17 keys in one attempt.
    client.start_run(settings, name, many, _sets(a={**SIXTEEN, "k16": "x"}))
    # Step a's first attempt tags, then fails; its second tags again, differently.
    client.start_run(
        settings,
        name,
        retried,
        {
            "by_node": {"a": {"1": {"try": "1", "only_first": "x"}, "2": {"try": "2"}}},
            "fail_on": {"a": [1]},
        },
    )
    every = [r1, r2, r3, r4, started, over, many, retried]
    processor_thread(settings)
    worker = WorkerThread(settings, tagging_steps.registry)
    try:
        wait_for(lambda: count_terminal(pg, every) == len(every), 60, "every run to end")
    finally:
        worker.stop()
    statuses = run_statuses(pg, every)
    assert statuses == {
        **dict.fromkeys((r1, r2, r3, r4, started, retried), "succeeded"),
        over: "failed",
        many: "failed",
    }

    # Found by their tags, two of them ANDed: the client, then the command line.
    assert _found(settings, customer="c-42") == {r1, r2}
    assert _found(settings, customer="c-42", region="eu") == {r1}
    assert _found(settings, region="eu") == {r1, r3}
    assert _found(settings, customer="c-1") == set()
    listed = run_ductor(
        settings, "runs", "list", "--tag", "customer=c-42", "--tag", "region=eu", "-o", "json"
    )
    assert listed.returncode == 0, listed.stderr
    (shown,) = map(orjson.loads, listed.stdout.splitlines())
    assert shown["run_id"] == r1 and shown["tags"] == {"customer": "c-42", "region": "eu"}
    counted = run_ductor(settings, "runs", "count", "--tag", "customer=c-42")
    assert counted.returncode == 0 and counted.stdout.split() == ["2"], counted

    # A step's value replaces the one given at start, in what is found and shown.
    assert _found(settings, stage="new") == set()
    assert _found(settings, stage="done", team="pay") == {started}
    assert client.inspect_run(settings, started)["tags"] == {"stage": "done", "team": "pay"}

    # The 17th key brought by step b is refused by the database: b fails, finally, saying so;
    # the run keeps the 16 step a set (b's new value of k00 was refused with it).
    assert step_attempts(pg, over)["b"] == [(1, "failed")]
    assert "keeps at most 16 tags set by its steps" in _error(pg, over, "b", 1)
    assert client.inspect_run(settings, over)["tags"] == SIXTEEN
    # The 17th key in one attempt: ctx.tag raises, the attempt fails; a failure records none.
    assert step_attempts(pg, many)["a"] == [(1, "failed"), (2, "failed")]
    assert _error(pg, many, "a", 1).startswith(
        "ValueError: a run keeps at most 16 tags set by its steps: this attempt set 16 already"
    )
    assert client.inspect_run(settings, many)["tags"] == {}
    # A retried step: the failed attempt's tags are dropped, the success's recorded.
    assert step_attempts(pg, retried)["a"] == [(1, "failed"), (2, "succeeded")]
    assert client.inspect_run(settings, retried)["tags"] == {"try": "2"}
    assert _found(settings, only_first="x") == set()

    # `ductor inspect`, as text and as JSON.
    text = run_ductor(settings, "inspect", r1)
    assert text.returncode == 0, text.stderr
    assert "tags       customer=c-42  region=eu" in text.stdout.split("\n")
    document = orjson.loads(run_ductor(settings, "-o", "json", "inspect", r1).stdout)
    assert document["tags"] == {"customer": "c-42", "region": "eu"}

    # Retention deletes a run's tags with it.
    removed, _ = delete_finished(pg, cutoff(pg, 0), 100)
    assert removed.runs == len(every)
    assert pg.execute("SELECT count(*) FROM eec_run_tag").fetchone() == (0,)


def test_tags_cross_the_pipe_of_process_isolation(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any, spawn: Any
) -> None:
    name = f"tagged-proc-{uuid.uuid4().hex[:6]}"
    _workflow(pg, name)
    run_id = f"{name}-1"
    client.start_run(settings, name, run_id, _sets(a={"customer": "c-42"}, b={"region": "eu"}))
    processor_thread(settings)
    worker: Spawned = spawn(
        ["worker", "--app", APP, "--isolation", "process"], settings, "worker-proc"
    )
    wait_for(lambda: count_terminal(pg, [run_id]) == 1, 90, "the run to end")
    assert run_statuses(pg, [run_id]) == {run_id: "succeeded"}
    assert _found(settings, customer="c-42", region="eu") == {run_id}
    assert worker.terminate() == 0


def _tagged(run_id: str, node: str, tags: dict[str, str]) -> StepResultRow:
    return StepResultRow(run_id, node, 1, StepOutcome.SUCCEEDED, {}, None, tags=tags)


def test_two_steps_racing_for_a_run_s_last_tag_take_turns(
    base_settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    """Two results recorded at once, each bringing a new key to a run that has 15: the first
    transaction holds its run's tags until it commits, the second waits, then counts 17 and
    is refused. Without the lock both would count 16 and the run would keep 17."""
    run_id = f"race-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    insert_step_results(pg, [_tagged(run_id, "a", dict(list(SIXTEEN.items())[:15]))])
    refused: list[BaseException] = []
    with psycopg.connect(base_settings.pg_dsn) as first:  # a transaction, held open
        insert_step_results(first, [_tagged(run_id, "b", {"last": "b"})])

        def second() -> None:
            with psycopg.connect(base_settings.pg_dsn, autocommit=True) as conn:
                try:
                    insert_step_results(conn, [_tagged(run_id, "c", {"other": "c"})])
                except psycopg.errors.CheckViolation as exc:
                    refused.append(exc)

        racer = threading.Thread(target=second)
        racer.start()
        wait_for(
            lambda: (
                pg.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'advisory'"
                    " AND datname = current_database()"
                ).fetchone()
                == (1,)
            ),
            30,
            "the second result to wait for the first's transaction",
        )
        first.commit()
        racer.join(30)
    assert len(refused) == 1 and "keeps at most 16 tags set by its steps" in str(refused[0])
    kept = dict(pg.execute("SELECT key, value FROM eec_run_tag WHERE run_id = %s", (run_id,)))
    assert len(kept) == 16 and kept["last"] == "b" and "other" not in kept
    # Its result went with it (one statement): only step b's is recorded.
    nodes = pg.execute("SELECT node_id FROM eec_step_result WHERE run_id = %s", (run_id,))
    assert sorted(n for (n,) in nodes) == ["a", "b"]


def test_the_page_shows_a_run_s_tags_and_lists_the_runs_with_a_tag(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    spawn: Callable[..., Spawned],
    browser: WebDriver,
) -> None:
    name = f"tagged-ui-{uuid.uuid4().hex[:6]}"
    _workflow(pg, name)
    tagged, other = f"{name}-1", f"{name}-2"
    client.start_run(settings, name, tagged, _sets(a={"customer": "c-42"}, b={"region": "eu"}))
    client.start_run(settings, name, other, _sets(a={"customer": "c-7"}))
    processor_thread(settings)
    worker = WorkerThread(settings, tagging_steps.registry, options=WorkerOptions(concurrency=2))
    try:
        wait_for(lambda: count_terminal(pg, [tagged, other]) == 2, 60, "both runs to end")
    finally:
        worker.stop()
    assert client.get_run(settings, tagged).status is RunStatus.SUCCEEDED
    port = start_ui(spawn, settings, "", "ui")
    page = Page(browser, port, REPO / "docs" / "images")  # (no screenshot taken)
    page.open(f"/runs/{tagged}")
    shown = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "dd.tags .tag")]
    assert shown == ["customer=c-42", "region=eu"]
    page.open("/?tag=customer%3Dc-42&tag=region%3Deu")
    assert page.column("#runs", 1) == [tagged]
    assert page.column("#runs", 7) == ["customer=c-42 region=eu"]
    page.open("/?tag=customer%3Dc-7")
    assert page.column("#runs", 1) == [other]
