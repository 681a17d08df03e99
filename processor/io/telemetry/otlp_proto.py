"""Spans encoded as the OTLP protobuf ``ExportTraceServiceRequest``, written straight to bytes.

The SDK's OTLP exporter builds a protobuf message object for every span, attribute, value and
event, then serializes them: on a busy instance with every trace sampled that was most of
tracing's cost (docs/performance.md). This writes the same wire bytes field by field (the
protobuf encoding: a tag, then a varint, a fixed-width number or a length and the bytes),
in field-number order as the protobuf runtime writes them; tests/unit/test_otlp_proto.py
checks it against the SDK's encoder, byte for byte. What the SDK's encoder does, this does:
which fields it leaves out, the span flags it derives, a value it cannot encode logged and
left out with its key.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from processor.io.telemetry.otlp_http import SPAN_KINDS, OtlpHttpSpanExporter

log = logging.getLogger("ductor.telemetry")

_FIXED64 = struct.Struct("<Q").pack
_FIXED32 = struct.Struct("<I").pack
_DOUBLE = struct.Struct("<d").pack
_ONE_BYTE = [bytes((n,)) for n in range(0x80)]
_INT64 = range(-(2**63), 2**63)
_U64 = 2**64 - 1
# Span flags: "whether the context is remote is known" (0x100), and "it is" (0x200).
_LOCAL, _REMOTE = _FIXED32(0x100), _FIXED32(0x300)
_FIELDS: dict[tuple[Any, ...], bytes] = {}  # an attribute's field, by tag, key and value
_FIELDS_KEPT = 8192


def _varint(n: int) -> bytes:
    if n < 0x80:
        return _ONE_BYTE[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(tag: bytes, payload: bytes) -> bytes:
    return tag + _varint(len(payload)) + payload


def encode_spans(spans: Sequence[ReadableSpan]) -> bytes:
    """The serialized ``ExportTraceServiceRequest`` of ``spans``, grouped by resource and by
    instrumentation scope as the SDK groups them."""
    grouped: dict[Any, dict[Any, list[bytes]]] = {}
    for span in spans:
        scopes = grouped.setdefault(span.resource, {})
        scopes.setdefault(span.instrumentation_scope or None, []).append(_span(span))
    out = []
    for resource, scopes in grouped.items():
        parts = [_delimited(b"\x0a", _attributes(b"\x0a", resource.attributes))]
        for scope, encoded in scopes.items():
            body = [_delimited(b"\x0a", _scope(scope))]
            body += [b"\x12" + _varint(len(s)) + s for s in encoded]
            if scope is not None and scope.schema_url:
                body.append(_delimited(b"\x1a", scope.schema_url.encode()))
            parts.append(_delimited(b"\x12", b"".join(body)))
        if resource.schema_url:
            parts.append(_delimited(b"\x1a", resource.schema_url.encode()))
        out.append(_delimited(b"\x0a", b"".join(parts)))
    return b"".join(out)


def _scope(scope: Any) -> bytes:
    if scope is None:
        return b""
    parts = []
    if scope.name:
        parts.append(_delimited(b"\x0a", scope.name.encode()))
    if scope.version:
        parts.append(_delimited(b"\x12", scope.version.encode()))
    parts.append(_attributes(b"\x1a", scope.attributes))
    return b"".join(parts)


def _span(span: ReadableSpan) -> bytes:
    context = span.get_span_context()
    assert context is not None
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
    ]
    state = context.trace_state
    if state:
        parts.append(_delimited(b"\x1a", ",".join(f"{k}={v}" for k, v in state.items()).encode()))
    parent = span.parent
    if parent:
        parts += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
    if span.name:
        parts.append(_delimited(b"\x2a", span.name.encode()))
    parts += (b"\x30", _varint(SPAN_KINDS[span.kind]))
    if span.start_time:
        parts += (b"\x39", _FIXED64(span.start_time))
    if span.end_time:
        parts += (b"\x41", _FIXED64(span.end_time))
    parts.append(_attributes(b"\x4a", span.attributes))
    if span.dropped_attributes:
        parts += (b"\x50", _varint(span.dropped_attributes))
    _events_and_links(span, parts)
    parts.append(_delimited(b"\x7a", _status(span.status)))
    parts += (b"\x85\x01", _flags(parent))
    return b"".join(parts)


def _events_and_links(span: ReadableSpan, parts: list[bytes]) -> None:
    """A span's events and links (fields 11 to 14), appended to ``parts``."""
    for event in span.events:
        parts.append(_delimited(b"\x5a", _event(event)))
    if span.dropped_events:
        parts += (b"\x60", _varint(span.dropped_events))
    for link in span.links:
        parts.append(_delimited(b"\x6a", _link(link)))
    if span.dropped_links:
        parts += (b"\x70", _varint(span.dropped_links))


def _event(event: Any) -> bytes:
    parts: list[bytes] = []
    if event.timestamp:
        parts += (b"\x09", _FIXED64(event.timestamp))
    if event.name:
        parts.append(_delimited(b"\x12", event.name.encode()))
    parts.append(_attributes(b"\x1a", event.attributes))
    if event.dropped_attributes:
        parts += (b"\x20", _varint(event.dropped_attributes))
    return b"".join(parts)


def _link(link: Any) -> bytes:
    context = link.context
    parts = [
        b"\x0a\x10",
        context.trace_id.to_bytes(16, "big"),
        b"\x12\x08",
        context.span_id.to_bytes(8, "big"),
        _attributes(b"\x22", link.attributes),
    ]
    if link.dropped_attributes:
        parts += (b"\x28", _varint(link.dropped_attributes))
    parts += (b"\x35", _flags(context))
    return b"".join(parts)


def _status(status: Any) -> bytes:
    parts = []
    if status.description:
        parts.append(_delimited(b"\x12", status.description.encode()))
    code = status.status_code.value
    if code:
        parts += (b"\x18", _varint(code))
    return b"".join(parts)


def _flags(context: SpanContext | None) -> bytes:
    return _REMOTE if context and context.is_remote else _LOCAL


def _attributes(tag: bytes, attributes: Mapping[str, Any] | None) -> bytes:
    """Each attribute as a KeyValue field under ``tag``; one the SDK could not encode is logged
    and left out, as the SDK does."""
    if not attributes:
        return b""
    parts = []
    for key, value in attributes.items():
        # Most values are strings and integers, and many come again and again (a topic, a
        # group, an outcome): their whole field is kept once encoded.
        if isinstance(value, str):
            memo: tuple[Any, ...] = (tag, key, value)
        elif type(value) is int and value in _INT64:
            memo = (tag, key, value, int)  # another shape than a string's: never equal
        else:
            memo = ()
        field = _FIELDS.get(memo) if memo else None
        if field is None:
            try:
                any_value = _any(value)
            except (TypeError, ValueError, OverflowError) as exc:
                log.error("could not encode the attribute %s: %s", key, exc)
                continue
            name = _delimited(b"\x0a", key.encode()) if key else b""
            kv = name + b"\x12" + _varint(len(any_value)) + any_value
            field = tag + _varint(len(kv)) + kv
            if memo:
                if len(_FIELDS) >= _FIELDS_KEPT:
                    _FIELDS.clear()  # mostly one-off values (ids, offsets): start again
                _FIELDS[memo] = field
        parts.append(field)
    return b"".join(parts)


def _any(value: Any) -> bytes:
    """An AnyValue, by the SDK's rules and in its order of tests."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _delimited(b"\x0a", str.encode(value))
    if isinstance(value, int):
        if value not in _INT64:
            raise ValueError(f"{value} is out of an int64's range")
        return b"\x18" + _varint(int(value) & _U64)
    if isinstance(value, float):
        return b"\x21" + _DOUBLE(value)
    if isinstance(value, bytes):
        return _delimited(b"\x3a", value)
    if isinstance(value, Sequence):
        return _delimited(b"\x2a", b"".join(_delimited(b"\x0a", _any(v)) for v in value))
    if isinstance(value, Mapping):
        pairs = b"".join(
            _delimited(b"\x0a", _delimited(b"\x0a", str(k).encode()) + _delimited(b"\x12", _any(v)))
            for k, v in value.items()
        )
        return _delimited(b"\x32", pairs)
    raise TypeError(f"invalid type {type(value)} of value {value}")


class OtlpProtobufSpanExporter(OtlpHttpSpanExporter):
    """Each batch of spans as one OTLP protobuf request, encoded here (``encode_spans``)."""

    content_type = "application/x-protobuf"

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        return encode_spans(spans)
