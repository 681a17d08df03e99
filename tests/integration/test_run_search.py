"""Runs you can search, on the real services: tags given at start, every filter of `ductor runs
list` / `runs count` (workflow, status, time window, id prefix, tags, a failed step), cursor
pages that cover a listing once, `--output json`, bulk cancel and retry (with a dry run), and
`inspect --output json`'s timeline of attempts; then the plans Postgres makes for each filter,
read with EXPLAIN, on a table large enough for a scan to show."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest

from processor import client
from processor.client import RunFilter
from processor.core.run_search import Cursor
from processor.core.run_state import RunStatus
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres import run_search
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow

from .children import run_ductor
from .instances import WorkerThread
from .samples import sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

_LATER = datetime.now(UTC) + timedelta(days=1)


def _register_failing(pg: psycopg.Connection[Any]) -> None:
    definition = {
        "name": "failing",
        "version": 1,
        "steps": [{"name": "only", "type": "fail", "retry": {"max_attempts": 1}}],
    }
    register_workflow(pg, parse_workflow(definition))


def _ids(runs: list[client.RunSummary]) -> list[str]:
    return [r.run_id for r in runs]


def _all_pages(settings: Settings, wanted: RunFilter, limit: int) -> list[str]:
    seen: list[str] = []
    after: Cursor | None = None
    while True:
        page = client.search_runs(settings, wanted, limit, after)
        assert len(page.runs) <= limit
        seen += _ids(page.runs)
        if page.next_cursor is None:
            return seen
        after = page.next_cursor


def test_runs_are_found_by_every_filter_and_acted_on_in_bulk(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    _register_failing(pg)
    t = uuid.uuid4().hex[:6]
    c1, c2 = {"customer": "c1", "team": "pay"}, {"customer": "c2"}
    ok1 = [f"ok1-{t}-{i}" for i in range(3)]
    ok2 = [f"ok2-{t}-{i}" for i in range(2)]
    bad = [f"bad-{t}-{i}" for i in range(2)]
    client.start_runs(settings, "sample", ok1, {"n": 1}, tags=c1)
    client.start_runs(settings, "sample", ok2, {"n": 1}, tags=c2)
    client.start_runs(settings, "failing", bad, tags=c1)
    # Live for the whole test: started for tomorrow.
    later = [f"later-{t}-{i}" for i in range(2)]
    client.start_runs(settings, "sample", later, {"n": 1}, tags=c2, start_at=_LATER)
    with pytest.raises(client.ClientError, match="tag name"):
        client.start_run(settings, "sample", f"x-{t}", tags={"bad key": "v"})

    processor_thread(settings)
    worker = WorkerThread(settings)
    ended = [*ok1, *ok2, *bad]
    try:
        wait_for(
            lambda: (
                client.count_runs(
                    settings, RunFilter(id_prefix=f"bad-{t}", statuses=(RunStatus.FAILED,))
                )
                == 2
                and client.count_runs(settings, RunFilter(statuses=(RunStatus.SUCCEEDED,))) == 5
            ),
            60,
            "the runs to end",
        )
        # Spread the creation times: a window then holds some of them.
        pg.execute(
            "UPDATE eec_workflow_run SET created_at = now() - interval '2 hours'"
            " WHERE run_id = ANY(%s)",
            (ok2,),
        )
        hour_ago = int((datetime.now(UTC) - timedelta(hours=1)).timestamp() * 1000)

        def found(**wanted: Any) -> set[str]:
            runs = client.search_runs(settings, RunFilter(**wanted), 100).runs
            assert client.count_runs(settings, RunFilter(**wanted)) == len(runs)
            return set(_ids(runs))

        everything = {*ended, *later}
        assert found() == everything
        assert found(workflow="failing") == set(bad)
        assert found(statuses=(RunStatus.FAILED,)) == set(bad)
        assert found(statuses=(RunStatus.PENDING, RunStatus.FAILED)) == {*bad, *later}
        assert found(tags=(("customer", "c1"),)) == {*ok1, *bad}
        assert found(tags=(("customer", "c1"), ("team", "pay"))) == {*ok1, *bad}
        assert found(tags=(("customer", "c2"),)) == {*ok2, *later}
        assert found(tags=(("customer", "c3"),)) == set()
        assert found(id_prefix=f"ok1-{t}") == set(ok1)
        assert found(id_prefix="ok1-%") == set()  # a LIKE wildcard is a character
        assert found(step_failed="only") == set(bad)
        assert found(step_failed="a") == set()
        assert found(since_ms=hour_ago) == everything - set(ok2)
        assert found(until_ms=hour_ago) == set(ok2)
        assert found(workflow="sample", since_ms=hour_ago, statuses=(RunStatus.SUCCEEDED,)) == set(
            ok1
        )

        # Pages of two cover the listing once, newest first.
        listing = _ids(client.search_runs(settings, RunFilter(), 100).runs)
        assert _all_pages(settings, RunFilter(), 2) == listing
        assert listing[-2:] == sorted(ok2, reverse=True)  # the oldest, by their creation
        assert _all_pages(settings, RunFilter(statuses=(RunStatus.SUCCEEDED,)), 1) == [
            r for r in listing if r in {*ok1, *ok2}
        ]

        # The command line: pages of JSON lines (the next page's cursor said on stderr), a
        # count, the filters refused with what to fix.
        done = run_ductor(
            settings, "runs", "list", "--tag", "customer=c1", "--output", "json", "--limit", "3"
        )
        assert done.returncode == 0, done.stderr
        page = [orjson.loads(line) for line in done.stdout.splitlines()]
        cursor = done.stderr.split("more with --cursor ")[1].split()[0]
        assert len(page) == 3 and cursor
        rest = run_ductor(
            settings, "runs", "list", "--tag", "customer=c1", "-o", "json", "--cursor", cursor
        )
        assert "more with --cursor" not in rest.stderr
        ids = [
            r["run_id"] for r in page + [orjson.loads(line) for line in rest.stdout.splitlines()]
        ]
        assert sorted(ids) == sorted([*ok1, *bad])
        first = page[0]
        assert first["tags"] == c1 and first["workflow"] in {"sample", "failing"}
        # As text, a run's tags in a column of their own.
        text = run_ductor(settings, "runs", "list", "--tag", "customer=c1", "--limit", "1")
        header, row = text.stdout.splitlines()
        assert header.split()[:6] == ["RUN", "WORKFLOW", "STATUS", "LAST", "TRANSITION", "TAGS"]
        assert "customer=c1,team=pay" in row.split(), row
        count = run_ductor(settings, "runs", "count", "--since", "1h", "--status", "succeeded")
        assert count.returncode == 0 and count.stdout.strip() == "3", count.stderr
        for args, message in (
            (["--since", "yesterday"], "--since 'yesterday': expected an ISO 8601 time"),
            (["--since", "2026-01-01T00:00:00"], "say the time's offset"),
            (["--tag", "customer"], "a tag is KEY=VALUE"),
            (["--cursor", "nonsense"], "not a cursor this listing gave"),
        ):
            refused = run_ductor(settings, "runs", "list", *args)
            assert refused.returncode == 2 and message in refused.stderr, refused.stderr

        # Bulk cancel: a dry run finds the live runs only; then they are cancelled.
        dry = run_ductor(settings, "runs", "cancel", "--tag", "customer=c2", "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert sorted(dry.stdout.split()) == sorted(later)
        assert client.count_runs(settings, RunFilter(statuses=(RunStatus.PENDING,))) == 2
        nothing = run_ductor(settings, "runs", "cancel")
        assert nothing.returncode == 2 and "needs a RUN_ID or a filter" in nothing.stderr
        too_many = run_ductor(settings, "runs", "cancel", "--tag", "customer=c2", "--max", "1")
        assert too_many.returncode == 1 and "matches 2 runs" in too_many.stderr
        cancelled = client.cancel_runs(settings, RunFilter(tags=(("customer", "c2"),)))
        assert sorted(cancelled.acted) == sorted(later)
        wait_for(
            lambda: client.count_runs(settings, RunFilter(statuses=(RunStatus.CANCELLED,))) == 2,
            30,
            "the bulk cancel to end the live runs",
        )

        # Bulk retry of the failed runs: each runs its step once more, and fails again.
        planned = client.retry_runs(settings, RunFilter(workflow="failing"), dry_run=True)
        assert sorted(planned.matched) == sorted(bad) and planned.acted == ()
        retried = run_ductor(settings, "runs", "retry", "--step-failed", "only")
        assert retried.returncode == 0, retried.stderr
        assert sorted(retried.stdout.split()) == sorted(bad)
        wait_for(
            lambda: all(
                client.get_run(settings, r).status is RunStatus.FAILED
                and len(_attempts(settings, r)) == 2
                for r in bad
            ),
            60,
            "the retried runs to fail again",
        )
    finally:
        worker.stop()

    # inspect --output json: a timeline of both attempts, by a worker, with their error.
    done = run_ductor(settings, "inspect", bad[0], "--output", "json")
    assert done.returncode == 0, done.stderr
    document = orjson.loads(done.stdout)
    assert document["status"] == "failed" and document["workflow"] == "failing"
    assert document["tags"] == c1
    assert document["steps"] == [
        {"name": "only", "kind": "task", "type": "fail", "after": [], "version": 1}
    ]
    assert [(a["node"], a["attempt"], a["outcome"]) for a in document["attempts"]] == [
        ("only", 1, "failed"),
        ("only", 2, "failed"),
    ]
    for attempt in document["attempts"]:
        assert attempt["worker"] and attempt["executions"] == 1
        assert attempt["started"] <= attempt["ended"] and attempt["duration_s"] >= 0
        assert attempt["error"]
    assert document["nodes"] == [
        {
            "node": "only",
            "status": "failed",
            "attempt": 2,
            "error": document["nodes"][0]["error"],
            "output": None,
            "due": None,
            "skipped": None,
            "child_run": None,
        }
    ]


def _attempts(settings: Settings, run_id: str) -> list[dict[str, Any]]:
    done = run_ductor(settings, "inspect", run_id, "--output", "json")
    attempts: list[dict[str, Any]] = orjson.loads(done.stdout)["attempts"]
    return [a for a in attempts if a["outcome"] is not None]


# -- the plans ------------------------------------------------------------------------------------

RUNS = 6000


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from _plan_nodes(child)


def _scans(conn: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> set[tuple[str, str]]:
    """(node type, index or table) of every scan in the plan of ``sql``."""
    row = conn.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    (top,) = row[0]
    return {
        (node["Node Type"], node.get("Index Name") or node["Relation Name"])
        for node in _plan_nodes(top["Plan"])
        if "Relation Name" in node or "Index Name" in node
    }


FILTERS: dict[str, tuple[RunFilter, str]] = {
    "workflow": (RunFilter(workflow="rare"), "eec_workflow_run_ended_workflow_idx"),
    "status": (RunFilter(statuses=(RunStatus.FAILED,)), "eec_workflow_run_ended_status_idx"),
    "window": (RunFilter(since_ms=0, until_ms=1), "eec_workflow_run_ended_created_idx"),
    "id prefix": (RunFilter(id_prefix="plan-rare"), "eec_workflow_run_pkey"),
    "tags": (RunFilter(tags=(("customer", "c-7"),)), "eec_workflow_run_ended_tags_idx"),
    "tags set by steps": (RunFilter(tags=(("order", "o-7"),)), "eec_run_tag_lookup_idx"),
    "failed step": (RunFilter(step_failed="b"), "eec_step_result_failed_idx"),
}


def _fill(pg: psycopg.Connection[Any]) -> None:
    """RUNS ended runs spread over a month (a few failed, a few tagged at start, a few by
    their steps), one live run, a step result per run (and a failed one per failed run);
    statistics up to date."""
    wf = sample_workflow()
    ids = [f"plan-{i}" for i in range(RUNS)]
    for start in range(0, RUNS, 2000):
        insert_runs(pg, wf, [(r, {}) for r in ids[start : start + 2000]], "t1")
    pg.execute(
        "UPDATE eec_workflow_run SET status = CASE WHEN random() < 0.05 THEN 'failed'"
        " ELSE 'succeeded' END, created_at = now() - random() * interval '30 days',"
        " tags = CASE WHEN random() < 0.02 THEN jsonb_build_object('customer', 'c-7')"
        " ELSE '{}'::jsonb END WHERE run_id <> 'plan-0'"
    )
    pg.execute(
        "INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, error)"
        " SELECT run_id, 'b', 1, 'failed', 'x' FROM eec_workflow_run WHERE status = 'failed'"
    )
    pg.execute(
        "INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)"
        " SELECT run_id, 'a', 1, 'succeeded', '{}' FROM eec_workflow_run"
    )
    pg.execute(
        "INSERT INTO eec_run_tag (run_id, key, value)"
        " SELECT run_id, 'order', CASE WHEN random() < 0.02 THEN 'o-7' ELSE 'o-' || run_id END"
        " FROM eec_workflow_run"
    )
    for table in ("eec_workflow_run", "eec_step_result", "eec_run_tag"):
        pg.execute(f"VACUUM ANALYZE {table}")


def test_each_filter_is_served_by_an_index(pg: psycopg.Connection[Any]) -> None:
    _fill(pg)
    problems = []
    for name, (wanted, index) in FILTERS.items():
        # A page after a cursor may well walk the creation order's index instead (it stops
        # at the page's end): any index, but no scan of a table.
        for (sql, params), named in (
            (run_search.search_sql(wanted, 50, None), index),
            (run_search.search_sql(wanted, 50, Cursor(10**15, "plan-5")), None),
            (run_search.count_sql(wanted), index),
        ):
            scans = _scans(pg, sql, params)
            used = {s[1] for s in scans}
            if any(s[0] == "Seq Scan" for s in scans) or (named and named not in used):
                problems.append(f"{name}: {sorted(scans)} (wanted {index}) for {sql}")
    assert not problems, "\n".join(problems)
