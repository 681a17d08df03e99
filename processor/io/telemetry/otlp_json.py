"""Spans exported as OTLP/HTTP with the JSON encoding (``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``
or ``OTEL_EXPORTER_OTLP_PROTOCOL`` = ``http/json``), encoded by orjson.

The SDK's OTLP exporter speaks only protobuf, and builds its messages in Python: on a busy
instance that encoding was the largest cost of tracing (docs/performance.md). The JSON form is
the same data under the protobuf JSON mapping the OTLP specification defines (ids as hex
strings, 64-bit integers as decimal strings, enums as numbers); collectors accept it on the
same ``/v1/traces`` path.

The transport, and the standard variables it reads, are io/telemetry/otlp_http.py's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from processor.io.telemetry.otlp_http import SPAN_KINDS, OtlpHttpSpanExporter

_STATUS = {StatusCode.UNSET: 0, StatusCode.OK: 1, StatusCode.ERROR: 2}


class OtlpJsonSpanExporter(OtlpHttpSpanExporter):
    """Each batch of spans as one OTLP/JSON document."""

    content_type = "application/json"

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        return orjson.dumps(encode(spans))


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
        "kind": SPAN_KINDS.get(span.kind, 0),
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
