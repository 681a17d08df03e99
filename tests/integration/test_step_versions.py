"""Versioned step code on the real services (core/versions.py): two workers live at once on one
queue, one with `charge` version 1 and one with versions 1 and 2, their functions writing
which version ran each execution. Runs started before version 2 existed run version 1 on every
attempt, retries included, wherever their tasks land; runs started after run version 2 (a task
that lands on the version 1 worker is handed to the other); `runs upgrade` moves a live run and
its next attempt runs version 2; a run moved to a version no live worker serves fails that
attempt naming the type and version, and `runs retry` succeeds once a worker with it runs.
Every attempt ran once, at its run's version."""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from typing import Any

import orjson
import psycopg
import pytest

from processor.client import send_signal, start_runs
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow
from processor.worker import StepContext, StepFailed, StepRegistry

from .children import run_ductor
from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

_TABLE = "test_version_execution"


class _Log:
    """Each execution of `charge`, with the version that ran it, written before it returns."""

    dsn = ""
    local = threading.local()

    @classmethod
    def record(cls, ctx: StepContext, version: int) -> None:
        conn = getattr(cls.local, "conn", None)
        if conn is None or conn.closed:
            conn = cls.local.conn = psycopg.connect(cls.dsn, autocommit=True)
        conn.execute(
            f"INSERT INTO {_TABLE} (run_id, node, attempt, version) VALUES (%s, %s, %s, %s)",
            (ctx.run_id, ctx.node, ctx.attempt, version),
        )


def _charge(version: int) -> Any:
    def charge(ctx: StepContext) -> Any:
        _Log.record(ctx, version)
        if ctx.node == "charge" and ctx.attempt in (ctx.input or {}).get("fail_on", ()):
            raise StepFailed(f"attempt {ctx.attempt} fails (version {version})")
        return {"version": version}

    return charge


V1 = StepRegistry()
V1.step("charge")(_charge(1))
V1_AND_V2 = StepRegistry()
V1_AND_V2.step("charge")(_charge(1))
V1_AND_V2.step("charge", version=2)(_charge(2))
V3 = StepRegistry()
V3.step("charge", version=3)(_charge(3))

WORKFLOW = {
    "name": "versioned_pay",
    "version": 1,
    "steps": [
        {"name": "hold", "kind": "wait", "signal": "go"},
        {
            "name": "charge",
            "type": "charge",
            "depends_on": ["hold"],
            "retry": {"max_attempts": 2, "backoff_ms": 50},
        },
        {"name": "settle", "type": "charge", "depends_on": ["charge"]},
    ],
}


def _pins(pg: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, int | None]:
    """Each run's pin of step charge as its state stores it (None: version 1)."""
    rows = pg.execute(
        "SELECT run_id, (node_states -> 'charge' ->> 'version')::int FROM eec_workflow_run"
        " WHERE run_id = ANY(%s)",
        (run_ids,),
    ).fetchall()
    return dict(rows)


def _started(pg: psycopg.Connection[Any], run_ids: list[str]) -> bool:
    rows = pg.execute(
        "SELECT count(*) FROM eec_workflow_run WHERE run_id = ANY(%s) AND status = 'running'",
        (run_ids,),
    ).fetchone()
    return rows is not None and rows[0] == len(run_ids)


def _executions(pg: psycopg.Connection[Any], prefix: str) -> Counter[tuple[str, str, int, int]]:
    rows = pg.execute(
        f"SELECT run_id, node, attempt, version, count(*) FROM {_TABLE}"
        " WHERE starts_with(run_id, %s) GROUP BY 1, 2, 3, 4",
        (prefix,),
    ).fetchall()
    return Counter({(r, n, a, v): c for r, n, a, v, c in rows})


def _go(settings: Settings, run_ids: list[str]) -> None:
    for run_id in run_ids:
        send_signal(settings, run_id, "go")


def _start_pinned_at_2(settings: Settings, pg: psycopg.Connection[Any], prefix: str) -> list[str]:
    """Runs started until one pins version 2: the processor reads what the workers serve at
    most once a second. Their ids, the last the one pinned at 2."""
    made: list[str] = []

    def pinned() -> bool:
        run_id = f"{prefix}probe-{len(made)}"
        made.append(run_id)
        start_runs(settings, "versioned_pay", [run_id])
        wait_for(lambda: _started(pg, [run_id]), 30, f"run {run_id} to start")
        return _pins(pg, [run_id])[run_id] == 2

    wait_for(pinned, 30, "a run started now to pin charge version 2")
    return made


def test_two_versions_live_at_once_each_run_keeps_its_own(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    _Log.dsn = settings.pg_dsn
    pg.execute(
        f"CREATE TABLE IF NOT EXISTS {_TABLE} (run_id text, node text, attempt int, version int)"
    )
    register_workflow(pg, parse_workflow(WORKFLOW))
    processor_thread(settings)
    prefix = f"ver-{uuid.uuid4().hex[:6]}-"
    old_worker = WorkerThread(settings, V1, threads=4)
    workers = [old_worker]
    try:
        wait_for(lambda: old_worker.worker.assigned > 0, 60, "the v1 worker's partitions")
        # Runs started while only version 1 is served, held at their wait step: pinned to 1.
        before = [f"{prefix}before-{i}" for i in range(6)]
        start_runs(settings, "versioned_pay", before, run_input={"fail_on": [1]})
        moved, doomed = f"{prefix}moved", f"{prefix}doomed"
        bulk = [f"{prefix}bulk-{i}" for i in range(3)]
        start_runs(settings, "versioned_pay", [moved, doomed, *bulk])
        held = [*before, moved, doomed, *bulk]
        wait_for(lambda: _started(pg, held), 30, "the runs to start")
        assert set(_pins(pg, held).values()) == {None}

        # A worker with versions 1 and 2 joins the queue: both serve it at once.
        new_worker = WorkerThread(settings, V1_AND_V2, threads=4)
        workers.append(new_worker)
        wait_for(
            lambda: old_worker.worker.assigned > 0 and new_worker.worker.assigned > 0,
            60,
            "both workers to hold partitions of the queue",
        )
        probes = _start_pinned_at_2(settings, pg, prefix)
        listed = run_ductor(settings, "workers", "--output", "json")
        rows = [orjson.loads(line) for line in listed.stdout.splitlines()]  # one a line
        served = {w["instance_id"]: w["step_types"] for w in rows}
        assert served[old_worker.worker.instance_id] == ["charge"]
        assert served[new_worker.worker.instance_id] == ["charge", "charge@2"]
        # (24 runs: each run's tasks share a partition, and the chance that none of them
        # lands on the version 1 worker's, a third of them or more, is (2/3)^24 at most.)
        after = [f"{prefix}after-{i}" for i in range(24)]
        start_runs(settings, "versioned_pay", after, run_input={"fail_on": [1]})
        wait_for(lambda: _started(pg, after), 30, "the later runs to start")
        assert set(_pins(pg, after).values()) == {2}

        # Old runs go on at version 1 (their retries too), later ones at version 2.
        done = [*before, *after, *probes]
        _go(settings, done)
        wait_for(lambda: count_terminal(pg, done) == len(done), 90, "the runs to end")
        assert set(run_statuses(pg, done).values()) == {"succeeded"}
        ran = _executions(pg, prefix)
        for run_id in before:
            assert {k[1:]: c for k, c in ran.items() if k[0] == run_id} == {
                ("charge", 1, 1): 1,
                ("charge", 2, 1): 1,
                ("settle", 1, 1): 1,
            }
        for run_id in after:
            assert {k[1:]: c for k, c in ran.items() if k[0] == run_id} == {
                ("charge", 1, 2): 1,
                ("charge", 2, 2): 1,
                ("settle", 1, 2): 1,
            }
        # The version 1 worker got some of the later runs' tasks, and handed them on.
        assert old_worker.worker.stats.handed_back.get("charge@2", 0) > 0

        # An operator moves a run started at version 1: its next attempt runs version 2.
        dry = run_ductor(
            settings, "runs", "upgrade", moved, "--step", "charge", "--to-version", "2",
            "--dry-run",
        )  # fmt: skip
        assert dry.returncode == 0, dry.stderr
        assert "would move" in dry.stdout and _pins(pg, [moved])[moved] is None
        upgraded = run_ductor(settings, "runs", "upgrade", moved, "--latest")
        assert upgraded.returncode == 0, upgraded.stderr
        assert "charge (charge): version 1 -> 2" in upgraded.stdout
        assert _pins(pg, [moved])[moved] == 2
        _go(settings, [moved])
        wait_for(lambda: count_terminal(pg, [moved]) == 1, 60, "the moved run to end")
        assert run_statuses(pg, [moved]) == {moved: "succeeded"}
        assert {k[1:] for k in _executions(pg, moved)} == {("charge", 1, 2), ("settle", 1, 2)}
        shown = run_ductor(settings, "inspect", moved, "--output", "json")
        document = orjson.loads(shown.stdout)
        assert [s.get("version") for s in document["steps"]] == [None, 2, 2]
        assert {(a["node"], a["version"]) for a in document["attempts"] if a["worker"]} == {
            ("charge", 2),
            ("settle", 2),
        }

        # Every held run a filter matches, moved at once (--dry-run first: nothing moves).
        filters = ("--id-prefix", f"{prefix}bulk-", "--status", "running", "--latest")
        dry = run_ductor(settings, "runs", "upgrade", *filters, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        assert sorted(dry.stdout.split()) == bulk and set(_pins(pg, bulk).values()) == {None}
        done_bulk = run_ductor(settings, "runs", "upgrade", *filters)
        assert done_bulk.returncode == 0, done_bulk.stderr
        assert "upgrade: 3 of 3 matching running or failed run(s)" in done_bulk.stderr
        assert set(_pins(pg, bulk).values()) == {2}
        _go(settings, bulk)
        wait_for(lambda: count_terminal(pg, bulk) == 3, 60, "the moved runs to end")
        assert {k[3] for k in _executions(pg, f"{prefix}bulk-")} == {2}

        # Moved to a version no live worker serves: its attempts fail, naming it; no
        # function ran. A retry once a worker with it runs succeeds.
        bad = run_ductor(
            settings, "runs", "upgrade", doomed, "--step", "charge", "--to-version", "3"
        )
        assert bad.returncode == 0, bad.stderr
        _go(settings, [doomed])
        wait_for(lambda: count_terminal(pg, [doomed]) == 1, 60, "the doomed run to fail")
        assert run_statuses(pg, [doomed]) == {doomed: "failed"}
        errors = pg.execute(
            "SELECT error FROM eec_step_result WHERE run_id = %s AND outcome = 'failed'",
            (doomed,),
        ).fetchall()
        assert len(errors) == 2
        assert all("type 'charge' version 3" in e for (e,) in errors)
        assert _executions(pg, doomed) == Counter()
        v3_worker = WorkerThread(settings, V3, threads=2)
        workers.append(v3_worker)
        wait_for(lambda: v3_worker.worker.assigned > 0 and _serves_v3(pg), 60, "the v3 worker")
        retried = run_ductor(settings, "runs", "retry", doomed)
        assert retried.returncode == 0, retried.stderr
        wait_for(lambda: count_terminal(pg, [doomed]) == 1, 60, "the retried run to end")
        wait_for(lambda: run_statuses(pg, [doomed]) == {doomed: "succeeded"}, 60, "it to succeed")
        # The retry's attempt (3) ran version 3, and so did settle (--step moves every step
        # of the type).
        assert {k[1:]: c for k, c in _executions(pg, doomed).items()} == {
            ("charge", 3, 3): 1,
            ("settle", 1, 3): 1,
        }
    finally:
        for worker in workers:
            worker.stop()


def _serves_v3(pg: psycopg.Connection[Any]) -> bool:
    row = pg.execute(
        "SELECT count(*) FROM eec_instance WHERE kind = 'worker' AND stopped_at IS NULL"
        " AND 'charge@3' = ANY(step_types)"
    ).fetchone()
    return row is not None and row[0] > 0
