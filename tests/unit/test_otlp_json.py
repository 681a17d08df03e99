"""The OTLP/JSON span exporter: the same data as the SDK's protobuf encoder, under the JSON
mapping the OTLP specification defines, POSTed to /v1/traces."""

from __future__ import annotations

import base64
import gzip
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import orjson
import pytest
from google.protobuf.json_format import MessageToDict  # type: ignore[import-untyped]
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from processor.io.telemetry.otlp_json import OtlpJsonSpanExporter, encode


def _spans() -> list[ReadableSpan]:
    """A CONSUMER span with attributes of every type, events and a link, and an ERROR child."""
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "ductor-test"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("ductor.processor", "1.0")
    other = tracer.start_span("upstream")
    other.end()
    span = tracer.start_span(
        "process ductor.wakeup.t1",
        kind=SpanKind.CONSUMER,
        links=[Link(other.get_span_context(), {"why": "coalesced"})],
        attributes={"s": "x", "i": 2**40, "f": 1.5, "b": True, "l": ["a", "b"], "n": [1, 2]},
    )
    span.add_event("tick", {"ductor.attempt": 1, "ductor.tick_ms": 0.25})
    child = tracer.start_span("commit", context=trace.set_span_in_context(span))
    child.set_status(Status(StatusCode.ERROR, "database unreachable"))
    child.end()
    span.end()
    return list(memory.get_finished_spans())


def _hex_ids_to_base64(value: Any) -> Any:
    """The protobuf JSON mapping writes bytes as base64; OTLP/JSON writes ids as hex."""
    if isinstance(value, dict):
        return {
            k: base64.b64encode(bytes.fromhex(v)).decode()
            if k in ("traceId", "spanId", "parentSpanId")
            else _hex_ids_to_base64(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_hex_ids_to_base64(v) for v in value]
    return value


def test_the_json_is_the_protobuf_encoders_data_under_the_otlp_json_mapping() -> None:
    spans = _spans()
    expected = MessageToDict(encode_spans(spans), use_integers_for_enums=True)
    ours = _hex_ids_to_base64(orjson.loads(orjson.dumps(encode(spans))))
    assert ours == expected


@pytest.fixture
def collector() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes]]]]:
    received: list[tuple[dict[str, str], bytes]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            received.append(({k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}", received
    server.shutdown()


def test_spans_are_posted_as_json_to_v1_traces_with_the_configured_headers(
    collector: tuple[str, list[tuple[dict[str, str], bytes]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", base + "/")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "api-key=s%3Dcret,x-tenant=ductor")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", raising=False)
    exporter = OtlpJsonSpanExporter()
    assert exporter.endpoint == base + "/v1/traces"
    assert exporter.export(_spans()) is SpanExportResult.SUCCESS
    ((headers, body),) = received
    assert headers["content-type"] == "application/json"
    assert headers["api-key"] == "s=cret" and headers["x-tenant"] == "ductor"
    names = [s["name"] for s in orjson.loads(body)["resourceSpans"][0]["scopeSpans"][0]["spans"]]
    assert sorted(names) == ["commit", "process ductor.wakeup.t1", "upstream"]


def test_an_unreachable_collector_fails_the_export_without_raising() -> None:
    exporter = OtlpJsonSpanExporter(endpoint="http://127.0.0.1:9/v1/traces", timeout_s=2)
    assert exporter.export(_spans()) is SpanExportResult.FAILURE


def test_the_json_exporter_compresses_and_reads_its_timeout_in_seconds_as_the_sdk_does(
    collector: tuple[str, list[tuple[dict[str, str], bytes]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    base, received = collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", base + "/v1/traces")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "7")
    exporter = OtlpJsonSpanExporter()
    assert exporter.timeout_s == 7.0  # seconds, as the SDK's exporters read it (not 7 ms)
    assert exporter.export(_spans()) is SpanExportResult.SUCCESS
    ((headers, body),) = received
    assert headers["content-encoding"] == "gzip"
    assert (
        len(orjson.loads(gzip.decompress(body))["resourceSpans"][0]["scopeSpans"][0]["spans"]) == 3
    )
