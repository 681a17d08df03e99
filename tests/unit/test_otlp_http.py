"""The OTLP/HTTP transport both span encodings share (io/telemetry/otlp_http.py): the protobuf body
is the SDK's message, transient refusals are tried again within the timeout, others are not."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from processor.io.config.otel import Protocol
from processor.io.telemetry.exporters import span_exporter
from processor.io.telemetry.otlp_proto import OtlpProtobufSpanExporter

Collector = tuple[str, list[tuple[dict[str, str], bytes]], list[int]]


@pytest.fixture
def collector() -> Iterator[Collector]:
    """A collector answering each POST with the next status of its list (200 once empty)."""
    received: list[tuple[dict[str, str], bytes]] = []
    statuses: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(statuses.pop(0) if statuses else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1/traces", received, statuses
    server.shutdown()


def _spans() -> list[ReadableSpan]:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ductor-test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    span = provider.get_tracer("ductor.processor").start_span("tick", attributes={"n": 1})
    span.add_event("tick", {"ductor.attempt": 1})
    span.end()
    return list(memory.get_finished_spans())


def test_http_protobuf_is_encoded_here_and_read_by_the_sdks_message(
    collector: Collector, monkeypatch: pytest.MonkeyPatch
) -> None:
    endpoint, received, _ = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
    exporter = span_exporter(Protocol.HTTP_PROTOBUF)
    assert isinstance(exporter, OtlpProtobufSpanExporter)
    assert exporter.export(_spans()) is SpanExportResult.SUCCESS
    ((headers, body),) = received
    assert headers["content-type"] == "application/x-protobuf"
    request = ExportTraceServiceRequest.FromString(body)
    [span] = request.resource_spans[0].scope_spans[0].spans
    assert span.name == "tick" and span.events[0].name == "tick"


def test_a_transient_refusal_is_tried_again_and_a_permanent_one_is_not(
    collector: Collector,
) -> None:
    endpoint, received, statuses = collector
    exporter = OtlpProtobufSpanExporter(endpoint=endpoint, timeout_s=10)
    statuses[:] = [503, 429]
    assert exporter.export(_spans()) is SpanExportResult.SUCCESS
    assert len(received) == 3  # 503, then 429 (after 1 s), then 200 (after 2 s)
    received.clear()
    statuses[:] = [400]
    assert exporter.export(_spans()) is SpanExportResult.FAILURE
    assert len(received) == 1


def test_retries_stop_at_the_timeout_and_at_shutdown(collector: Collector) -> None:
    endpoint, received, statuses = collector
    exporter = OtlpProtobufSpanExporter(endpoint=endpoint, timeout_s=2.5)
    statuses[:] = [503] * 10
    started = time.monotonic()
    assert exporter.export(_spans()) is SpanExportResult.FAILURE
    assert len(received) == 2  # at 0 s and 1 s; the next (after 2 s more) is past the timeout
    assert time.monotonic() - started < 2.5
    received.clear()
    statuses[:] = [503] * 10
    exporter = OtlpProtobufSpanExporter(endpoint=endpoint, timeout_s=60)
    threading.Timer(0.3, exporter.shutdown).start()
    started = time.monotonic()
    assert exporter.export(_spans()) is SpanExportResult.FAILURE
    assert time.monotonic() - started < 5  # the 1 s wait cut short, not the 60 s timeout
