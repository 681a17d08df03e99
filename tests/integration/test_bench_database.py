"""`make bench` runs on a database of its own (processor/tools/bench_phases.py,
``fresh_database``): ``<database>_bench``, dropped and created empty at each start, even
while something still holds a connection to the last one."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from processor.io.config import Settings
from processor.tools.bench_phases import fresh_database


@pytest.fixture
def bench_settings(base_settings: Settings) -> Iterator[Settings]:
    made = fresh_database(base_settings)
    try:
        yield made
    finally:
        name = conninfo_to_dict(made.pg_dsn)["dbname"]
        with psycopg.connect(base_settings.pg_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
