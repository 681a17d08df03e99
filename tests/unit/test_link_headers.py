"""A worker's wakeup for several step executions recorded together carries the first one's
context as its parent and the others' in ``ductor-link`` headers: the tick it wakes is the
child of the first and links to every other (io/telemetry/setup.py)."""

from __future__ import annotations

from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from processor.io.telemetry.setup import Telemetry
from processor.io.telemetry.spans import context_headers, link_headers


def test_the_tick_of_a_wakeup_for_three_executions_follows_all_three() -> None:
    telemetry = Telemetry.in_memory(InMemorySpanExporter())
    executions = [telemetry.tracer.start_span(f"step {i}") for i in range(3)]
    contexts = [context_headers(span) for span in executions]
    headers = [*contexts[0], *link_headers(contexts[1:])]
    record = ("wakeups", 0, 7, b"run-1", headers)
    tick = telemetry.start_consumer_span("wakeups", [record], "run-1")
    parent = tick.parent  # type: ignore[attr-defined]
    assert parent is not None and parent.span_id == executions[0].get_span_context().span_id
    linked = {link.context.span_id for link in tick.links}  # type: ignore[attr-defined]
    assert linked == {span.get_span_context().span_id for span in executions[1:]}


def test_headers_without_a_traceparent_add_no_link() -> None:
    assert link_headers([[("tracestate", b"x=1")], []]) == []
