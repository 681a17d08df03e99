"""Graceful shutdown of a busy `ductor process`: SIGTERM with hundreds of runs in flight ends
it with exit 0 within DUCTOR_SHUTDOWN_TIMEOUT_S, and nothing is lost or applied twice: a second
instance started afterwards finishes every run."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor.client import start_runs
from processor.io.config import Settings

from .audit import assert_results_applied, assert_transitions_applied_once
from .conftest import WorkerThread, count_terminal, run_statuses, wait_for

pytestmark = pytest.mark.integration

RUNS = 800
BOUND_S = 10.0


def test_sigterm_while_busy_exits_cleanly_in_bound_and_loses_nothing(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    settings = replace(settings, shutdown_timeout_s=BOUND_S)
    run_ids = [f"term-{i}" for i in range(RUNS)]
    first = spawn(["process"], settings, "first")
    wait_for(lambda: first.owned_partitions() > 0, 60, "the first instance to own partitions")
    worker = WorkerThread(settings)
    try:
        start_runs(settings, "sample", run_ids)
        wait_for(lambda: count_terminal(pg, run_ids) >= 50, 120, "some runs to end", 0.02)
        in_flight = RUNS - count_terminal(pg, run_ids)
        started = time.monotonic()
        code = first.terminate(timeout=BOUND_S + 30)
        elapsed = time.monotonic() - started
        assert in_flight >= 200, f"only {in_flight} runs were in flight at SIGTERM"
        assert code == 0, f"exit code {code}; log in {first.log_path}"
        assert elapsed < BOUND_S + 5, f"shutdown took {elapsed:.1f} s (bound {BOUND_S:.0f} s)"
        messages = [line.get("msg") for line in first.log_lines()]
        assert "processor stopped" in messages  # the clean path ran to its end
        errors = [line for line in first.log_lines() if line.get("level") == "ERROR"]
        assert not errors, errors[:3]
        left = RUNS - count_terminal(pg, run_ids)
        assert left > 0, "every run ended before the shutdown: nothing was in flight"

        second = spawn(["process"], settings, "second")
        wait_for(lambda: count_terminal(pg, run_ids) == RUNS, 180, f"all {RUNS} runs to end", 0.5)
        assert second.terminate() == 0
    finally:
        worker.stop()
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert assert_transitions_applied_once(pg) >= RUNS * 5
    assert sum(second.final_stats()["errors"].values()) == 0


class _FreezingProxy:
    """A TCP proxy to Postgres that can freeze: connections stay open and silent, the way a
    hung database or a dropped network path looks to a client (no reset, no answer)."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self.held = 0  # chunks held back while frozen: a client waits on each
        self._closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self._flowing.clear()

    def close(self) -> None:
        self._closed.set()
        self._flowing.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target, timeout=5)
            upstream.settimeout(None)  # a frozen connection must hang, not time out here
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while not self._closed.is_set():
                data = source.recv(65536)
                if not data:
                    break
                if not self._flowing.is_set():
                    self.held += 1
                self._flowing.wait()  # frozen: hold the bytes, answer nothing
                if self._closed.is_set():
                    break
                sink.sendall(data)
        for s in (source, sink):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def test_sigterm_with_the_database_hung_still_exits_within_the_bound(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    """The bound holds when Postgres stops answering mid-batch: the batch in flight is
    abandoned (its records are redelivered), the process exits 0 in time, and a second
    instance finishes every run with nothing applied twice."""
    pg = audit
    conninfo = psycopg.conninfo.conninfo_to_dict(settings.pg_dsn)
    host, port = str(conninfo.get("host", "127.0.0.1")), int(str(conninfo.get("port", 5432)))
    proxy = _FreezingProxy(host, port)
    conninfo.update(host="127.0.0.1", port=str(proxy.port))
    dsn = psycopg.conninfo.make_conninfo("", **conninfo)
    settings = replace(settings, shutdown_timeout_s=BOUND_S)
    run_ids = [f"hung-{i}" for i in range(RUNS)]
    worker = WorkerThread(settings)  # the worker's own database path is not frozen
    try:
        child = spawn(["process"], replace(settings, pg_dsn=dsn), "hung")
        wait_for(lambda: child.owned_partitions() > 0, 60, "the instance to own partitions")
        start_runs(settings, "sample", run_ids)
        wait_for(lambda: count_terminal(pg, run_ids) >= 50, 120, "some runs to end", 0.02)
        proxy.freeze()
        wait_for(lambda: proxy.held > 0, 30, "a query to hang on the frozen database")
        started = time.monotonic()
        code = child.terminate(timeout=BOUND_S + 10)
        elapsed = time.monotonic() - started
        proxy.close()  # the hung connections drop; Postgres rolls back what they held
        assert code == 0, f"exit code {code} after {elapsed:.1f} s; log in {child.log_path}"
        assert elapsed < BOUND_S + 5, f"shutdown took {elapsed:.1f} s (bound {BOUND_S:.0f} s)"

        second = spawn(["process"], settings, "second")
        wait_for(lambda: count_terminal(pg, run_ids) == RUNS, 180, f"all {RUNS} runs to end", 0.5)
        assert second.terminate() == 0
    finally:
        proxy.close()
        worker.stop()
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_transitions_applied_once(pg)
