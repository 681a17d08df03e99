"""Plugin: the real broker and the real Postgres started by `make up`, and a test's own
share of them.

Each test gets its own topic prefix and consumer group (topics are created for it and deleted
after), and the run tables are emptied before it, so tests cannot see each other's records.
Nothing here mocks Kafka or Postgres.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient
from psycopg.conninfo import make_conninfo

from processor.client.kept import forget_all
from processor.io.config.settings import Settings, load_settings
from processor.io.kafka.topics import create_topics, delete_topics
from processor.io.postgres.migrate import migrate
from processor.io.postgres.workflows import register_workflow
from processor.tools import audit as audit_trail
from processor.tools.chaos_steps import execution_log_env
from processor.tools.databases import drop_database

from .restarts import LocalInfra, local_infra_for
from .samples import sample_workflow


@pytest.fixture(scope="session")
def base_settings() -> Settings:
    settings = load_settings()
    try:
        with psycopg.connect(settings.pg_dsn, connect_timeout=5):
            pass
    except psycopg.OperationalError as exc:
        pytest.fail(
            f"Postgres is not reachable at {settings.pg_dsn_redacted} (run `make up`): {exc}"
        )
    if not AdminClient(settings.kafka_common()).list_topics(timeout=10).brokers:
        pytest.fail(f"Kafka is not reachable at {settings.bootstrap_servers} (run `make up`)")
    settings = _own_database(settings)
    migrate(settings.pg_dsn)
    # Steps that log their executions (counted_steps.py) on a worker in this process write to
    # this process's database, as those of a spawned worker do (child_env): under xdist it is
    # not the one DUCTOR_PG_DSN names.
    os.environ.update(execution_log_env(settings))
    return settings


def _own_database(settings: Settings) -> Settings:
    """Under pytest-xdist each process of the run gets a database of its own (the tests
    empty the run tables): ``<database>_gw0`` and so on, created on first use."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return settings
    with psycopg.connect(settings.pg_dsn, autocommit=True) as admin:
        name = f"{admin.info.dbname}_{worker}"
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
        if exists.fetchone() is None:
            admin.execute(f'CREATE DATABASE "{name}"')
    return replace(settings, pg_dsn=make_conninfo(settings.pg_dsn, dbname=name))


@pytest.fixture
def scratch_dsn(base_settings: Settings) -> Iterator[str]:
    """A new, empty database in the tests' Postgres; dropped at the end."""
    name = f"ductor_scratch_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base_settings.pg_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_conninfo(base_settings.pg_dsn, dbname=name)
    finally:
        with psycopg.connect(base_settings.pg_dsn, autocommit=True) as admin:
            drop_database(admin, name)


@pytest.fixture
def pg(base_settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(base_settings.pg_dsn, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE eec_workflow_run, eec_step_result, eec_outbox, eec_step_attempt,"
            " eec_kept_signal, eec_trigger, eec_limit, eec_limit_hold, eec_limit_wait,"
            " eec_limit_rate, eec_map_item, eec_schedule, eec_run_rewake, eec_run_quarantine,"
            " eec_run_tag"
            " CASCADE"
        )
        # The sample is every test's workflow: registered here, not by whichever test ran
        # first on this database (a fresh one, as CI's, has none; some tests delete it).
        register_workflow(conn, sample_workflow())
        yield conn


@pytest.fixture
def settings(base_settings: Settings, pg: psycopg.Connection[Any]) -> Iterator[Settings]:
    """Settings with a topic prefix and a group of this test's own, its topics created."""
    tag = uuid.uuid4().hex[:8]
    settings = replace(
        base_settings,
        topic_prefix=f"test-{tag}",
        group_id=f"test-{tag}",
        wakeup_partitions=3,
        delay_partitions=3,
        step_partitions=3,
        sweep_interval_s=0.5,
        shutdown_timeout_s=10.0,
    )
    create_topics(settings)
    yield settings
    delete_topics(settings)


@pytest.fixture
def audit(
    pg: psycopg.Connection[Any], base_settings: Settings
) -> Iterator[psycopg.Connection[Any]]:
    """An audit trail of every committed write to a run row (processor/tools/audit.py), to
    prove that no transition is applied twice; emptied before the test."""
    audit_trail.install(pg)
    audit_trail.clear(pg)
    yield pg
    # A connection of its own: the test may have restarted the database under ``pg``.
    with psycopg.connect(base_settings.pg_dsn, autocommit=True) as conn:
        audit_trail.uninstall(conn)


@pytest.fixture
def local_infra(settings: Settings) -> Iterator[LocalInfra]:
    """The local Kafka and Postgres, to restart or crash on their data (tests/integration/
    restarts.py). Whatever the test left down is started again on its data afterwards, before
    the test's topics are deleted."""
    infra = local_infra_for(settings)
    try:
        yield infra
    finally:
        try:
            infra.ensure_running()
        finally:
            # What this process's client keeps (processor/client/kept.py) knew the services
            # before: a producer of a broker ensure_running replaced knows another cluster.
            forget_all()
