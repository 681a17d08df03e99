"""Light spans (io/telemetry/light_spans.py) export what the SDK's spans export: the same operations
on a light span and on an SDK span, under the same limits, encode to the same OTLP message but
for the ids and clocks each draws."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, StatusCode, TraceFlags

from processor.io.telemetry.light_spans import LightEvent, LightSpan, LightTracer
from processor.io.telemetry.sampling import RatioSampling
from processor.io.telemetry.setup import Telemetry
from processor.io.telemetry.spans import end_error, end_ok

RESOURCE = Resource.create({"service.name": "ductor-test"})
SCOPE = "ductor.processor"

keys = st.sampled_from(["a", "b", "c", "d", "e", "ductor.run_id", "messaging.system"])
scalars = st.one_of(
    st.text(max_size=12), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(-1e9, 1e9)
)
values = st.one_of(
    scalars,
    st.lists(st.integers(0, 9), max_size=3),
    st.lists(st.text(max_size=3), max_size=3),
    st.just({"not": "allowed"}),  # dropped with a warning by both
    st.just([1, "mixed"]),  # likewise
)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("set_attribute"), keys, values),
        st.tuples(st.just("set_attributes"), st.dictionaries(keys, values, max_size=4)),
        st.tuples(st.just("add_event"), keys, st.dictionaries(keys, values, max_size=4)),
        st.tuples(st.just("set_status"), st.sampled_from(list(StatusCode)), st.text(max_size=5)),
        st.tuples(st.just("record_exception"), st.text(max_size=8)),
        st.tuples(st.just("update_name"), st.text(min_size=1, max_size=8)),
        st.tuples(st.just("add_link"), st.integers(1, 2**64 - 1)),
    ),
    max_size=14,
)
limits = st.builds(
    SpanLimits,
    max_span_attributes=st.sampled_from([128, 3]),
    max_events=st.sampled_from([128, 2]),
    max_event_attributes=st.sampled_from([128, 2]),
    max_links=st.sampled_from([128, 1]),
    max_attribute_length=st.sampled_from([None, 4]),
    max_span_attribute_length=st.sampled_from([None, 3]),
)
parents = st.one_of(
    st.none(), st.tuples(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.booleans())
)


def _apply(span: trace.Span, ops: list[tuple[Any, ...]], stamp: int) -> None:
    """``ops`` on ``span``, each event and exception at a fixed time (the clocks differ)."""
    for op, *args in ops:
        if op == "set_attribute":
            span.set_attribute(args[0], args[1])
        elif op == "set_attributes":
            span.set_attributes(args[0])
        elif op == "add_event":
            span.add_event(args[0], args[1], timestamp=stamp)
        elif op == "set_status":
            span.set_status(args[0], args[1] if args[0] is StatusCode.ERROR else None)
        elif op == "record_exception":
            span.record_exception(ValueError(args[0]), timestamp=stamp)
        elif op == "update_name":
            span.update_name(args[0])
        else:
            span.add_link(SpanContext(7, args[0], True, TraceFlags(1)), {"k": 1})
    span.end(end_time=stamp + 1)
    span.set_attribute("after", "the end")  # ignored by both


def _without_ids(message: Any) -> Any:
    for resource_spans in message.resource_spans:
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                span.span_id = b""
                if span.trace_id and span.parent_span_id == b"":
                    span.trace_id = b""  # a root: each tracer draws its own
    return message


@settings(max_examples=300, deadline=None)
@given(ops=operations, limits=limits, parent=parents, kind=st.sampled_from(list(SpanKind)))
def test_a_light_span_exports_what_the_sdk_span_exports(
    ops: list[tuple[Any, ...]],
    limits: SpanLimits,
    parent: tuple[int, int, bool] | None,
    kind: SpanKind,
) -> None:
    context = None
    if parent is not None:
        trace_id, span_id, remote = parent
        upstream = SpanContext(trace_id, span_id, remote, TraceFlags(TraceFlags.SAMPLED))
        context = trace.set_span_in_context(trace.NonRecordingSpan(upstream))
    sampling = RatioSampling(1.0)
    sdk_spans, light_spans = InMemorySpanExporter(), InMemorySpanExporter()
    provider = TracerProvider(resource=RESOURCE, sampler=sampling.sampler, span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(sdk_spans))
    sdk = provider.get_tracer(SCOPE)
    light = LightTracer(
        sampling,
        [SimpleSpanProcessor(light_spans)],
        RESOURCE,
        InstrumentationScope(SCOPE),
        limits,
    )
    for tracer in (sdk, light):
        span = tracer.start_span(
            "process t",
            context=context,
            kind=kind,
            attributes={"a": "start", "n": 3},
            links=[Link(SpanContext(9, 9, True, TraceFlags(1)), {"why": "carried"})],
            start_time=1_000,
        )
        _apply(span, ops, 2_000)
    [sdk_span], [light_span] = sdk_spans.get_finished_spans(), light_spans.get_finished_spans()
    assert light_span.context.trace_flags == sdk_span.context.trace_flags
    assert light_span.context.trace_state == sdk_span.context.trace_state
    assert _without_ids(encode_spans([light_span])) == _without_ids(encode_spans([sdk_span]))
    provider.shutdown()


def test_not_sampled_spans_carry_the_decision_on_and_record_nothing() -> None:
    exporter = InMemorySpanExporter()
    telemetry = Telemetry.build(
        RESOURCE, [SimpleSpanProcessor(exporter)], [], "g", RatioSampling(0.0)
    )
    random.seed(3)
    span = telemetry.tracer.start_span("root")
    assert not span.is_recording()
    assert span.get_span_context().is_valid
    assert span.get_span_context().trace_flags == TraceFlags(TraceFlags.RANDOM_TRACE_ID)
    child = telemetry.tracer.start_span("child", context=trace.set_span_in_context(span))
    assert not child.is_recording()
    assert child.get_span_context().trace_id == span.get_span_context().trace_id
    end_ok(child, "done")
    end_error(span, RuntimeError("x"))
    assert exporter.get_finished_spans() == ()


def test_a_step_span_made_current_is_the_parent_of_a_span_the_users_code_starts() -> None:
    """A step function that traces with its own SDK tracer finds the execution's light span
    as its parent (the worker attaches it while the step runs)."""
    ours = InMemorySpanExporter()
    telemetry = Telemetry.in_memory(ours)
    theirs = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(theirs))
    with telemetry.tracer.start_as_current_span("step s0") as step:
        provider.get_tracer("users").start_span("charge the card").end()
    [users] = theirs.get_finished_spans()
    assert users.parent is not None
    assert users.parent.span_id == step.get_span_context().span_id
    assert [s.name for s in ours.get_finished_spans()] == ["step s0"]


def test_a_change_racing_the_end_does_not_reach_what_the_exporter_reads() -> None:
    """A thread that passed the "not ended" check before the span ended (a step abandoned at
    its deadline) changes the copies the span left behind, not what was exported."""
    exporter = InMemorySpanExporter()
    telemetry = Telemetry.in_memory(exporter)
    span = telemetry.tracer.start_span("step s0", attributes={"a": 1})
    assert type(span) is LightSpan
    attributes, events = span.attributes, span.events  # what a late writer holds
    span.end()
    attributes["late"] = "change"
    events.append(LightEvent("late", 1, {}))
    [exported] = exporter.get_finished_spans()
    assert dict(exported.attributes or {}) == {"a": 1} and not exported.events
