"""The protobuf span encoder (io/telemetry/otlp_proto.py) writes the bytes the SDK's encoder
writes."""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as sdk_encode
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState

from processor.io.telemetry.light_spans import LightTracer
from processor.io.telemetry.otlp_proto import encode_spans
from processor.io.telemetry.sampling import RatioSampling

scalars = st.one_of(
    st.text(max_size=6),
    st.booleans(),
    st.integers(-(2**64), 2**64),  # past an int64 both leave the attribute out
    st.floats(allow_nan=False),
    st.binary(max_size=4),
    st.none(),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=2)
    ),
    max_leaves=6,
)
attributes = st.dictionaries(st.text(max_size=5), values, max_size=4)


def _trace_state(pairs: list[tuple[str, str]]) -> TraceState:
    return TraceState([(k, v) for k, v in pairs])


span_shapes = st.fixed_dictionaries(
    {
        "name": st.text(max_size=8),
        "kind": st.sampled_from(list(SpanKind)),
        "attributes": attributes,
        "events": st.lists(st.tuples(st.text(max_size=5), attributes), max_size=3),
        "links": st.lists(
            st.tuples(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.booleans()),
            max_size=2,
        ),
        "status": st.sampled_from(list(StatusCode)),
        "description": st.text(max_size=4),
        "parent": st.one_of(
            st.none(), st.tuples(st.integers(1, 2**64 - 1), st.booleans(), st.booleans())
        ),
        "times": st.tuples(st.integers(0, 2**64 - 2), st.integers(0, 2**64 - 2)),
    }
)


def _make(tracer: trace.Tracer, shape: dict[str, Any]) -> None:
    context = None
    if shape["parent"] is not None:
        span_id, remote, with_state = shape["parent"]
        state = _trace_state([("ductor", "a1"), ("other", "b2")]) if with_state else None
        upstream = SpanContext(3, span_id, remote, TraceFlags(1), state)
        context = trace.set_span_in_context(trace.NonRecordingSpan(upstream))
    links = [Link(SpanContext(t, s, r, TraceFlags(1)), {"n": 1}) for t, s, r in shape["links"]]
    start, end = shape["times"]
    span = tracer.start_span(
        shape["name"], context, shape["kind"], shape["attributes"], links, start_time=start
    )
    for name, event_attributes in shape["events"]:
        span.add_event(name, event_attributes, timestamp=start)
    span.set_status(shape["status"], shape["description"] or None)
    span.end(end_time=end)


def _spans(shapes: list[dict[str, Any]], light: bool, limits: SpanLimits) -> list[ReadableSpan]:
    exporter = InMemorySpanExporter()
    resources = [Resource.create({"service.name": "a"}), Resource.create({"service.name": "b"})]
    spans: list[ReadableSpan] = []
    for i, shape in enumerate(shapes):
        resource, scope = resources[i % 2], InstrumentationScope(f"scope-{i % 3}", "1.0")
        if light:
            tracer: trace.Tracer = LightTracer(
                RatioSampling(1.0), [SimpleSpanProcessor(exporter)], resource, scope, limits
            )
        else:
            provider = TracerProvider(resource=resource, span_limits=limits)
            provider.add_span_processor(SimpleSpanProcessor(exporter))
            tracer = provider.get_tracer(scope.name, scope.version)
        _make(tracer, shape)
    spans.extend(exporter.get_finished_spans())
    return spans


@settings(max_examples=300, deadline=None)
@given(
    shapes=st.lists(span_shapes, min_size=1, max_size=4),
    light=st.booleans(),
    limits=st.builds(  # small ones too: the dropped counts are fields of their own
        SpanLimits,
        max_span_attributes=st.sampled_from([128, 1]),
        max_events=st.sampled_from([128, 1]),
        max_event_attributes=st.sampled_from([128, 1]),
        max_links=st.sampled_from([128, 1]),
        max_link_attributes=st.sampled_from([128, 0]),
    ),
)
def test_the_bytes_are_the_sdk_encoders(
    shapes: list[dict[str, Any]], light: bool, limits: SpanLimits
) -> None:
    spans = _spans(shapes, light, limits)
    assert encode_spans(spans) == sdk_encode(spans).SerializeToString()


def test_odd_values_encode_as_the_sdk_encodes_them() -> None:
    odd: dict[str, Any] = {
        "nan": math.nan,
        "inf": -math.inf,
        "empty": "",
        "": "an empty key",
        "big": 2**63,  # left out by both, with an error logged
        "low": -(2**63),
        "tuple": (1, 2),
        "nested": {"a": [None, b"x", {"b": True}]},
        "ünïcode": "värde",
    }
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "odd"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    span = provider.get_tracer("t").start_span("odd", attributes=odd)
    span.add_event("e", odd)
    span.end()
    spans = exporter.get_finished_spans()
    assert encode_spans(spans) == sdk_encode(spans).SerializeToString()
