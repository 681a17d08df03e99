"""Traces and metrics against the real broker and database, with in-memory exporters: a
conflict is told apart from an error, an outage is an error, a requeue stays in one trace."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.telemetry.setup import Telemetry

from .contention import drive_into_livelock
from .instances import ProcessorThread, WorkerThread
from .proxy import TcpProxy
from .runs import run_statuses
from .samples import SAMPLE, now_ms, produce_wakeups
from .scrape import free_port, scrape
from .telemetry_capture import metric_values
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _total(reader: InMemoryMetricReader, name: str) -> float:
    return sum(metric_values(reader, name).values())


def _attr(span: ReadableSpan, key: str) -> Any:
    return (span.attributes or {}).get(key)


def _start_one(settings: Settings, pg: psycopg.Connection[Any], run_id: str) -> None:
    insert_runs(pg, parse_workflow(orjson.loads(SAMPLE.read_bytes())), [(run_id, {})], "t1")


def test_a_conflict_is_an_event_with_unset_status_and_a_requeue_stays_in_one_trace(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    # The later tick comes from the requeue on the delay topic; the overdue sweep's own
    # wakeup (the run not ticked within the grace on a slow machine) would be another span.
    settings = replace(settings, livelock_requeues=1, sweep_grace_s=3600.0)
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    telemetry = Telemetry.in_memory(exporter, reader)
    run_id, instance = drive_into_livelock(settings, pg, processor_thread, telemetry)
    names = TopicNames(settings.topic_prefix)
    instance.stop()
    spans = exporter.get_finished_spans()

    # One span per run's work: attempts are `tick` events on it, each conflict a `conflict`
    # event too, and nothing has an error status.
    assert {s.kind for s in spans} == {SpanKind.CONSUMER}
    assert not [s for s in spans if s.status.status_code is StatusCode.ERROR]
    consumers = [s for s in spans if s.kind is SpanKind.CONSUMER]
    first = next(s for s in consumers if s.name == f"process {names.wakeup('t1')}")
    later = next(s for s in consumers if s.name == f"process {names.delay(100)}")
    ticks = [e for s in spans for e in s.events if e.name == "tick"]
    conflicts = [e for e in ticks if (e.attributes or {}).get("ductor.outcome") == "conflict"]
    assert len(conflicts) == 10  # five in-process tries, twice
    assert [e.name for e in first.events].count("conflict") == 5
    # (Before its first lost race, a try may find the writer holding the row: `locked`.)
    assert [
        (e.attributes or {}).get("ductor.attempt")
        for e in first.events
        if e.name == "tick" and (e.attributes or {}).get("ductor.outcome") == "conflict"
    ] == [1, 2, 3, 4, 5]
    # ductor.attempt on a tick is the deprecated name of ductor.tick.try (docs/telemetry.md).
    assert all(
        (e.attributes or {}).get("ductor.tick.try") == (e.attributes or {}).get("ductor.attempt")
        for e in ticks
    )
    assert all("ductor.commit_ms" in (e.attributes or {}) for e in conflicts)
    assert _attr(first, "ductor.outcome") == "requeued"
    # The try that settled the span's outcome (the fifth lost race requeued it), and its
    # deprecated name counting the tries lost before it.
    assert (_attr(first, "ductor.tick.try"), _attr(first, "ductor.attempts")) == (5, 4)
    assert _attr(later, "ductor.outcome") == "force_failed"
    assert _attr(first, "messaging.system") == "kafka"
    assert _attr(first, "messaging.consumer.group.name") == settings.group_id
    assert _attr(first, "ductor.run_id") == run_id

    # One trace: original wakeup -> requeue (a `send` event, the record carrying the
    # consumer span's context) -> later tick, a child of the first.
    (send,) = [e for e in first.events if e.name == "send"]
    assert (send.attributes or {}).get("messaging.destination.name") == names.delay(100)
    assert (send.attributes or {}).get("messaging.kafka.message.key") == f"{run_id}:1"
    assert first.context is not None and later.context is not None
    assert later.parent is not None and later.parent.span_id == first.context.span_id
    assert later.context.trace_id == first.context.trace_id

    # Metrics: conflicts counted, errors not; the force-fail by reason.
    assert _total(reader, "ductor.conflicts") == 10
    assert _total(reader, "ductor.errors") == 0
    assert metric_values(reader, "ductor.force_fails") == {(("ductor.reason", "livelock"),): 1}
    assert metric_values(reader, "ductor.requeues") == {(("ductor.delay.rung_ms", 100),): 1}


def test_a_database_outage_makes_error_spans_and_counts_errors(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    proxy = TcpProxy.for_dsn(settings.pg_dsn)
    through_proxy = replace(settings, pg_dsn=proxy.dsn(settings.pg_dsn))
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    run_id = f"outage-{uuid.uuid4().hex[:6]}"
    _start_one(settings, pg, run_id)
    names = TopicNames(settings.topic_prefix)
    instance: ProcessorThread = processor_thread(
        through_proxy, Telemetry.in_memory(exporter, reader)
    )
    try:
        produce_wakeups(
            settings, [(names.wakeup("t1"), Wakeup(run_id, "start", produced_at=now_ms()), None)]
        )
        wait_for(lambda: run_statuses(pg, [run_id])[run_id] == "running", 30, "the first commit")
        proxy.cut()
        produce_wakeups(
            settings, [(names.wakeup("t1"), Wakeup(run_id, "signal", produced_at=now_ms()), None)]
        )
        wait_for(lambda: instance.stats.ticks["error"] > 0, 30, "a tick to fail on the outage")
        proxy.restore()
        wait_for(
            lambda: instance.stats.ticks["noop"] >= 1,
            30,
            "the run to be ticked again after the outage",
        )
    finally:
        proxy.close()
    instance.stop()
    spans = exporter.get_finished_spans()
    errors = [s for s in spans if s.status.status_code is StatusCode.ERROR]
    assert errors, "the outage must produce ERROR spans"
    for span in errors:
        assert _attr(span, "ductor.outcome") == "error"
        assert _attr(span, "error.type")
        assert any(e.name == "exception" for e in span.events)
    assert _total(reader, "ductor.errors") >= 1
    assert _total(reader, "ductor.conflicts") == 0
    assert instance.stats.conflicts == 0


def test_consumer_lag_counts_the_records_behind_a_paused_delay_partition(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Five records due in a minute: the delay partition pauses at the first, and the lag
    gauge reports all five behind it even though the partition fetches nothing."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry.build(None, [], [reader], settings.group_id)
    names = TopicNames(settings.topic_prefix)
    due = now_ms() + 60_000
    records = [
        (names.delay(10000), Wakeup(f"later-{i}", "timer", due_at=due, produced_at=now_ms()), 0)
        for i in range(5)
    ]
    produce_wakeups(settings, records)
    processor_thread(settings, telemetry)
    key = (
        ("messaging.destination.name", names.delay(10000)),
        ("messaging.destination.partition.id", "0"),
    )
    wait_for(lambda: metric_values(reader, "ductor.consumer.lag").get(key) == 5, 30, "the lag of 5")


def test_the_prometheus_endpoint_serves_the_metrics(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    port = free_port()
    run_id = f"scraped-{uuid.uuid4().hex[:6]}"
    _start_one(settings, pg, run_id)
    child = spawn(["process"], replace(settings, metrics_port=port), "scraped")
    names = TopicNames(settings.topic_prefix)
    produce_wakeups(
        settings, [(names.wakeup("t1"), Wakeup(run_id, "start", produced_at=now_ms()), None)]
    )
    wait_for(lambda: run_statuses(pg, [run_id])[run_id] == "running", 60, "the run to tick")

    wait_for(
        lambda: 'ductor_ticks_total{ductor_outcome="committed"' in scrape(port), 30, "the scrape"
    )
    text = scrape(port)
    assert "ductor_conflicts_total" in text
    assert "ductor_commit_duration_milliseconds_bucket" in text or "ductor_commit_duration" in text
    assert run_id not in text  # never a run id as a label
    assert child.terminate() == 0


def test_each_step_execution_is_a_span_between_the_ticks_of_its_trace(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The worker's span of a step execution is the child of the tick that dispatched it and
    the parent of (or a link of) the tick its result wakes: the trace follows the run through
    its steps. A failed attempt (the sample's flaky step fails twice) is an error on its
    span."""
    exporter = InMemorySpanExporter()
    telemetry = Telemetry.in_memory(exporter)
    run_id = f"traced-{uuid.uuid4().hex[:6]}"
    _start_one(settings, pg, run_id)
    processor_thread(settings, telemetry)
    worker = WorkerThread(settings, telemetry=telemetry)
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    try:
        produce_wakeups(settings, [(topic, Wakeup(run_id, "start", produced_at=now_ms()), None)])
        wait_for(lambda: run_statuses(pg, [run_id])[run_id] == "succeeded", 60, "the run")
    finally:
        worker.stop()
    spans = exporter.get_finished_spans()
    steps = [s for s in spans if _attr(s, "ductor.step_type") is not None]
    ticks = {s.context.span_id: s for s in spans if _attr(s, "ductor.step_type") is None}
    # fetch, transform (three attempts), enrich, publish
    assert sorted((_attr(s, "ductor.node"), _attr(s, "ductor.attempt")) for s in steps) == [
        ("enrich", 1),
        ("fetch", 1),
        ("publish", 1),
        ("transform", 1),
        ("transform", 2),
        ("transform", 3),
    ]
    for step in steps:
        assert step.parent is not None and step.parent.span_id in ticks, step.name
        # The tick its result woke: its child, or linked to it when the tick took several
        # wakeups at once (publish waits for two steps).
        woken = [
            t
            for t in ticks.values()
            if (t.parent and t.parent.span_id == step.context.span_id)
            or any(link.context.span_id == step.context.span_id for link in t.links)
        ]
        assert woken, f"no tick follows {step.name}"
    failed = [s for s in steps if s.status.status_code is StatusCode.ERROR]
    assert sorted(_attr(s, "ductor.attempt") for s in failed) == [1, 2]
