"""Runs started for later and schedules, on the real services. A delayed run does not start
before its time, even when it is woken early; it starts once its time passed, woken by the
sweep. A schedule fired by two processors at once starts one run per fire time; one paused
fires nothing, and resumed fires again; a trigger starts a run at once; fires missed while no
processor ran are skipped, or the latest caught up."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import psycopg
import pytest

from processor import client
from processor.client import RunFilter, start_run, wake
from processor.core.schedules import fire_run_id
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from .audit import assert_transitions_applied_once
from .children import run_ductor
from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _workflow(pg: psycopg.Connection[Any]) -> str:
    name = f"sched-{uuid.uuid4().hex[:6]}"
    register_workflow(
        pg,
        parse_workflow(
            {"name": name, "version": 1, "steps": [{"name": "a", "type": "fast"}], "output": "a"}
        ),
    )
    return name


def _started_ms(pg: psycopg.Connection[Any], run_id: str) -> int | None:
    """When the run's first transition was committed (epoch ms), None while it has none."""
    row = pg.execute(
        "SELECT (extract(epoch FROM last_transition_at) * 1000)::bigint, last_transition_seq"
        " FROM eec_workflow_run WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    return None if row is None or row[1] == 0 else int(row[0])


def test_a_delayed_run_starts_at_its_time_not_when_woken_early(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    name = _workflow(pg)
    processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        start_at = datetime.now(UTC) + timedelta(seconds=8)
        assert start_run(settings, name, "later-1", {}, start_at=start_at).created
        delayed = run_ductor(settings, "start", name, "--run-id", "later-2", "--delay", "8s")
        assert delayed.stdout == "later-2\n", delayed.stderr
        # Woken early, again and again: a start of the same id, wakeups of its own.
        again = run_ductor(settings, "start", name, "--run-id", "later-1")
        assert again.stdout == "later-1 (already started)\n"
        for _ in range(3):
            wake(settings, ["later-1", "later-2"], "t1", "start")
        shown = run_ductor(settings, "inspect", "later-1").stdout
        if datetime.now(UTC) < start_at:  # (on a loaded machine the commands may take longer)
            assert "starts at" in shown and "status     pending" in shown, shown
        wait_for(lambda: count_terminal(pg, ["later-1", "later-2"]) == 2, 60, "both to end")
    finally:
        worker.stop()
    began = _started_ms(pg, "later-1")
    assert began is not None and began >= start_at.timestamp() * 1000
    assert set(run_statuses(pg, ["later-1", "later-2"]).values()) == {"succeeded"}
    assert_transitions_applied_once(pg)
    refused = run_ductor(settings, "start", name, "--at", "tomorrow")
    assert refused.returncode == 2 and "--at 'tomorrow': expected an ISO 8601 time" in (
        refused.stderr
    )


def _fired(pg: psycopg.Connection[Any], schedule: str) -> list[str]:
    return [
        r[0]
        for r in pg.execute(
            "SELECT run_id FROM eec_workflow_run WHERE run_id LIKE %s ORDER BY run_id",
            (f"{schedule}@%",),
        )
    ]


def _fire_minute(run_id: str) -> datetime:
    return datetime.fromisoformat(run_id.split("@", 1)[1])


def test_a_schedule_fired_by_two_processors_starts_one_run_per_fire(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    name = _workflow(pg)
    schedule = f"every-2s-{uuid.uuid4().hex[:4]}"
    created = run_ductor(
        settings,
        "schedules",
        "create",
        schedule,
        "--cron",
        "* * * * *",
        "--seconds",
        "*/2",
        "--workflow",
        name,
    )
    assert created.returncode == 0 and created.stdout.startswith(f"schedule {schedule} created")
    first, second = processor_thread(settings), processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: len(_fired(pg, schedule)) >= 3, 60, "three fires")
        assert first.alive and second.alive
        paused = run_ductor(settings, "schedules", "pause", schedule)
        assert paused.stdout == f"schedule {schedule} paused\n"
        at_pause = len(_fired(pg, schedule))
        deadline = time.monotonic() + 3
        wait_for(lambda: time.monotonic() > deadline, 10, "three quiet seconds", 0.5)
        # (A sweep may have held the row when the pause came: at most that one fire more.)
        assert len(_fired(pg, schedule)) <= at_pause + 1
        held = len(_fired(pg, schedule))
        triggered = run_ductor(settings, "schedules", "trigger", schedule)
        assert triggered.stdout.startswith(f"{schedule}@manual-"), triggered.stderr
        resumed = run_ductor(settings, "schedules", "resume", schedule)
        assert resumed.stdout == f"schedule {schedule} resumed\n"
        wait_for(lambda: len(_fired(pg, schedule)) >= held + 2, 60, "fires after the resume")
        run_ductor(settings, "schedules", "delete", schedule)
        fired = _fired(pg, schedule)
        wait_for(lambda: count_terminal(pg, fired) == len(fired), 60, "every fired run to end")
    finally:
        worker.stop()
    times = [r.split("@", 1)[1] for r in fired if "@manual-" not in r]
    # One run per fire time (a fire is even seconds apart), whoever fired it.
    assert len(times) == len(set(times))
    assert all(datetime.fromisoformat(t).second % 2 == 0 for t in times)
    assert set(run_statuses(pg, fired).values()) == {"succeeded"}
    # Each run, the trigger's too, carries its schedule's tag: what finds a schedule's runs.
    tagged = client.search_runs(settings, RunFilter(tags=(("schedule", schedule),)), 1000)
    assert sorted(r.run_id for r in tagged.runs) == sorted(fired)
    assert_transitions_applied_once(pg)


def test_fires_missed_while_nothing_ran_are_skipped_or_caught_up(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Two minutely schedules whose next fire lies ten minutes back (their processors were
    down): the one that skips starts only the fire on time, the one that catches up 3 starts
    the three latest missed as well, and both count what they skipped."""
    name = _workflow(pg)
    for schedule, catch_up in (("skipping", "0"), ("catching", "3")):
        done = run_ductor(
            settings,
            "schedules",
            "create",
            schedule,
            "--cron",
            "* * * * *",
            "--workflow",
            name,
            "--catch-up",
            catch_up,
        )
        assert done.returncode == 0, done.stderr
    pg.execute(
        "UPDATE eec_schedule SET next_fire_at = date_trunc('minute', now()) - interval '10 min'"
        " WHERE name IN ('skipping', 'catching')"
    )
    row = pg.execute("SELECT next_fire_at FROM eec_schedule WHERE name = 'skipping'").fetchone()
    assert row is not None
    back = row[0]
    processor_thread(settings)
    wait_for(lambda: bool(_fired(pg, "skipping") and _fired(pg, "catching")), 60, "the fires")
    # Paused, they fire no more (a sweep holds the row while it fires, so the pause waits
    # for it): what follows reads a settled state. A minute may still have turned before
    # the pause, and then its fire came on time after the first sweep's.
    for schedule in ("skipping", "catching"):
        paused = run_ductor(settings, "schedules", "pause", schedule)
        assert paused.returncode == 0, paused.stderr
    listed = run_ductor(settings, "schedules", "list", "-o", "json")
    rows = {s["name"]: s for s in map(orjson.loads, listed.stdout.splitlines())}
    for schedule, caught in (("skipping", 0), ("catching", 3)):
        fired = _fired(pg, schedule)
        minutes = sorted(_fire_minute(run_id) for run_id in fired)
        # The fires of the first sweep: the one on time (at most a minute late) and the
        # `caught` latest missed before it; then any on time since, one a minute.
        first = minutes[caught]
        later = len(minutes) - caught - 1
        assert later <= 2, f"{schedule} fired {minutes}: more than the minutes the test took"
        expected = [first + timedelta(minutes=m) for m in range(-caught, later + 1)]
        assert fired == sorted(fire_run_id(schedule, int(m.timestamp() * 1000)) for m in expected)
        last_fired = datetime.fromisoformat(rows[schedule]["last_fired_at"])
        assert last_fired.replace(second=0, microsecond=0) == minutes[-1]
        # Missed: every minute from ten minutes back to the first sweep's fire, but those
        # it fired.
        due = (first - back) // timedelta(minutes=1) + 1  # 11, or 12 if a minute turned
        assert (rows[schedule]["fires"], rows[schedule]["missed"]) == (
            len(minutes),
            due - caught - 1,
        )
        run_ductor(settings, "schedules", "delete", schedule)
