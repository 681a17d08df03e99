"""The health endpoints of a processor running in this process against the real broker and
database: ready once it owns partitions, not ready through a database outage (and alive all
along), not alive while its loop is stalled, and gone after shutdown; a worker's, ready with
partitions and not while left out of a queue where tasks wait."""

from __future__ import annotations

import json
import re
import socket
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from processor.core.routing import TIERS, TopicNames
from processor.core.stats import Stats
from processor.core.step_task import StepTask
from processor.engine.processor import Processor
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config
from processor.io.kafka.topics import create_topics
from processor.io.runtime.health_http import HealthServer
from processor.io.runtime.listen import ListenError
from processor.io.telemetry.setup import Telemetry
from processor.worker.health import QueueLag, WorkerProbe

from .instances import ProcessorThread, WorkerThread
from .proxy import TcpProxy
from .scrape import free_port
from .telemetry_capture import metric_values
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _get(port: int, path: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def _status(port: int, path: str) -> int:
    """The status code, or 0 while nothing listens yet (the server starts with the thread)."""
    try:
        return _get(port, path)[0]
    except urllib.error.URLError:
        return 0


def test_ready_when_partitions_are_assigned_and_closed_after_shutdown(
    settings: Settings, processor_thread: Any
) -> None:
    port = free_port()
    instance: ProcessorThread = processor_thread(replace(settings, health_port=port))
    wait_for(lambda: _status(port, "/readyz") == 200, 60, "/readyz to answer 200")
    status, body = _get(port, "/readyz")
    assert status == 200 and body["status"] == "ready"
    assert body["assigned_partitions"] == len(instance.processor.assigned) > 0
    status, body = _get(port, "/healthz")
    assert status == 200 and body["status"] == "ok" and body["last_loop_age_s"] < 5
    assert _get(port, "/nowhere")[0] == 404

    instance.stop()
    with pytest.raises(urllib.error.URLError):
        _get(port, "/healthz")


def _ready_gauge(reader: InMemoryMetricReader) -> float | None:
    return metric_values(reader, "ductor.ready").get(())


def test_not_ready_through_a_database_outage_but_alive(
    settings: Settings, processor_thread: Any
) -> None:
    """The ``ductor.ready`` gauge says what /readyz says, through the outage and after."""
    proxy = TcpProxy.for_dsn(settings.pg_dsn)
    port = free_port()
    through_proxy = replace(settings, pg_dsn=proxy.dsn(settings.pg_dsn), health_port=port)
    reader = InMemoryMetricReader()
    processor_thread(through_proxy, Telemetry.build(None, [], [reader], settings.group_id))
    try:
        wait_for(lambda: _status(port, "/readyz") == 200, 60, "/readyz to answer 200")
        assert _ready_gauge(reader) == 1
        assigned = _get(port, "/readyz")[1]["assigned_partitions"]
        assert metric_values(reader, "ductor.partitions.assigned") == {(): assigned}
        proxy.cut()
        wait_for(lambda: _status(port, "/readyz") == 503, 30, "/readyz to report the outage")
        assert _ready_gauge(reader) == 0
        status, body = _get(port, "/readyz")
        assert status == 503 and body["status"] == "not ready"
        # A fixed phrase with the error's class, never the server's or the driver's own text.
        database = [p for p in body["problems"] if p.startswith("database: ")]
        assert database, body
        for problem in database:
            assert re.fullmatch(
                r"database: (unreachable \(\w+\)|no answer to the health check for [\d.]+ s)",
                problem,
            ), problem
        text = json.dumps(body).lower()
        assert "127.0.0.1" not in text and "connection" not in text, body
        # The loop keeps turning without its database: no reason to restart the instance.
        assert _status(port, "/healthz") == 200
        proxy.restore()
        wait_for(lambda: _status(port, "/readyz") == 200, 30, "/readyz to recover")
        wait_for(lambda: _ready_gauge(reader) == 1, 10, "the ready gauge to recover")
    finally:
        proxy.close()


def test_not_alive_while_the_poll_loop_is_stalled(settings: Settings) -> None:
    """The loop is held for real at a turn boundary (the ``until`` check runs in the loop)."""
    hold, release = threading.Event(), threading.Event()

    def until() -> bool:
        if hold.is_set():
            release.wait(60)  # the poll loop's own thread waits here: it stops turning
        return False

    processor = Processor(settings, Stats(), telemetry=Telemetry())
    health = HealthServer(
        processor.probe, settings.pg_dsn, port=0, host="127.0.0.1", stall_s=1.0
    ).start()
    thread = threading.Thread(target=processor.run, kwargs={"until": until}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: _status(health.port, "/readyz") == 200, 60, "/readyz to answer 200")
        hold.set()
        wait_for(lambda: _status(health.port, "/healthz") == 503, 30, "/healthz to report a stall")
        status, body = _get(health.port, "/healthz")
        assert status == 503 and body["status"] == "stalled" and body["last_loop_age_s"] > 1.0
        status, body = _get(health.port, "/readyz")
        assert status == 503 and "the poll loop is stalled" in body["problems"]
        hold.clear()
        release.set()
        wait_for(lambda: _status(health.port, "/healthz") == 200, 30, "/healthz to recover")
        processor.stop()
        wait_for(lambda: _status(health.port, "/readyz") == 503, 30, "/readyz during shutdown")
    finally:
        release.set()
        processor.stop()
        thread.join(60)
        health.stop()
    assert not thread.is_alive()
    # Stopped and never ticking again: not ready, with every reason given.
    again = HealthServer(
        processor.probe, settings.pg_dsn, port=0, host="127.0.0.1", stall_s=1.0
    ).start()
    try:
        status, body = _get(again.port, "/readyz")
        assert status == 503
        assert "shutting down" in body["problems"]
        assert "no partitions assigned" in body["problems"]
    finally:
        again.stop()


def test_a_port_in_use_is_a_clear_error(settings: Settings) -> None:
    processor = Processor(settings, Stats(), telemetry=Telemetry())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ListenError, match=f"cannot listen on 127.0.0.1:{port}"):
            HealthServer(processor.probe, settings.pg_dsn, port=port, host="127.0.0.1")


def test_a_worker_is_ready_with_partitions_and_not_while_left_out_of_a_queue_with_tasks(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    """A worker answers /healthz and /readyz like a processor. One that holds no partition
    of a queue where tasks wait is not ready (the queue's lag, read from the broker); a spare
    worker of an idle queue is."""
    port = free_port()
    worker = WorkerThread(replace(settings, health_port=port))
    try:
        # Ready at once (no partition yet, but nothing waits), and still once it owns them.
        wait_for(lambda: _status(port, "/readyz") == 200, 60, "the worker's /readyz to be 200")
        wait_for(
            lambda: (
                _get(port, "/readyz")[1]["assigned_partitions"]
                == len(TIERS) * settings.step_partitions
            ),
            60,
            "the worker to own the steps partitions",
        )
        assert _get(port, "/readyz")[0] == 200 and _get(port, "/healthz")[0] == 200
    finally:
        worker.stop()
    # Tasks on a queue nobody serves: its lag is what a worker left out of it would see.
    create_topics(settings, queues=["left-out"])
    topic = TopicNames(settings.topic_prefix).steps_for("left-out")
    producer = Producer(producer_config(settings, "test-lag"))
    for i in range(5):
        produce(producer, topic, StepTask(f"r{i}", "n", 1, "fast", 2**42).encode(), b"k")
    assert producer.flush(30) == 0
    lag = QueueLag(settings, {topic: "left-out", f"{settings.topic_prefix}.steps": "default"})
    try:
        assert lag.waiting() == {"left-out": 5}
        probe = WorkerProbe("w", lag)
        assert probe.problems(30.0) == [
            "no partition of queue(s) left-out assigned, while 5 task(s) wait there"
        ]
        probe.assigned_partitions = 1
        assert probe.problems(30.0) == []
    finally:
        lag.close()
