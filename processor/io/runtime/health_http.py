"""Health endpoints over stdlib HTTP, for an orchestrator's probes: the server both the
processor (engine/health.py) and the worker (worker/health.py) run, each with a probe of its
own that says what is wrong with it.

``GET /healthz`` (liveness): 200 while the instance's loop keeps turning and none of its
watched threads died (io/runtime/threads.py), 503 once it has not turned for ``stall_s`` or one
died.
``GET /readyz`` (readiness): 200 when the probe reports no problem and the database answers;
otherwise 503. Both answer JSON saying why.

The database is checked by a thread of its own with its own connection, and a request only
reads the last result: a hung database cannot hang a probe, it turns the check stale, which is
reported as not ready. A failed check is reported as ``database: unreachable (<error
class>)``: the server's own message (host names, user names, SQL state text) is for the log,
not for whoever can reach the port.

The server listens on 127.0.0.1 unless told otherwise (``DUCTOR_HTTP_HOST``). A slow or idle
client cannot hold it: each connection has ``request_timeout_s`` in all to send its request and
read the answer, after which it is closed, and at most ``max_connections`` are served at once;
one more is answered ``503`` at once and closed, without a thread.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol

import psycopg

from processor.io.config.settings import Settings
from processor.io.postgres import connections
from processor.io.runtime.listen import ListenError
from processor.io.telemetry.logs import first_line

log = logging.getLogger("ductor.health")

_DB_CHECK_INTERVAL_S = 2.0
_DB_CONNECT_TIMEOUT_S = 2
# A probe sends its few bytes at once and reads a small answer: seconds are plenty.
_REQUEST_TIMEOUT_S = 5.0
# Orchestrator probes come one at a time per instance; a few spare for people and tools.
_MAX_CONNECTIONS = 16
_BUSY_BODY = b'{"status": "busy", "problems": ["too many connections"]}'
_BUSY = (
    b"HTTP/1.0 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


class HealthProbe(Protocol):
    """What the endpoints read of one instance (its loop keeps it up to date)."""

    instance_id: str
    last_loop_at: float
    assigned_partitions: int

    def problems(self, stall_s: float) -> list[str]:
        """Why the instance is not ready, as far as its own reports tell (the server adds
        its database check)."""
        ...

    def broken(self) -> list[str]:
        """What in the instance will not recover by itself (a thread that died): it is not
        alive either."""
        ...


@dataclass(frozen=True)
class HealthReport:
    ok: bool
    body: dict[str, Any]

    @property
    def status(self) -> int:
        return 200 if self.ok else 503


class HealthServer:
    """Serves /healthz and /readyz for the instance behind ``probe`` on ``host``:``port`` (0:
    any free port); the database check connects to ``dsn`` on its own thread."""

    def __init__(
        self,
        probe: HealthProbe,
        dsn: str,
        port: int,
        host: str = "127.0.0.1",
        stall_s: float = 30.0,
        db_check_interval_s: float = _DB_CHECK_INTERVAL_S,
        request_timeout_s: float = _REQUEST_TIMEOUT_S,
        max_connections: int = _MAX_CONNECTIONS,
    ) -> None:
        self._probe = probe
        self._dsn = dsn
        self._stall_s = stall_s
        self._interval_s = db_check_interval_s
        self._db_problem: str | None = "not checked yet"
        self._db_checked_at: float | None = None
        self._stop = threading.Event()
        try:
            self._server = _Server((host, port), request_timeout_s, max_connections)
        except OSError as exc:
            raise ListenError("health", host, port, exc) from None
        self._server.health = self
        self.host: str = host
        self.port: int = self._server.server_address[1]
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True),
            threading.Thread(target=self._check_db_loop, name="health-db", daemon=True),
        ]

    @classmethod
    def started_for(cls, probe: HealthProbe, settings: Settings) -> HealthServer | None:
        """The endpoints as the settings configure them, started; None if they are off."""
        if not settings.health_port:
            return None
        return cls(
            probe,
            settings.pg_dsn,
            settings.health_port,
            host=settings.http_host,
            stall_s=settings.health_stall_s,
        ).start()

    def start(self) -> HealthServer:
        for thread in self._threads:
            thread.start()
        log.info("health endpoints listening", extra={"host": self.host, "port": self.port})
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(_DB_CONNECT_TIMEOUT_S + 5)

    # -- verdicts ----------------------------------------------------------------------------

    def liveness(self) -> HealthReport:
        age = time.monotonic() - self._probe.last_loop_at
        problems = self._probe.broken()
        if age > self._stall_s:
            problems.insert(0, f"the poll loop has not turned for {age:.1f} s")
        status = "ok" if not problems else "stalled" if age > self._stall_s else "broken"
        body: dict[str, Any] = {"status": status, "last_loop_age_s": age}
        if problems:
            body["problems"] = problems
        return HealthReport(not problems, body)

    def readiness(self) -> HealthReport:
        probe = self._probe
        problems = probe.problems(self._stall_s) + self._db_problems()
        body: dict[str, Any] = {
            "status": "ready" if not problems else "not ready",
            "instance": probe.instance_id,
            "assigned_partitions": probe.assigned_partitions,
        }
        if problems:
            body["problems"] = problems
        return HealthReport(not problems, body)

    def _db_problems(self) -> list[str]:
        checked_at, problem = self._db_checked_at, self._db_problem
        if checked_at is None:
            return [f"database: {problem}"]
        age = time.monotonic() - checked_at
        if age > 3 * self._interval_s + _DB_CONNECT_TIMEOUT_S:
            return [f"database: no answer to the health check for {age:.1f} s"]
        return [] if problem is None else [f"database: {problem}"]

    # -- the database check ------------------------------------------------------------------

    def _check_db_loop(self) -> None:
        conn: psycopg.Connection[Any] | None = None
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = connections.connect(self._dsn, _DB_CONNECT_TIMEOUT_S)
                    connections.ping(conn)
                    if self._db_problem is not None and self._db_checked_at is not None:
                        log.info("health check: the database answers again")
                    self._db_problem = None
                except psycopg.Error as exc:
                    if self._db_problem is None or self._db_checked_at is None:
                        log.warning(
                            "health check: the database does not answer: %s", first_line(exc)
                        )
                    self._db_problem = f"unreachable ({type(exc).__name__})"
                    if conn is not None:
                        conn.close()
                        conn = None
                self._db_checked_at = time.monotonic()
                self._stop.wait(self._interval_s)
        finally:
            if conn is not None:
                conn.close()


class _Server(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them, each closed once it has
    been open ``request_timeout_s`` whatever it is doing (a client that trickles its request
    a byte at a time included)."""

    daemon_threads = True
    health: HealthServer

    def __init__(
        self, address: tuple[str, int], request_timeout_s: float, max_connections: int
    ) -> None:
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.request_timeout_s = request_timeout_s
        self._slots = threading.BoundedSemaphore(max_connections)
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            _refuse(request)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)  # starts the connection's thread
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        deadline = threading.Timer(self.request_timeout_s, _cut, args=(request,))
        deadline.daemon = True
        deadline.start()
        try:
            super().process_request_thread(request, client_address)
        finally:
            deadline.cancel()
            self._slots.release()


def _refuse(request: socket.socket) -> None:
    """Answer 503 without reading the request; never block the accepting thread for it."""
    with contextlib.suppress(OSError):
        request.setblocking(False)
        request.send(_BUSY)


def _cut(request: socket.socket) -> None:
    """End a connection that outlived its time: its handler's next read or write fails."""
    with contextlib.suppress(OSError):
        request.shutdown(socket.SHUT_RDWR)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(self.server.request_timeout_s)  # each read and write

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        health = self.server.health
        if path == "/healthz":
            verdict = health.liveness()
        elif path == "/readyz":
            verdict = health.readiness()
        else:
            self._reply(404, {"error": "not found: try /healthz or /readyz"})
            return
        self._reply(verdict.status, verdict.body)

    def _reply(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Probes every few seconds would flood the log; stay quiet."""
