"""Trace context on the wire and spans' ends, shared by the processor and the worker: the
W3C ``traceparent`` headers a record carries (read without a propagator when they are the
canonical one), the links a wakeup carries for the executions it stands for, a span's ids as
log fields, and the two ways a span ends (an expected outcome, or a genuine failure)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from processor.io.telemetry.light_spans import LightSpan
from processor.io.telemetry.sampling import CarriedSpan, parse_traceparent, trace_headers

Headers = list[tuple[str, bytes]]
_PROPAGATOR = TraceContextTextMapPropagator()

# A wakeup that stands for several step executions (a worker's results recorded together)
# carries the first one's context as its ``traceparent`` and each other's in a header of this
# name; the tick it wakes links to them.
LINK_HEADER = "ductor-link"


def link_headers(others: Iterable[Headers]) -> Headers:
    """``LINK_HEADER`` headers for the ``traceparent`` of each of ``others``."""
    return [
        (LINK_HEADER, value) for headers in others for key, value in headers if key == "traceparent"
    ]


def carried_links(records: Sequence[tuple[str, int, int, bytes | None, Headers]]) -> list[Link]:
    """The contexts the records carry in ``LINK_HEADER`` headers, as links."""
    links: list[Link] = []
    for *_rest, headers in records:
        for key, value in headers:
            if key == LINK_HEADER:
                carrier = {"traceparent": value.decode(errors="replace")}
                context = trace.get_current_span(_PROPAGATOR.extract(carrier)).get_span_context()
                if context.is_valid:
                    links.append(Link(context))
    return links


def context_headers(span: Span) -> Headers:
    """The W3C trace-context headers of ``span`` without going through a propagator (for
    spans that record nothing: a trace not sampled still passes its decision on), written
    once per span where the span keeps them. Shared: not to be changed by the caller."""
    # By the exact type, not isinstance: compiled (mypyc), LightSpan shares the isinstance
    # cache of its ABC base, Span, and every span once checked against Span passed for it.
    if type(span) is LightSpan or type(span) is CarriedSpan:
        return span.headers()
    return trace_headers(span.get_span_context())


def extract_context(headers: Headers) -> Context:
    """The producer's context in ``headers``: read here when it is one canonical
    ``traceparent`` and nothing else, by the propagator otherwise (the same context)."""
    traceparent: bytes | None = None
    for key, value in headers:
        if key == "traceparent" and traceparent is None:
            traceparent = value
        elif key in ("traceparent", "tracestate"):
            traceparent = None
            break
    parsed = None if traceparent is None else parse_traceparent(traceparent)
    if parsed is not None:
        trace_id, span_id, flags = parsed
        remote = SpanContext(trace_id, span_id, True, TraceFlags(flags))
        return trace.set_span_in_context(NonRecordingSpan(remote))
    carrier = {
        k: v.decode(errors="replace") for k, v in headers if k in ("traceparent", "tracestate")
    }
    return _PROPAGATOR.extract(carrier)


def log_ids(span: Span | None) -> dict[str, str]:
    """The trace and span ids of ``span`` as log fields (empty when not tracing)."""
    if span is None:
        return {}
    context = span.get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": f"{context.trace_id:032x}", "span_id": f"{context.span_id:016x}"}


def end_ok(span: Span | None, outcome: str, **attributes: Any) -> None:
    """An expected outcome: ``ductor.outcome`` and the attributes given, the status unset."""
    if span is None:
        return
    if not span.is_recording():
        span.end()
        return
    span.set_attribute("ductor.outcome", outcome)
    for key, value in attributes.items():
        span.set_attribute(f"ductor.{key}", value)
    span.end()


def end_error(span: Span | None, exc: BaseException) -> None:
    """A genuine failure: status ERROR, error.type, the exception recorded."""
    if span is None:
        return
    span.set_attribute("ductor.outcome", "error")
    span.set_attribute("error.type", type(exc).__qualname__)
    span.record_exception(exc)
    span.set_status(Status(StatusCode.ERROR, str(exc)[:200]))
    span.end()


def now_ns() -> int:
    return time.time_ns()
