"""Health endpoints of one processor instance, for an orchestrator's probes (stdlib HTTP).

``GET /healthz`` (liveness): 200 while the poll loop keeps turning, 503 once it has not turned
for ``DUCTOR_HEALTH_STALL_S``. A loop stuck that long will not recover by itself; restarting the
instance is safe (its uncommitted records are redelivered).

``GET /readyz`` (readiness): 200 when the instance owns partitions, the database answers and it
is not shutting down; otherwise 503. Both answer JSON saying why.

The database is checked by a thread of its own with its own connection, never the batch's, and
a request only reads the last result: a hung database cannot hang a probe, it turns the check
stale, which is reported as not ready.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import psycopg

from processor.io import store

log = logging.getLogger("ductor.health")

_DB_CHECK_INTERVAL_S = 2.0
_DB_CONNECT_TIMEOUT_S = 2


@dataclass
class Probe:
    """What the endpoints read of one instance; its poll loop keeps it up to date (plain
    attribute writes, read without a lock: a probe sees a value at most a turn old)."""

    instance_id: str
    last_loop_at: float = field(default_factory=time.monotonic)
    assigned_partitions: int = 0
    stopping: bool = False
    database_ok: bool = True  # False after a batch failed on a database error


@dataclass(frozen=True)
class Verdict:
    ok: bool
    body: dict[str, Any]

    @property
    def status(self) -> int:
        return 200 if self.ok else 503


class HealthServer:
    """Serves /healthz and /readyz for the instance behind ``probe`` on ``port`` (0: any free
    port); the database check connects to ``dsn`` on its own thread."""

    def __init__(
        self,
        probe: Probe,
        dsn: str,
        port: int,
        host: str = "0.0.0.0",
        stall_s: float = 30.0,
        db_check_interval_s: float = _DB_CHECK_INTERVAL_S,
    ) -> None:
        self._probe = probe
        self._dsn = dsn
        self._stall_s = stall_s
        self._interval_s = db_check_interval_s
        self._db_problem: str | None = "not checked yet"
        self._db_checked_at: float | None = None
        self._stop = threading.Event()
        try:
            self._server = _Server((host, port), _Handler)
        except OSError as exc:
            raise RuntimeError(f"cannot listen on port {port} for health checks: {exc}") from None
        self._server.health = self
        self.port: int = self._server.server_address[1]
        self._threads = [
            threading.Thread(target=self._server.serve_forever, name="health-http", daemon=True),
            threading.Thread(target=self._check_db_loop, name="health-db", daemon=True),
        ]

    def start(self) -> HealthServer:
        for thread in self._threads:
            thread.start()
        log.info("health endpoints listening", extra={"port": self.port})
        return self

    def stop(self) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        for thread in self._threads:
            thread.join(_DB_CONNECT_TIMEOUT_S + 5)

    # -- verdicts ----------------------------------------------------------------------------

    def liveness(self) -> Verdict:
        age = time.monotonic() - self._probe.last_loop_at
        ok = age <= self._stall_s
        body: dict[str, Any] = {"status": "ok" if ok else "stalled", "last_loop_age_s": age}
        if not ok:
            body["problems"] = [f"the poll loop has not turned for {age:.1f} s"]
        return Verdict(ok, body)

    def readiness(self) -> Verdict:
        probe = self._probe
        problems: list[str] = []
        if probe.stopping:
            problems.append("shutting down")
        if not self.liveness().ok:
            problems.append("the poll loop is stalled")
        assigned = probe.assigned_partitions
        if assigned == 0:
            problems.append("no partitions assigned")
        if not probe.database_ok:
            problems.append("the last batch failed on a database error")
        problems += self._db_problems()
        body: dict[str, Any] = {
            "status": "ready" if not problems else "not ready",
            "instance": probe.instance_id,
            "assigned_partitions": assigned,
        }
        if problems:
            body["problems"] = problems
        return Verdict(not problems, body)

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
                        conn = store.connect(self._dsn, _DB_CONNECT_TIMEOUT_S)
                    store.ping(conn)
                    self._db_problem = None
                except psycopg.Error as exc:
                    text = str(exc).strip()
                    self._db_problem = text.splitlines()[0] if text else type(exc).__name__
                    if conn is not None:
                        conn.close()
                        conn = None
                self._db_checked_at = time.monotonic()
                self._stop.wait(self._interval_s)
        finally:
            if conn is not None:
                conn.close()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    health: HealthServer


class _Handler(BaseHTTPRequestHandler):
    server: _Server

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
