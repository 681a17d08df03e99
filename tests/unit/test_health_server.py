"""The health server's own defences, on loopback sockets (no broker, and a database that
refuses connections): it listens on 127.0.0.1 by default, a client that sends nothing or
trickles its request is cut at the request timeout without holding anyone else, connections
beyond the limit are answered 503 at once, and /readyz does not echo the database's error;
the ``ductor.ready`` gauge's verdict."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from processor.engine.health import Probe, is_ready, probe_problems
from processor.io.runtime.faults import Faults
from processor.io.runtime.health_http import HealthServer
from processor.io.runtime.threads import ThreadWatch

# Nothing listens on port 1: the database check fails at once with "connection refused".
REFUSING_DSN = "postgresql://ductor:hunter2-secret@127.0.0.1:1/ductor"


def _until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        pause.wait(0.02)


def _get(port: int, path: str, timeout: float = 3.0) -> tuple[int, dict[str, Any]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def _idle_client(port: int) -> socket.socket:
    """A client that connects and sends nothing."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """Blocks until the server closes ``sock`` (or answers on it); True once it did."""
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


@pytest.fixture
def server() -> Iterator[Callable[..., HealthServer]]:
    started: list[HealthServer] = []

    def start(**options: Any) -> HealthServer:
        health = HealthServer(Probe("test-instance"), REFUSING_DSN, port=0, **options).start()
        started.append(health)
        return health

    yield start
    for health in started:
        health.stop()


def test_it_listens_on_loopback_by_default(server: Callable[..., HealthServer]) -> None:
    health = server()
    assert health.host == "127.0.0.1"
    with pytest.raises(OSError):  # not on another address of this machine
        socket.create_connection(("127.0.0.2", health.port), timeout=2).close()
    assert _get(health.port, "/healthz")[0] == 200


def test_a_client_that_sends_nothing_holds_nobody_and_is_cut_at_the_timeout(
    server: Callable[..., HealthServer],
) -> None:
    health = server(request_timeout_s=1.0)
    idle = _idle_client(health.port)
    started = time.monotonic()
    status, body = _get(health.port, "/healthz")  # answered while the idle client waits
    assert status == 200 and body["status"] == "ok"
    assert time.monotonic() - started < 0.9
    assert _closed_by_server(idle)
    assert time.monotonic() - started < 3.0
    idle.close()


def test_a_client_that_trickles_its_request_is_cut_at_the_timeout(
    server: Callable[..., HealthServer],
) -> None:
    health = server(request_timeout_s=1.0)
    slow = _idle_client(health.port)
    started = time.monotonic()
    cut = threading.Event()

    def trickle() -> None:
        pace = threading.Event()
        try:
            for byte in b"GET /healthz HTTP/1.1\r\nX-Padding: " + b"a" * 1000:
                slow.send(bytes([byte]))
                pace.wait(0.05)  # one byte every 50 ms: each read is well within its timeout
        except OSError:
            cut.set()

    writer = threading.Thread(target=trickle, daemon=True)
    writer.start()
    assert _closed_by_server(slow)
    assert time.monotonic() - started < 3.0
    _until(cut.is_set, 5, "the server to refuse the rest of the trickle")
    assert _get(health.port, "/healthz")[0] == 200
    slow.close()


def test_connections_beyond_the_limit_are_answered_503_at_once(
    server: Callable[..., HealthServer],
) -> None:
    health = server(request_timeout_s=1.5, max_connections=2)
    idle = [_idle_client(health.port) for _ in range(2)]
    _until(lambda: _get(health.port, "/healthz")[0] == 503, 1.2, "the server to be full")
    started = time.monotonic()
    status, body = _get(health.port, "/healthz")
    assert status == 503 and body == {"status": "busy", "problems": ["too many connections"]}
    assert time.monotonic() - started < 0.5
    for sock in idle:  # cut at their timeout: the slots are free again
        assert _closed_by_server(sock)
        sock.close()
    _until(lambda: _get(health.port, "/healthz")[0] == 200, 3, "a slot to be free")


def test_readyz_names_the_database_problem_without_echoing_its_error(
    server: Callable[..., HealthServer],
) -> None:
    health = server()
    _until(
        lambda: "database: not checked yet" not in _get(health.port, "/readyz")[1]["problems"],
        10,
        "the first database check",
    )
    status, body = _get(health.port, "/readyz")
    assert status == 503
    assert body["problems"] == [
        "no partitions assigned",
        "database: unreachable (OperationalError)",
    ]
    text = json.dumps(body)
    for leak in ("refused", "127.0.0.1", "port 1", "ductor", "hunter2"):
        assert leak not in text.replace("test-instance", ""), leak


def test_it_listens_on_an_ipv6_address_when_told(server: Callable[..., HealthServer]) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        health = server(host="::1")
    except RuntimeError as exc:
        pytest.skip(f"no IPv6 loopback here: {exc}")
    conn = http.client.HTTPConnection("::1", health.port, timeout=3)
    try:
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
    finally:
        conn.close()


def test_the_ready_gauge_reads_the_probe_alone_without_a_server_and_readyz_with_one() -> None:
    probe = Probe("gauge-instance", assigned_partitions=3)
    assert is_ready(probe, stall_s=30.0, server=None)
    spoilt = [
        (Probe("a", assigned_partitions=0), "no partitions assigned"),
        (Probe("b", assigned_partitions=3, stopping=True), "shutting down"),
        (Probe("c", assigned_partitions=3, database_ok=False), "the last batch failed"),
        (
            Probe("d", assigned_partitions=3, last_loop_at=time.monotonic() - 60),
            "the poll loop is stalled",
        ),
        (
            Probe("e", assigned_partitions=3, waiting_for="the broker"),
            "starting: waiting for the broker",
        ),
    ]
    for bad, why in spoilt:
        assert not is_ready(bad, stall_s=30.0, server=None), why
        assert [p for p in probe_problems(bad, 30.0) if p.startswith(why)], why
    # With the health server, its database check counts too: this database refuses.
    health = HealthServer(probe, REFUSING_DSN, port=0).start()
    try:
        _until(lambda: _get(health.port, "/readyz")[0] == 503, 10, "the database check")
        assert not is_ready(probe, stall_s=30.0, server=health)
    finally:
        health.stop()


def test_a_watched_thread_that_dies_turns_healthz_and_readyz_to_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A thread ended by the ``thread`` fault point (as an exception nobody foresaw would end
    it): logged at CRITICAL with why, and the instance is neither alive nor ready; a thread
    that returns is no death, and another name is not touched."""
    threads = ThreadWatch(Faults.from_spec("thread=raise:ductor-sweep"))
    probe = Probe("dying-instance", assigned_partitions=3, threads=threads)
    health = HealthServer(probe, REFUSING_DSN, port=0).start()
    try:
        threads.start(lambda: None, "ductor-db").join(5)  # returns: alive and well
        assert _get(health.port, "/healthz")[0] == 200
        threads.start(lambda: None, "ductor-sweep").join(5)
        status, body = _get(health.port, "/healthz")
        assert status == 503 and body["status"] == "broken"
        (problem,) = body["problems"]
        assert problem == (
            "thread ductor-sweep died (Exception: injected fault at thread for ductor-sweep)"
        )
        status, body = _get(health.port, "/readyz")
        assert status == 503 and problem in body["problems"]
        assert not is_ready(probe, stall_s=30.0, server=None)
    finally:
        health.stop()
    (logged,) = [r for r in caplog.records if r.levelname == "CRITICAL"]
    assert "thread ductor-sweep died" in logged.getMessage() and logged.exc_info
