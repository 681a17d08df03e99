"""Fixtures for tests against the real broker and the real Postgres started by `make up`.

Each test gets its own topic prefix and consumer group (topics are created for it and deleted
after), and the run tables are emptied before it, so tests cannot see each other's records.
Nothing here mocks Kafka or Postgres.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from psycopg.conninfo import make_conninfo

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.core.stats import Stats
from processor.core.workflow import WorkflowDef, parse_workflow
from processor.engine.processor import Processor
from processor.io.config.settings import Settings, load_settings
from processor.io.config.settings import child_env as config_child_env
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config
from processor.io.kafka.topics import create_topics, delete_topics
from processor.io.postgres import run_counts
from processor.io.postgres.migrate import migrate
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow
from processor.io.runtime.faults import NO_FAULTS, Faults
from processor.io.telemetry.logs import read_stats
from processor.io.telemetry.setup import Telemetry
from processor.tools import audit as audit_trail
from processor.tools.chaos_steps import execution_log_env
from processor.tools.databases import drop_database
from processor.worker import StepRegistry, sample_registry
from processor.worker.options import WorkerOptions
from processor.worker.worker import Worker

from .background_builds import NEEDED_BY
from .restarts import LocalInfra, local_infra_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "schemas" / "workflows" / "sample.json"


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` when the deadline passes."""
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        event.wait(interval)  # a bounded wait between two checks of the condition


# Tests that change what every test shares (the local Kafka or Postgres restarted, killed or
# frozen: the fixtures that can), that start a three-broker cluster, or that build the package
# or the examples: `make pytest` runs them alone, after the others ran two at a time.
_SERIAL_FIXTURES = {"local_infra", "cluster"}
_SERIAL_FILES = {
    "test_wheel.py",
    "test_examples.py",
    "test_chaos.py",
    "test_bench.py",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        if fixtures & _SERIAL_FIXTURES or item.path.name in _SERIAL_FILES:
            item.add_marker(pytest.mark.serial)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Builds the tests need start as soon as the tests are known (background_builds.py)."""
    files = {item.path.name for item in session.items}
    for name, build in NEEDED_BY.items():
        if name in files:
            build.start()


def pytest_sessionfinish(session: pytest.Session) -> None:
    for build in NEEDED_BY.values():
        build.clean()


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
            " eec_limit_rate, eec_map_item, eec_schedule, eec_run_rewake, eec_run_quarantine"
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
        infra.ensure_running()


def child_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a `ductor` subprocess these settings, logging JSON (and the
    tests' steps modules the database they count executions in)."""
    return config_child_env(replace(settings, log_format="json")) | execution_log_env(settings)


# The installed console script, as a user runs it: `python -m processor` would put the
# current directory on the import path by itself and hide whether `--app` does.
DUCTOR_SCRIPT = str(Path(sys.executable).with_name("ductor"))


def ductor_command(cwd: Path | None) -> tuple[list[str], Path]:
    """How to run `ductor`: `python -m processor` in the repository, or, given ``cwd``, the
    installed script there, as a user runs it."""
    if cwd is None:
        return [sys.executable, "-m", "processor"], REPO
    return [DUCTOR_SCRIPT], cwd


def run_ductor(
    settings: Settings, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`ductor ARGS...` run to its end with these settings (``ductor_command`` says how), its
    output captured as text."""
    command, where = ductor_command(cwd)
    return subprocess.run(
        [*command, *args],
        env=child_env(settings),
        cwd=where,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Spawned:
    """A `ductor` subprocess whose stderr (JSON logs) is captured to a file: `python -m
    processor` in the repository, or, given ``cwd``, the installed script run there as a user
    runs it."""

    def __init__(
        self, args: list[str], env: dict[str, str], log_path: Path, cwd: Path | None = None
    ) -> None:
        self.log_path = log_path
        self._log = log_path.open("wb")
        command, where = ductor_command(cwd)
        self.proc = subprocess.Popen(
            [*command, *args], env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=where
        )

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, and its exit code. A process that has not exited within ``timeout`` fails
        the test (a stop that hangs is a bug wherever it shows): SIGUSR1 makes it write its
        threads' stacks to its log, SIGKILL ends it, and the failure carries the log's tail,
        so a report shows where it was stuck."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2)
            self.proc.kill()
            self.proc.wait(10)
            self._log.close()
            tail = self.log_path.read_text(errors="replace")[-8000:]
            pytest.fail(f"{self.log_path.name} did not stop in {timeout:.0f} s of SIGTERM:\n{tail}")
        self._log.close()
        return code

    def running(self) -> bool:
        """True while the process runs (for ``wait_for`` conditions); once it has exited, the
        test fails with its exit code and the last lines of its log."""
        code = self.proc.poll()
        if code is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-10:]
            pytest.fail(f"{self.log_path.stem} exited with {code}:\n" + "\n".join(tail))
        return True

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)
        self._log.close()

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_path.read_bytes().splitlines():
            try:
                lines.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                continue  # not a log line (a failing command's last sentence)
        return lines

    def outages(self, dependency: str, phase: str = "started") -> int:
        """Its log lines saying an outage of ``dependency`` ("kafka", "postgres") started or
        ended."""
        return sum(
            1
            for line in self.log_lines()
            if line.get("dependency") == dependency and line.get("outage") == phase
        )

    def owned_partitions(self) -> int:
        """Partitions the instance holds, from its assignment log lines."""
        owned = 0
        for line in self.log_lines():
            if line.get("msg") == "partitions assigned":
                owned += int(line["count"])
            elif line.get("msg") == "partitions released":
                owned -= int(line["count"])
        return owned

    def final_stats(self) -> dict[str, Any]:
        stats = read_stats(self.log_path, final=True)
        assert stats is not None, f"no final stats line in {self.log_path}"
        return stats


def still_running(*children: Spawned) -> bool:
    """True while every child runs (a predicate for ``wait_for``); fails the test with the
    end of its log once one has exited."""
    for child in children:
        code = child.proc.poll()
        if code is not None:
            tail = child.log_path.read_text(errors="replace").splitlines()[-10:]
            pytest.fail(f"{child.log_path.stem} exited with {code}:\n" + "\n".join(tail))
    return True


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Spawned]]:
    """Start `ductor` subprocesses; whatever is still running at the end is stopped."""
    started: list[Spawned] = []

    def start(
        args: list[str],
        settings: Settings,
        name: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,  # given: the installed `ductor` script, run there
    ) -> Spawned:
        child = Spawned(args, {**child_env(settings), **(env or {})}, tmp_path / f"{name}.log", cwd)
        started.append(child)
        return child

    yield start
    for child in started:
        if child.proc.poll() is None:
            child.kill()


class ProcessorThread:
    """A processor instance in a thread of the test process, so its stats can be read live."""

    def __init__(
        self, settings: Settings, telemetry: Telemetry | None = None, faults: Faults = NO_FAULTS
    ) -> None:
        self.stats = Stats()
        self.processor = Processor(
            settings, self.stats, telemetry=telemetry or Telemetry(), faults=faults
        )
        self._thread = threading.Thread(target=self.processor.run, name="processor", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """The instance's loop is still running (it stops only when told to, or on a crash)."""
        return self._thread.is_alive()

    def stop(self) -> None:
        self.processor.stop()
        self._thread.join(60)
        assert not self._thread.is_alive(), "processor did not stop within 60 s"


@pytest.fixture
def processor_thread() -> Iterator[Callable[..., ProcessorThread]]:
    started: list[ProcessorThread] = []

    def start(
        settings: Settings, telemetry: Telemetry | None = None, faults: Faults = NO_FAULTS
    ) -> ProcessorThread:
        instance = ProcessorThread(settings, telemetry, faults)
        started.append(instance)
        return instance

    yield start
    for instance in started:
        instance.stop()


class WorkerThread:
    """A step worker in a thread of the test process, so its state can be read live."""

    def __init__(
        self,
        settings: Settings,
        registry: StepRegistry | None = None,
        threads: int = 4,
        options: WorkerOptions | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        self.worker = Worker(
            settings,
            registry or sample_registry(),
            options or WorkerOptions(concurrency=threads),
            telemetry=telemetry or Telemetry(),
        )
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="worker", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:  # what would have ended a `ductor worker` process
            self.error = exc
            raise

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> float:
        """Stop the worker; returns how long it took."""
        started = time.monotonic()
        self.worker.stop()
        self._thread.join(timeout)
        return time.monotonic() - started


class OutsideWriter:
    """Keeps bumping a run's version the way a competing writer would, in transactions that
    hold the row lock. Two connections take turns, so the lock is almost never free: each of
    our commits finds the row held by a writer that moves it, or matches no row, and loses the
    race, but for the rare instant between two writers' locks (a first tick landed there once
    in CI: test_business_metrics allows for it)."""

    def __init__(self, dsn: str, run_id: str) -> None:
        self.writes = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._loop, args=(dsn, run_id), daemon=True) for _ in range(2)
        ]
        for thread in self._threads:
            thread.start()

    def _loop(self, dsn: str, run_id: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            while not self._stop.is_set():
                with conn.transaction():
                    cur = conn.execute(
                        "UPDATE eec_workflow_run SET db_record_version = db_record_version + 1"
                        " WHERE run_id = %s AND status IN ('pending', 'running')",
                        (run_id,),
                    )
                    if cur.rowcount == 0:
                        return  # the run ended
                    conn.execute("SELECT pg_sleep(0.02)")
                self.writes += 1

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)


def metric_values(
    reader: InMemoryMetricReader, name: str
) -> dict[tuple[tuple[str, Any], ...], float]:
    """Current value of a counter or gauge by attribute set (empty when never observed)."""
    data = reader.get_metrics_data()
    values: dict[tuple[tuple[str, Any], ...], float] = {}
    if data is None:
        return values
    for resource_metrics in data.resource_metrics:
        for scope in resource_metrics.scope_metrics:
            for metric in scope.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        values[tuple(sorted((point.attributes or {}).items()))] = point.value  # type: ignore[union-attr]
    return values


def sample_workflow() -> WorkflowDef:
    return parse_workflow(orjson.loads(SAMPLE.read_bytes()))


def drive_into_livelock(
    settings: Settings,
    pg: psycopg.Connection[Any],
    start_processor: Callable[..., ProcessorThread],
    telemetry: Telemetry | None = None,
) -> tuple[str, ProcessorThread]:
    """Start a run, make every commit of it lose to an outside writer, and wait until the
    processor force-fails it for livelock. Returns the run id and the processor."""
    run_id = f"livelock-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    writer = OutsideWriter(settings.pg_dsn, run_id)
    wait_for(lambda: writer.writes > 0, 10, "the outside writer to start")
    instance = start_processor(settings, telemetry)
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    try:
        produce_wakeups(settings, [(topic, Wakeup(run_id, "start", produced_at=now_ms()), None)])
        wait_for(
            lambda: run_statuses(pg, [run_id])[run_id] == "failed", 60, "the livelock force-fail"
        )
    finally:
        writer.stop()
    wait_for(lambda: instance.stats.ticks["force_failed"] == 1, 10, "the force-fail to be counted")
    return run_id, instance


def produce_wakeups(settings: Settings, records: Sequence[tuple[str, Wakeup, int | None]]) -> None:
    """Produce (topic, wakeup, partition) records and wait until the broker has them all."""
    producer = Producer(producer_config(settings, "test-producer"))
    for topic, wakeup, partition in records:
        produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
    assert producer.flush(30) == 0, "the broker did not acknowledge the test records"


def run_statuses(pg: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, str]:
    return run_counts.statuses(pg, run_ids)


def count_terminal(pg: psycopg.Connection[Any], run_ids: list[str]) -> int:
    return run_counts.count_ended(pg, run_ids)


def step_attempts(pg: psycopg.Connection[Any], run_id: str) -> dict[str, list[tuple[int, str]]]:
    """The recorded attempts of each step of a run: node -> [(attempt, outcome), ...]."""
    rows = pg.execute(
        "SELECT node_id, attempt, outcome FROM eec_step_result WHERE run_id = %s"
        " ORDER BY node_id, attempt",
        (run_id,),
    ).fetchall()
    found: dict[str, list[tuple[int, str]]] = {}
    for node, attempt, outcome in rows:
        found.setdefault(node, []).append((attempt, outcome))
    return found


def now_ms() -> int:
    return int(time.time() * 1000)
