"""Step code does not hold the engine's keys, on the real services: a worker connected as a
login role of the ``ductor_worker`` group (schemas/migrations/0023_worker_role.sql) completes
runs (claims, data reads, results, its heartbeat), while that role may not write a run row, a
signal, the outbox or a trigger; and a step, on a thread or in a child process, finds neither
the coordinator's DSN nor the worker's nor any other secret in its environment."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from infra.local import Postgres
from infra.local import Settings as InfraSettings
from processor.client import get_run
from processor.core.model import StepOutcome
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.step_data import StepResultRow, insert_step_results
from processor.io.postgres.worker_registry import servers
from processor.io.postgres.workflows import register_workflow
from processor.io.shipped.files import migrations

from .children import Spawned, child_env, run_ductor
from .instances import ProcessorThread, WorkerThread
from .runs import count_terminal, run_statuses
from .samples import sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

WORKER_GROUP = "ductor_worker"


@pytest.fixture
def role_admin(
    settings: Settings, pg: psycopg.Connection[Any]
) -> Iterator[psycopg.Connection[Any]]:
    """A connection to the tests' database as a role that may create roles: the tests' own if
    it may (a superuser, as the compose file's is), else the local cluster's superuser over its
    socket (the local ``ductor`` role has no CREATEROLE, as many a deployment's has not)."""
    may = pg.execute(
        "SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    if may is not None and may[0]:
        with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
            yield conn
        return
    dbname = str(conninfo_to_dict(settings.pg_dsn).get("dbname") or "ductor")
    try:
        conn = Postgres(InfraSettings.from_env()).as_superuser(dbname=dbname)
    except psycopg.OperationalError as exc:
        pytest.skip(f"needs a role that may create roles (none here, nor a local cluster): {exc}")
    with conn:
        yield conn


@pytest.fixture
def worker_login(
    settings: Settings, pg: psycopg.Connection[Any], role_admin: psycopg.Connection[Any]
) -> Iterator[str]:
    """A login role of the worker group for this test, its DSN. The group is created by an
    administrator if the migration could not (the documented manual path), then granted its
    privileges by the tables' owner."""
    exists = role_admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (WORKER_GROUP,))
    if exists.fetchone() is None:
        # (Another database's test may make it meanwhile.)
        with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            role_admin.execute(f"CREATE ROLE {WORKER_GROUP} NOLOGIN")
    granted = pg.execute("SELECT ductor_grant_worker_role()").fetchone()
    assert granted == (True,)
    login, password = f"worker_{uuid.uuid4().hex[:8]}", secrets.token_hex(12)
    role_admin.execute(f"CREATE ROLE {login} LOGIN PASSWORD '{password}' IN ROLE {WORKER_GROUP}")
    try:
        yield make_conninfo(settings.pg_dsn, user=login, password=password)
    finally:
        role_admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (login,)
        )
        role_admin.execute(f"DROP ROLE {login}")


def test_a_worker_as_the_worker_role_completes_runs(
    settings: Settings,
    pg: psycopg.Connection[Any],
    worker_login: str,
    processor_thread: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Runs of the sample workflow (a step that fails and is retried, dependencies, one input
    too large to travel with its tasks, so the claims read it) end succeeded with the worker
    connected as the worker role; its registration, heartbeats and clean stop are in the
    registry; nothing it did was refused."""
    caplog.set_level(logging.WARNING)
    instance: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(replace(settings, worker_pg_dsn=worker_login))
    run_ids = [f"role-{i}" for i in range(4)]
    try:
        for i, run_id in enumerate(run_ids):
            payload = {"blob": "x" * 5000} if i == 0 else {"i": i}
            started = run_ductor(
                settings,
                "start",
                "sample",
                "--run-id",
                run_id,
                "--input",
                orjson.dumps(payload).decode(),
            )
            assert started.returncode == 0, started.stderr
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 90, "the runs to end")
        assert worker.worker.fetched >= 1  # the large input was read by a claim
        # Its connections (the claims' lane, the results' lane, the heartbeat) are the
        # worker role's.
        login = conninfo_to_dict(worker_login)["user"]
        sessions = pg.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE usename = %s AND datname = current_database()",
            (login,),
        ).fetchone()
        assert sessions is not None and sessions[0] >= 3, sessions
        # What it serves and holds is in its row, and the role reads the workers' rows (what
        # a worker handed a task it has no function for reads: worker/handback.py).
        with psycopg.connect(worker_login) as as_worker:

            def its_row_shows_its_partitions() -> bool:
                rows = servers(as_worker, settings.worker_group_id, settings.instance_timeout_s)
                mine = [s for s in rows if s.instance_id == worker.worker.instance_id]
                return bool(mine) and mine[0].live and bool(mine[0].partitions)

            wait_for(its_row_shows_its_partitions, 30, "the worker's row to show its partitions")
            [mine] = [
                s
                for s in servers(as_worker, settings.worker_group_id, settings.instance_timeout_s)
                if s.instance_id == worker.worker.instance_id
            ]
            assert mine.queues == {"default"} and {"fast", "flaky"} <= mine.step_types
    finally:
        worker.stop()
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert instance.alive
    row = pg.execute(
        "SELECT kind, stopped_at IS NOT NULL, started_through > 0 FROM eec_instance"
        " WHERE instance_id = %s",
        (worker.worker.instance_id,),
    ).fetchone()
    assert row == ("worker", True, True)
    assert "permission denied" not in caplog.text


# What a step holding the worker's credentials would try: every one refused.
REFUSED = (
    "UPDATE eec_workflow_run SET status = 'failed'",
    "SELECT failure_reason FROM eec_workflow_run",
    "INSERT INTO eec_trigger DEFAULT VALUES",
    "SELECT * FROM eec_trigger",
    "INSERT INTO eec_run_signal (run_id, signal_id, kind) VALUES ('r', 's', 'cancel')",
    "INSERT INTO eec_outbox DEFAULT VALUES",
    "DELETE FROM eec_step_result",
    "UPDATE eec_step_result SET outcome = 'failed'",
    "DELETE FROM eec_instance",
    "UPDATE eec_instance SET kind = 'processor'",
    "INSERT INTO eec_workflow_definition DEFAULT VALUES",
    "DELETE FROM eec_schedule",
    "DELETE FROM eec_limit",
    "DELETE FROM eec_kept_signal",
    "SELECT ductor_grant_worker_role()",
)


def test_the_worker_role_may_not_touch_what_is_not_a_workers(worker_login: str) -> None:
    """As the worker role: no write to a run row (its state is the coordinator's), no trigger
    written or read, no signal, no outbox record, no result rewritten, no other instance's row
    changed, no definition, schedule or limit; each statement refused for its privilege."""
    allowed = []
    with psycopg.connect(worker_login, autocommit=True) as conn:
        for statement in REFUSED:
            try:
                conn.execute(statement)
                allowed.append(statement)
            except psycopg.errors.InsufficientPrivilege:
                pass
    assert allowed == []


def test_the_worker_role_records_the_tags_steps_set_within_their_bound(
    pg: psycopg.Connection[Any], worker_login: str
) -> None:
    """As the worker role: a success's tags are written with it, a later value replaces one,
    and the bound's trigger (which counts a run's tags) refuses a run's 17th key."""
    run_id = f"role-tags-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")

    def result(node: str, tags: dict[str, str]) -> StepResultRow:
        return StepResultRow(run_id, node, 1, StepOutcome.SUCCEEDED, {}, None, tags=tags)

    sixteen = {f"k{i:02}": "v" for i in range(16)}
    with psycopg.connect(worker_login, autocommit=True) as conn:
        insert_step_results(conn, [result("a", sixteen)], "w")
        insert_step_results(conn, [result("b", {"k00": "again"})], "w")
        with pytest.raises(psycopg.errors.CheckViolation, match="at most 16 tags"):
            insert_step_results(conn, [result("c", {"k16": "x"})], "w")
    kept = dict(pg.execute("SELECT key, value FROM eec_run_tag WHERE run_id = %s", (run_id,)))
    assert kept == {**sixteen, "k00": "again"}


def test_without_createrole_the_migration_applies_and_says_what_to_run(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    """The migration's own text, its role renamed to one that does not exist, run by a role
    that may not create roles (the local ``ductor``): it applies, grants nothing, and its
    warning names the SQL an administrator runs."""
    may = pg.execute("SELECT rolcreaterole OR rolsuper FROM pg_roles WHERE rolname = current_user")
    if may.fetchone() == (True,):
        pytest.skip("the tests' role may create roles: the path is for one that may not")
    (migration,) = [m for m in migrations() if m.name == "0023_worker_role"]
    absent = f"ductor_worker_absent_{uuid.uuid4().hex[:6]}"
    sql = migration.sql.replace(WORKER_GROUP, absent).replace(
        "ductor_grant_worker_role", f"grant_{absent}"
    )
    warnings: list[str] = []
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.add_notice_handler(
            lambda d: (
                warnings.append(f"{d.message_primary} | {d.message_hint}")
                if d.severity_nonlocalized == "WARNING"
                else None
            )
        )
        try:
            with conn.transaction():
                conn.execute(sql)
            assert conn.execute(f"SELECT grant_{absent}()").fetchone() == (False,)
        finally:
            conn.execute(f"DROP FUNCTION IF EXISTS grant_{absent}()")
    assert warnings and f"CREATE ROLE {absent} NOLOGIN" in warnings[0]
    assert pg.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (absent,)).fetchone() is None


@pytest.mark.parametrize("isolation", ["thread", "process"])
def test_step_code_finds_no_dsn_nor_password_in_its_environment(
    settings: Settings,
    pg: psycopg.Connection[Any],
    processor_thread: Any,
    tmp_path: Path,
    isolation: str,
) -> None:
    """`ductor worker` given the coordinator's DSN, its own DSN from a file and the web page's
    token, as a deployment sharing one environment would: a step reading its environment finds
    none of them, nor the file's path; in a child process, not even in the environment the
    process started with."""
    tag = uuid.uuid4().hex[:8]
    coordinator_secret = f"coordinator-secret-{tag}"
    token = f"ui-token-{tag}-{secrets.token_hex(8)}"
    dsn_file = tmp_path / "worker-dsn"
    dsn_file.write_text(settings.pg_dsn + "\n")  # the worker's own DSN, from a file
    env = child_env(settings)
    env.pop("DUCTOR_WORKER_PG_DSN", None)
    env.pop("DUCTOR_TEST_EXECUTION_LOG", None)  # (the tests' own steps' database: not here)
    env |= {
        # Never used by the worker (its own DSN is the file's): only there to be found.
        "DUCTOR_PG_DSN": make_conninfo(settings.pg_dsn, password=coordinator_secret),
        "DUCTOR_WORKER_PG_DSN_FILE": str(dsn_file),
        "DUCTOR_UI_TOKEN": token,
    }
    workflow = f"environ-{tag}"
    register_workflow(
        pg,
        parse_workflow(
            {"name": workflow, "version": 1, "steps": [{"name": "look", "type": "read_environ"}]}
        ),
    )
    processor_thread(settings)
    app = "tests.integration.environ_steps:registry"
    worker = Spawned(
        ["worker", "--app", app, "--isolation", isolation], env, tmp_path / "worker.log"
    )
    markers = [coordinator_secret, token, str(dsn_file), settings.pg_dsn]
    try:
        started = run_ductor(
            settings,
            "start",
            workflow,
            "--run-id",
            f"env-{tag}",
            "--input",
            orjson.dumps({"markers": markers}).decode(),
        )
        assert started.returncode == 0, started.stderr
        wait_for(
            lambda: worker.running() and count_terminal(pg, [f"env-{tag}"]) == 1,
            60,
            "the step to run",
        )
    finally:
        worker.terminate()
    result = get_run(settings, f"env-{tag}")
    assert result.status.value == "succeeded", result.failure_reason
    seen = result.output if isinstance(result.output, dict) else {}
    if not seen:  # the workflow declares no output: the step's result is in its row
        row = pg.execute(
            "SELECT output FROM eec_step_result WHERE run_id = %s AND node_id = 'look'",
            (f"env-{tag}",),
        ).fetchone()
        assert row is not None
        seen = row[0]
    assert seen["has_path"] is True
    assert seen["secret_names"] == []
    assert seen["leaks"] == []
    if isolation == "process":
        assert seen["pid"] != worker.proc.pid  # it ran in a child process
        assert seen["initial_leaks"] == []
    assert os.environ.get("DUCTOR_UI_TOKEN") != token  # (the test's own environment untouched)
