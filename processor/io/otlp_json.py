"""Spans exported as OTLP/HTTP with the JSON encoding (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``
or ``OTEL_EXPORTER_OTLP_PROTOCOL`` = ``http/json``), encoded by orjson.

The SDK's OTLP exporter speaks only protobuf, and builds its messages in Python: on a busy
instance that encoding was the largest cost of tracing (docs/performance.md). The JSON form is
the same data under the protobuf JSON mapping the OTLP specification defines (ids as hex
strings, 64-bit integers as decimal strings, enums as numbers); collectors accept it on the
same ``/v1/traces`` path.

It reads the standard variables as the SDK's exporters do: the endpoint, the headers, the
timeout (in seconds, as the Python SDK reads it), the compression (gzip or deflate) and, for
an https endpoint, the CA certificate and the client's certificate and key.
"""

from __future__ import annotations

import gzip
import logging
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

log = logging.getLogger("ductor.telemetry")

_KINDS = {
    SpanKind.INTERNAL: 1,
    SpanKind.SERVER: 2,
    SpanKind.CLIENT: 3,
    SpanKind.PRODUCER: 4,
    SpanKind.CONSUMER: 5,
}
_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


class OtlpJsonSpanExporter(SpanExporter):
    """POSTs each batch of spans as one OTLP/JSON document; a failed export is logged and
    dropped (as the SDK's exporter does once its retries are spent)."""

    def __init__(
        self,
        endpoint: str | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.endpoint = endpoint or _endpoint_from_environment()
        self.headers = {
            **(_headers_from_environment() if headers is None else dict(headers)),
            "Content-Type": "application/json",
        }
        timeout = _traces_variable("TIMEOUT")
        self.timeout_s = timeout_s if timeout_s is not None else float(timeout or 10)
        self.compression = (_traces_variable("COMPRESSION") or "none").lower()
        if self.compression != "none":
            self.headers["Content-Encoding"] = self.compression
        self._context = _tls_context()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        body = orjson.dumps(encode(spans))
        if self.compression == "gzip":
            body = gzip.compress(body)
        elif self.compression == "deflate":
            body = zlib.compress(body)
        request = urllib.request.Request(self.endpoint, body, self.headers, method="POST")
        try:
            with urllib.request.urlopen(
                request, timeout=self.timeout_s, context=self._context
            ) as response:
                response.read()
        except (urllib.error.URLError, OSError) as exc:
            log.warning("could not export %d span(s) to %s: %s", len(spans), self.endpoint, exc)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def encode(spans: Sequence[ReadableSpan]) -> dict[str, Any]:
    """The OTLP/JSON ``ExportTraceServiceRequest`` of ``spans``, grouped by resource and scope."""
    by_resource: dict[int, tuple[Any, dict[tuple[str, str | None], list[dict[str, Any]]]]] = {}
    for span in spans:
        resource = span.resource
        _, scopes = by_resource.setdefault(id(resource), (resource, {}))
        scope = span.instrumentation_scope
        key = (scope.name, scope.version) if scope is not None else ("", None)
        scopes.setdefault(key, []).append(_span(span))
    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _attributes(resource.attributes)},
                "scopeSpans": [
                    {
                        "scope": {"name": name, **({"version": version} if version else {})},
                        "spans": encoded,
                    }
                    for (name, version), encoded in scopes.items()
                ],
            }
            for resource, scopes in by_resource.values()
        ]
    }


def _span(span: ReadableSpan) -> dict[str, Any]:
    """One span, as the protobuf JSON mapping writes it: fields at their default value (empty
    lists, status UNSET) are left out."""
    context = span.context
    assert context is not None
    out: dict[str, Any] = {
        "traceId": f"{context.trace_id:032x}",
        "spanId": f"{context.span_id:016x}",
        "name": span.name,
        "kind": _KINDS.get(span.kind, 0),
        "startTimeUnixNano": str(span.start_time or 0),
        "endTimeUnixNano": str(span.end_time or 0),
        "flags": _flags(span.parent is not None and span.parent.is_remote),
    }
    if span.parent is not None:
        out["parentSpanId"] = f"{span.parent.span_id:016x}"
    if span.attributes:
        out["attributes"] = _attributes(span.attributes)
    status: dict[str, Any] = {}
    if span.status.status_code is not StatusCode.UNSET:
        status["code"] = _STATUS[span.status.status_code]
    if span.status.description:
        status["message"] = span.status.description
    out["status"] = status
    if span.events:
        out["events"] = [
            {
                "timeUnixNano": str(event.timestamp),
                "name": event.name,
                **({"attributes": _attributes(event.attributes)} if event.attributes else {}),
            }
            for event in span.events
        ]
    if span.links:
        out["links"] = [
            {
                "traceId": f"{link.context.trace_id:032x}",
                "spanId": f"{link.context.span_id:016x}",
                **({"attributes": _attributes(link.attributes)} if link.attributes else {}),
                "flags": _flags(link.context.is_remote),
            }
            for link in span.links
        ]
    return out


def _flags(remote: bool) -> int:
    """The span's flags field: the "is remote" bit is known (0x100), and set if so (0x200)."""
    return 0x100 | (0x200 if remote else 0)


def _attributes(attributes: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for key, value in (attributes or {}).items():
        # The scalar types by identity first: most values are, and this is the encoder's loop.
        kind = type(value)
        if kind is str:
            out.append({"key": key, "value": {"stringValue": value}})
        elif kind is int:
            out.append({"key": key, "value": {"intValue": str(value)}})
        else:
            out.append({"key": key, "value": _value(value)})
    return out


def _value(value: Any) -> dict[str, Any]:
    # bool before int: a bool is an int in Python.
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    if isinstance(value, str):
        return {"stringValue": value}
    if isinstance(value, list | tuple):
        return {"arrayValue": {"values": [_value(v) for v in value]}}
    return {"stringValue": str(value)}


def _endpoint_from_environment() -> str:
    traces = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if traces:
        return traces  # used as it is (the specification's rule for per-signal endpoints)
    base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "http://localhost:4318")
    return base.rstrip("/") + "/v1/traces"


def _traces_variable(name: str) -> str:
    """OTEL_EXPORTER_OTLP_TRACES_<NAME>, else OTEL_EXPORTER_OTLP_<NAME> (stripped; "" if unset)."""
    return (
        os.environ.get(f"OTEL_EXPORTER_OTLP_TRACES_{name}")
        or os.environ.get(f"OTEL_EXPORTER_OTLP_{name}")
        or ""
    ).strip()


def _tls_context() -> ssl.SSLContext | None:
    """The TLS context the certificate variables ask for (None: Python's default)."""
    ca = _traces_variable("CERTIFICATE")
    cert = _traces_variable("CLIENT_CERTIFICATE")
    key = _traces_variable("CLIENT_KEY")
    if not (ca or cert):
        return None
    context = ssl.create_default_context(cafile=ca or None)
    if cert:
        context.load_cert_chain(cert, key or None)
    return context


def _headers_from_environment() -> dict[str, str]:
    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_HEADERS") or os.environ.get(
        "OTEL_EXPORTER_OTLP_HEADERS", ""
    )
    headers: dict[str, str] = {}
    for pair in raw.split(","):
        name, sep, value = pair.partition("=")
        if sep and name.strip():
            headers[urllib.parse.unquote(name.strip())] = urllib.parse.unquote(value.strip())
    return headers
