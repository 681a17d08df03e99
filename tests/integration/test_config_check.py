"""`ductor config check` against the real services: every check passes for settings that
work; a missing topic, a wrong partition count, a schema behind or ahead of this version and
an unreachable Postgres each fail on a line of their own, quickly."""

from __future__ import annotations

import time
import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.core.routing import DEFAULT_QUEUE, TopicNames
from processor.io.config import check as config_check
from processor.io.config.check import run_checks
from processor.io.config.settings import Settings
from processor.io.shipped.files import Migration, migrations

from .children import run_ductor

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _no_other_queues(pg: psycopg.Connection[Any]) -> None:
    """The check looks for the steps topic of every queue a registered workflow names: the
    workflows with queues of their own that other tests registered (in an earlier run, on a
    database that is kept) are not this test's, whose topics have a prefix of their own."""
    pg.execute(
        "DELETE FROM eec_workflow_definition w WHERE EXISTS (SELECT 1 FROM"
        " jsonb_array_elements(CASE WHEN jsonb_typeof(w.definition -> 'steps') = 'array'"
        " THEN w.definition -> 'steps' ELSE '[]' END) st"
        " WHERE coalesce(st ->> 'queue', 'default') <> 'default')"
    )


def _failed(settings: Settings) -> dict[str, str]:
    return {c.name: c.detail for c in run_checks(settings) if not c.ok}


def test_settings_that_work_pass_every_check(settings: Settings) -> None:
    done = run_ductor(settings, "config", "check")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "ok    telemetry",
        "ok    postgres",
        "ok    schema",
        "ok    requests scope",
        "ok    kafka settings",
        "ok    kafka",
        "ok    topics",
    ]
    assert f"of prefix {settings.topic_prefix!r} with the configured partition counts" in lines[-1]


def test_missing_topics_and_wrong_partition_counts_fail_naming_the_setting(
    settings: Settings,
) -> None:
    fewer = replace(settings, step_partitions=settings.step_partitions + 2)
    names = TopicNames(settings.topic_prefix)
    assert _failed(fewer) == {
        f"topic {topic}": (
            f"has {settings.step_partitions} partition(s), DUCTOR_STEP_PARTITIONS says"
            f" {settings.step_partitions + 2}"
        )
        for topic in names.step_topics(DEFAULT_QUEUE)  # a steps topic per tier
    }
    elsewhere = replace(settings, topic_prefix=f"absent-{uuid.uuid4().hex[:6]}")
    failed = _failed(elsewhere)
    assert f"topic {elsewhere.topic_prefix}.wakeup.t0" in failed
    assert set(failed.values()) == {"does not exist: run `ductor topics create`"}


def test_a_schema_behind_or_ahead_of_this_version_fails(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = migrations()
    newer = [*shipped, Migration("9999_from_the_future", "SELECT 1;")]
    monkeypatch.setattr(config_check, "migrations", lambda: newer)
    assert _failed(settings) == {
        "schema": "1 migration(s) not applied (9999_from_the_future): run `ductor migrate`"
    }
    monkeypatch.setattr(config_check, "migrations", lambda: shipped[:-1])
    assert _failed(settings) == {
        "schema": (
            f"the database has migration(s) this version of Ductor does not know"
            f" ({shipped[-1].name}): it is older than the schema"
        )
    }


def test_an_unreachable_postgres_fails_its_checks_within_seconds(settings: Settings) -> None:
    nowhere = replace(settings, pg_dsn="postgresql://ductor:not-this@127.0.0.1:1/ductor_x")
    started = time.monotonic()
    done = run_ductor(nowhere, "config", "check")
    assert time.monotonic() - started < 20
    assert done.returncode == 1
    assert "not-this" not in done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[1].startswith("FAIL  postgres: cannot connect to user=ductor password=***")
    assert lines[2] == "FAIL  schema: not checked: Postgres did not answer"
    assert lines[3].startswith("ok    requests scope: unscoped")  # said without a database
    assert lines[5].startswith("ok    kafka: ")  # the broker is checked all the same
