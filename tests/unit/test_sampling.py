"""The ratio sampler's shortcut decides exactly what the SDK's sampler decides."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from processor.io.telemetry.sampling import RatioSampling, parse_traceparent
from processor.io.telemetry.setup import Telemetry
from processor.io.telemetry.spans import context_headers

_PROPAGATOR = TraceContextTextMapPropagator()
TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"


def sdk_decision(
    ratio: float, headers: list[tuple[str, bytes]], parent_based: bool = True
) -> trace.Span:
    """What the SDK alone makes of a record with these headers."""
    carrier = {k: v.decode() for k, v in headers}
    root = TraceIdRatioBased(ratio)
    provider = TracerProvider(sampler=ParentBased(root) if parent_based else root)
    return provider.get_tracer("t").start_span("p", context=_PROPAGATOR.extract(carrier))


def test_the_canonical_traceparent_is_read_and_anything_else_is_left_to_the_sdk() -> None:
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-01".encode()) == (int(TRACE, 16), int(SPAN, 16), 1)
    assert parse_traceparent(f"00-{TRACE}-{SPAN}-00".encode()) == (int(TRACE, 16), int(SPAN, 16), 0)
    for odd in (
        f"00-{TRACE.upper()}-{SPAN}-00",  # the propagator rejects upper case hex
        f"01-{TRACE}-{SPAN}-00",  # another version: the propagator's own rules apply
        f"00-{'0' * 32}-{SPAN}-00",  # invalid trace id
        f"00-{TRACE}-{'0' * 16}-00",  # invalid span id
        f"00-{TRACE}-{SPAN}-0",
        f"00-{TRACE}-{SPAN}-00-extra",
        f"00_{TRACE}-{SPAN}-00",
        f"00-{TRACE[:-1]}g-{SPAN}-00",
    ):
        assert parse_traceparent(odd.encode()) is None, odd


def test_an_unsampled_parent_is_carried_on_without_an_sdk_span() -> None:
    sampling = RatioSampling(0.5)
    span = sampling.unsampled([("traceparent", f"00-{TRACE}-{SPAN}-00".encode())])
    assert span is not None and not span.is_recording()
    context = span.get_span_context()
    assert context.trace_id == int(TRACE, 16) and context.span_id != int(SPAN, 16)
    assert context_headers(span)[0][1].endswith(b"-00")  # passed on as not sampled
    assert sampling.unsampled([("traceparent", f"00-{TRACE}-{SPAN}-01".encode())]) is None
    with_state = [("traceparent", f"00-{TRACE}-{SPAN}-00".encode()), ("tracestate", b"a=b")]
    assert sampling.unsampled(with_state) is None  # the SDK keeps the trace state


@given(
    ratio=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    parent=st.one_of(
        st.none(),
        st.tuples(st.integers(1, 2**128 - 1), st.integers(1, 2**64 - 1), st.integers(0, 255)),
    ),
    seed=st.integers(0, 2**32),
    parent_based=st.booleans(),
)
def test_the_shortcut_agrees_with_the_sdk_sampler(
    ratio: float, parent: tuple[int, int, int] | None, seed: int, parent_based: bool
) -> None:
    headers = []
    if parent is not None:
        trace_id, span_id, flags = parent
        headers = [("traceparent", f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}".encode())]
    random.seed(seed)
    telemetry = Telemetry.build(
        None,
        [SimpleSpanProcessor(InMemorySpanExporter())],
        [],
        "g",
        RatioSampling(ratio, parent_based),
    )
    span = telemetry.start_consumer_span("topic", [("topic", 0, 1, None, headers)], "r")
    context = span.get_span_context()
    if parent is None:
        # A root: the ratio rule of the SDK's sampler, on the trace id the span has.
        root = TraceIdRatioBased(ratio).should_sample(None, context.trace_id, "p")
        assert span.is_recording() == root.decision.is_sampled()  # type: ignore[no-untyped-call]
        sdk_root = TracerProvider(sampler=ALWAYS_OFF).get_tracer("t").start_span("p")
        if not span.is_recording():
            assert context.trace_flags == sdk_root.get_span_context().trace_flags
    else:
        expected = sdk_decision(ratio, headers, parent_based)
        assert span.is_recording() == expected.is_recording()
        assert context.trace_id == expected.get_span_context().trace_id
        assert context.trace_flags == expected.get_span_context().trace_flags
    telemetry.shutdown()


def test_a_root_the_ratio_samples_keeps_the_trace_id_it_was_tested_on() -> None:
    """The shortcut draws the id, the SDK starts the sampled span on that same id, so one in
    ``ratio`` roots is sampled, not one in ratio²."""
    exporter = InMemorySpanExporter()
    telemetry = Telemetry.build(None, [SimpleSpanProcessor(exporter)], [], "g", RatioSampling(0.1))
    spans = [telemetry.start_consumer_span("t", [("t", 0, i, None, [])], "r") for i in range(4000)]
    sampled = [s for s in spans if s.is_recording()]
    assert 250 <= len(sampled) <= 550  # 400 expected; ratio² would give ~40
    bound = TraceIdRatioBased.get_bound_for_rate(0.1)
    for span in spans:
        low_bits = span.get_span_context().trace_id & TraceIdRatioBased.TRACE_ID_LIMIT
        assert span.is_recording() == (low_bits < bound)
    telemetry.shutdown()
