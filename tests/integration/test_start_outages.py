"""A broker or a database that does not answer when `ductor process` and `ductor worker` start
is an outage they ride through, as they would once running: each stays up, alive (/healthz
200) and not ready (/readyz 503, saying what it waits for), logs the outage once when it
starts and once when it ends, and serves runs to their end once the dependency answers. A
proxy in front of the real service refuses every connection, then lets them through. A topic
that does not exist, with the broker answering, still stops the start at once (exit 2)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.io.config.settings import Settings

from .children import Spawned, run_ductor, still_running
from .proxy import TcpProxy
from .runs import count_terminal, run_statuses
from .scrape import free_port
from .waiting import wait_for

pytestmark = pytest.mark.integration

# The old start gave up after this long (a metadata request's timeout), with exit code 1.
_OLD_START_GAVE_UP_S = 10.0


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """Status and body; (0, {}) while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except urllib.error.URLError:
        return 0, {}


def _outage(child: Spawned, dependency: str, phase: str) -> list[dict[str, Any]]:
    return [
        line
        for line in child.log_lines()
        if line.get("dependency") == dependency and line.get("outage") == phase
    ]


@pytest.fixture
def broker_proxy(settings: Settings) -> Iterator[TcpProxy]:
    host, port = settings.bootstrap_servers.split(",")[0].rsplit(":", 1)
    proxy = TcpProxy(host, int(port))
    yield proxy
    proxy.close()


@pytest.fixture
def database_proxy(settings: Settings) -> Iterator[TcpProxy]:
    proxy = TcpProxy.for_dsn(settings.pg_dsn)
    yield proxy
    proxy.close()


def _ride_out_at_start(
    settings: Settings,
    pg: psycopg.Connection[Any],
    spawn: Any,
    proxy: TcpProxy,
    env: dict[str, str],
    dependency: str,
    awaited: str,
) -> tuple[Spawned, Spawned]:
    """Start a processor and a worker whose ``dependency`` is behind ``proxy``, refusing; see
    them wait, alive and not ready, past the time the old start gave up; let the dependency
    through and see runs end. Returns both, stopped (exit 0)."""
    proxy.cut()  # every connection refused from the start
    ports = {"process": free_port(), "worker": free_port()}
    started_at = time.monotonic()
    children = {
        name: spawn([name], settings, name, {**env, "DUCTOR_HEALTH_PORT": str(port)})
        for name, port in ports.items()
    }
    processor, worker = children["process"], children["worker"]
    wait_for(
        lambda: (
            still_running(processor, worker)
            and all(_outage(c, dependency, "started") for c in children.values())
        ),
        60,
        f"both to report the {dependency} outage",
    )
    wait_for(
        lambda: (
            still_running(processor, worker)
            and time.monotonic() - started_at > _OLD_START_GAVE_UP_S + 2
        ),
        60,
        "both to be up for longer than the old start waited",
        0.5,
    )
    for name, port in ports.items():
        assert _get(port, "/healthz")[0] == 200, name
        status, body = _get(port, "/readyz")
        assert status == 503 and f"starting: waiting for {awaited}" in body["problems"], body

    run_ids = [f"start-{dependency}-{uuid.uuid4().hex[:6]}-{i}" for i in range(20)]
    start_runs(settings, "sample", run_ids)  # (the test's own access is not behind the proxy)
    proxy.restore()
    wait_for(
        lambda: still_running(processor, worker) and count_terminal(pg, run_ids) == len(run_ids),
        120,
        "every run to end once the dependency answers",
        0.2,
    )
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    wait_for(lambda: _get(ports["process"], "/readyz")[0] == 200, 30, "the processor ready")
    wait_for(lambda: _get(ports["worker"], "/readyz")[0] == 200, 30, "the worker ready")
    for child in children.values():
        assert child.terminate() == 0
        assert len(_outage(child, dependency, "started")) == 1, child.log_path
        assert len(_outage(child, dependency, "ended")) == 1, child.log_path
    return processor, worker


def test_a_broker_unreachable_at_start_is_an_outage_ridden_through(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any, broker_proxy: TcpProxy
) -> None:
    # Only the bootstrap goes through the proxy: once it answers, the clients reach the
    # broker at the address it advertises, as they would any broker that came back.
    env = {"DUCTOR_BOOTSTRAP_SERVERS": f"127.0.0.1:{broker_proxy.port}"}
    processor, worker = _ride_out_at_start(
        settings, pg, spawn, broker_proxy, env, "kafka", "the broker"
    )
    assert next(line for line in worker.log_lines() if line.get("msg") == "worker stopped")[
        "outages"
    ] == {"postgres": 0, "kafka": 1}
    assert any(line.get("msg") == "processor started" for line in processor.log_lines())


def test_a_database_unreachable_at_start_is_an_outage_ridden_through(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any, database_proxy: TcpProxy
) -> None:
    env = {"DUCTOR_PG_DSN": database_proxy.dsn(settings.pg_dsn)}
    processor, worker = _ride_out_at_start(
        settings, pg, spawn, database_proxy, env, "postgres", "the database"
    )
    assert next(line for line in worker.log_lines() if line.get("msg") == "worker stopped")[
        "outages"
    ] == {"postgres": 1, "kafka": 0}
    assert not _outage(processor, "kafka", "started")


def test_a_stop_while_waiting_at_start_is_clean(
    settings: Settings, spawn: Any, broker_proxy: TcpProxy
) -> None:
    broker_proxy.cut()
    env = {"DUCTOR_BOOTSTRAP_SERVERS": f"127.0.0.1:{broker_proxy.port}"}
    children = [spawn([name], settings, name, env) for name in ("process", "worker")]
    wait_for(
        lambda: still_running(*children) and all(_outage(c, "kafka", "started") for c in children),
        60,
        "both to wait for the broker",
    )
    for child in children:
        stopped_at = time.monotonic()
        code = child.terminate()
        assert code == 0, child.log_path.read_text(errors="replace")[-3000:]
        assert time.monotonic() - stopped_at < 10
        assert any(line.get("msg", "").endswith(" stopped") for line in child.log_lines())


def test_a_topic_that_does_not_exist_stops_the_start_at_once(settings: Settings) -> None:
    """The broker answers, the topics are not there: configuration, not an outage."""
    absent = replace(settings, topic_prefix=f"absent-{uuid.uuid4().hex[:8]}")
    for command_settings, command in (
        (absent, ["process"]),
        (settings, ["worker", "--queue", "nowhere"]),
    ):
        started = time.monotonic()
        done = run_ductor(command_settings, *command)
        assert done.returncode == 2, done.stderr
        assert time.monotonic() - started < 30
        assert "does not exist" in done.stderr and "ductor topics create" in done.stderr
        assert "Traceback" not in done.stderr
