"""`make bench` runs on a database of its own (processor/tools/bench_harness.py,
``fresh_database``): ``<database>_bench``, dropped and created empty at each start, even
while something still holds a connection to the last one, and after waiting for a session
the benchmark's role may not end (an autovacuum worker the last run drew there)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from processor.io.config.settings import Settings
from processor.tools.bench_harness import fresh_database
from processor.tools.databases import drop_database

from .restarts import LocalInfra

pytestmark = pytest.mark.integration


@pytest.fixture
def bench_settings(base_settings: Settings) -> Iterator[Settings]:
    made = fresh_database(base_settings)
    try:
        yield made
    finally:
        name = str(conninfo_to_dict(made.pg_dsn)["dbname"])
        with psycopg.connect(base_settings.pg_dsn, autocommit=True) as admin:
            drop_database(admin, name)


def test_the_benchmark_database_is_its_own_and_empty_at_each_start(
    base_settings: Settings, bench_settings: Settings
) -> None:
    base_name = conninfo_to_dict(base_settings.pg_dsn)["dbname"]
    assert conninfo_to_dict(bench_settings.pg_dsn)["dbname"] == f"{base_name}_bench"
    left_open = psycopg.connect(bench_settings.pg_dsn, autocommit=True)
    try:
        left_open.execute("CREATE TABLE left_by_the_last_run (x int)")
        again = fresh_database(base_settings)  # the connection above is still open
    finally:
        left_open.close()
    assert again.pg_dsn == bench_settings.pg_dsn
    with psycopg.connect(again.pg_dsn) as conn:
        tables = conn.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ).fetchone()
    assert tables == (0,)
    with psycopg.connect(base_settings.pg_dsn) as conn:  # the tests' database is untouched
        assert conn.execute("SELECT to_regclass('eec_workflow_run')").fetchone() != (None,)


def test_a_session_the_role_may_not_end_is_waited_for_then_named(
    base_settings: Settings, bench_settings: Settings, local_infra: LocalInfra
) -> None:
    """DROP DATABASE ... WITH (FORCE) fails at once on a session the role may not end (here
    the superuser's, as an autovacuum worker's is): the start tries again until it ends, and
    past its wait says which sessions hold the database."""
    name = str(conninfo_to_dict(bench_settings.pg_dsn)["dbname"])
    held = local_infra.postgres.as_superuser(dbname=name)
    outcome: dict[str, object] = {}

    def start() -> None:
        try:
            outcome["settings"] = fresh_database(base_settings)
        except Exception as exc:  # reported by the assertions below
            outcome["error"] = exc

    try:
        with pytest.raises(
            RuntimeError, match=r"sessions this role may not end .*\(pid \d+ \(postgres\)\)"
        ):
            fresh_database(base_settings, wait_s=0.0)
        starter = threading.Thread(target=start, daemon=True)
        starter.start()
        starter.join(timeout=2.0)  # a bounded wait: it must still be trying
        assert starter.is_alive(), f"the start did not wait for the session: {outcome}"
    finally:
        held.close()
    starter.join(timeout=60)
    assert not starter.is_alive(), "the start went on waiting after the session ended"
    assert "error" not in outcome, outcome
    made = outcome["settings"]
    assert isinstance(made, Settings) and made.pg_dsn == bench_settings.pg_dsn
