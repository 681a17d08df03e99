"""A schedule's seconds, on the real services: six cron fields are refused at the door (they
are read seconds first by some and seconds last by others: `*/10 * * * * *`, meant as every
ten seconds, fired every second), seconds are given apart (`--seconds`), `schedules create`
prints the next three fires in the schedule's zone, and a schedule stored with six fields
before migration 0036 keeps the meaning it had (seconds last) and fires as it did."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from itertools import pairwise
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.migrate import MIGRATIONS_TABLE, migrate
from processor.io.postgres.schedules import fire_due, list_schedules
from processor.io.postgres.store import Definitions
from processor.io.postgres.workflows import register_workflow
from processor.io.shipped.files import migrations

from .children import run_ductor

pytestmark = pytest.mark.integration

SECONDS_MIGRATION = "0036_schedule_seconds"
WORKFLOW = {"name": "ticker", "version": 1, "steps": [{"name": "a", "type": "fast"}]}


def _rows(pg: psycopg.Connection[Any], name: str) -> list[tuple[Any, ...]]:
    return pg.execute(
        "SELECT cron, seconds, tz, next_fire_at FROM eec_schedule WHERE name = %s", (name,)
    ).fetchall()


def test_six_fields_are_refused_and_seconds_given_apart_fire_as_written(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    register_workflow(pg, parse_workflow(WORKFLOW))
    name = f"ticker-{uuid.uuid4().hex[:6]}"
    refused = run_ductor(
        settings, "schedules", "create", name, "--cron", "*/10 * * * * *", "--workflow", "ticker"
    )
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    assert refused.stderr == (
        "ductor: cron '*/10 * * * * *' has six fields, which some read with the seconds first"
        " (Quartz, Spring) and others last (croniter): write the five cron fields (minute hour"
        " day-of-month month day-of-week) and the seconds apart: --cron '* * * * *' --seconds"
        " '*/10' (seconds first) or --cron '*/10 * * * *' --seconds '*' (seconds last)\n"
    )
    assert _rows(pg, name) == [], "a refused schedule writes nothing"

    created = run_ductor(
        settings,
        "schedules",
        "create",
        name,
        "--cron",
        "* * * * *",
        "--seconds",
        "*/10",
        "--tz",
        "Asia/Kolkata",
        "--workflow",
        "ticker",
    )
    assert created.returncode == 0, created.stderr
    header, *fires = created.stdout.splitlines()
    assert header == f"schedule {name} created; its next 3 fires (Asia/Kolkata):"
    times = [datetime.fromisoformat(line.split()[0]) for line in fires]
    assert len(times) == 3
    # Ten seconds apart, in the zone's own offset (+05:30 the year round), the weekday after.
    assert [t.utcoffset() for t in times] == [timedelta(hours=5, minutes=30)] * 3
    assert [b - a for a, b in pairwise(times)] == [timedelta(seconds=10)] * 2
    assert all(t.second % 10 == 0 for t in times)
    assert [line.split()[1] for line in fires] == [t.strftime("%a") for t in times]
    ((cron, seconds, tz, next_fire_at),) = _rows(pg, name)
    assert (cron, seconds, tz) == ("* * * * *", "*/10", "Asia/Kolkata")
    assert next_fire_at == times[0], "the first fire printed is the one stored"

    listed = run_ductor(settings, "schedules", "list")
    (line,) = [row for row in listed.stdout.splitlines() if row.startswith(name)]
    assert "* * * * * --seconds */10 (Asia/Kolkata)" in line
    (shown,) = [
        s
        for s in map(
            orjson.loads,
            run_ductor(settings, "schedules", "list", "-o", "json").stdout.splitlines(),
        )
        if s["name"] == name
    ]
    assert (shown["cron"], shown["seconds"]) == ("* * * * *", "*/10")


def _migrate_until(dsn: str, last: str) -> None:
    """Apply and record the migrations named before ``last`` (a database as it was before
    that one), as `ductor migrate` of an older version did."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"CREATE TABLE {MIGRATIONS_TABLE} ("
            " name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for migration in migrations():
            if migration.name >= last:
                break
            with conn.transaction():
                conn.execute(migration.sql)
                conn.execute(f"INSERT INTO {MIGRATIONS_TABLE} VALUES (%s)", (migration.name,))


@pytest.fixture
def older_database(scratch_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    _migrate_until(scratch_dsn, SECONDS_MIGRATION)
    with psycopg.connect(scratch_dsn, autocommit=True) as conn:
        yield conn


def test_a_schedule_stored_with_six_fields_keeps_its_meaning_after_the_migration(
    base_settings: Settings, scratch_dsn: str, older_database: psycopg.Connection[Any]
) -> None:
    """Before 0036 six fields were read seconds last (croniter's order, the only one taken):
    `* * * * * */10` fired every ten seconds, and still does, its sixth field now in the
    `seconds` column. A five-field one is left as it was. Written by hand, six fields are
    refused by the table itself."""
    pg = older_database
    register_workflow(pg, parse_workflow(WORKFLOW))
    for name, cron in (("every-10s", "* * * * * */10"), ("nightly", "30 2 * * *")):
        pg.execute(  # next due 30 to 40 s back, on a fire time of the first
            "INSERT INTO eec_schedule (name, cron, workflow_name, shard, next_fire_at)"
            " VALUES (%s, %s, 'ticker', 0,"
            "         to_timestamp(floor(extract(epoch FROM now()) / 10) * 10 - 30))",
            (name, cron),
        )
    assert migrate(scratch_dsn)[0] == SECONDS_MIGRATION
    stored = {s.name: (s.cron, s.seconds) for s in list_schedules(pg)}
    assert stored == {"every-10s": ("* * * * *", "*/10"), "nightly": ("30 2 * * *", None)}

    # Fired as before: the fires of the last half minute, ten seconds apart.
    pg.execute("UPDATE eec_schedule SET paused_at = now() WHERE name = 'nightly'")
    started = fire_due(pg, Definitions(), 1, [0], 10)
    fires = [datetime.fromisoformat(run_id.split("@")[1]) for run_id, _ in started]
    assert len(fires) >= 3, started
    assert all(f.second % 10 == 0 for f in fires), started
    assert [b - a for a, b in pairwise(fires)] == [timedelta(seconds=10)] * (len(fires) - 1)

    with pytest.raises(psycopg.errors.CheckViolation):
        pg.execute(
            "INSERT INTO eec_schedule (name, cron, workflow_name, shard, next_fire_at)"
            " VALUES ('by-hand', '*/10 * * * * *', 'ticker', 0, now())"
        )


def test_a_stored_schedule_that_cannot_be_read_is_refused_by_resume(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    """A row written by hand around the CLI (a random field) is not guessed at: resuming it
    says why, exit 1, and it stays paused."""
    register_workflow(pg, parse_workflow(WORKFLOW))
    pg.execute(
        "INSERT INTO eec_schedule (name, cron, workflow_name, shard, next_fire_at, paused_at)"
        " VALUES ('by-hand', 'R * * * *', 'ticker', 0, now(), now())"
    )
    resumed = run_ductor(settings, "schedules", "resume", "by-hand")
    assert resumed.returncode == 1, resumed.stdout
    assert resumed.stderr.startswith("ductor: schedule 'by-hand': cron 'R * * * *': R (random)")
    assert pg.execute("SELECT paused_at IS NOT NULL FROM eec_schedule").fetchone() == (True,)
