"""Spans of the standard samplers recorded as plain objects, handed to the span processors as
they are.

The SDK's span costs ~12 µs before any export, most of it machinery this process never uses:
a sampler object's decision, a lock per attribute set, a bounded mapping per attribute set and
per event, self-metrics, and a read-only copy of the whole span when it ends
(docs/performance.md). A sampled tick of the processor makes one span, with an event per
record it sends; every execution of a step makes one. ``LightTracer`` makes the same span,
under the same sampling decision (the standard samplers, io/telemetry/sampling.py), as one
small object whose fields carry the names ``ReadableSpan`` reads them by: the span processors
and exporters (the SDK's batch processor, its OTLP protobuf and gRPC exporters,
io/telemetry/otlp_json.py, the tests' in-memory exporter) take it as they would the SDK's copy. The
limits are the SDK's (``SpanLimits``, from the same OTEL_SPAN_* and OTEL_ATTRIBUTE_*
variables), and past one of them, or for a value to clean or cut, the span's attributes go
into the SDK's own bounded mapping: what is kept, cleaned and dropped is the SDK's.

Every sampler OTEL_TRACES_SAMPLER may name is one of these (io/config/otel.py); the SDK's
tracer remains for a sampler object wired in by hand (``Telemetry.build``).
"""

from __future__ import annotations

import random
import sys
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, SpanProcessor
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    INVALID_SPAN_ID,
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)
from opentelemetry.util.types import Attributes, AttributeValue

from processor.io.telemetry.sampling import Headers, RatioSampling, trace_headers

_UNSET = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags.SAMPLED
_RANDOM = TraceFlags.RANDOM_TRACE_ID
# What the SDK keeps as it is when no length limit applies (a subclass too: a StrEnum member).
_SCALARS = (str, bool, int, float)


class LightEvent:
    """A span event, readable as the SDK's ``Event`` is."""

    __slots__ = ("attributes", "name", "timestamp")

    def __init__(self, name: str, timestamp: int, attributes: Mapping[str, Any]) -> None:
        self.name = name
        self.timestamp = timestamp
        self.attributes = attributes

    @property
    def dropped_attributes(self) -> int:
        attributes = self.attributes
        return attributes.dropped if isinstance(attributes, BoundedAttributes) else 0


class LightTracer(trace.Tracer):
    """Makes ``LightSpan``s for the traces ``sampling`` samples, and bare span contexts for the
    others; the ended spans go to ``processors``."""

    def __init__(
        self,
        sampling: RatioSampling,
        processors: Sequence[SpanProcessor],
        resource: Resource,
        scope: InstrumentationScope,
        limits: SpanLimits | None = None,
    ) -> None:
        self.sampling = sampling
        self.sampler = sampling.sampler  # the SDK sampler whose decisions these are
        self.processors = tuple(processors)
        self.resource = resource
        self.scope = scope
        self.limits = limits or SpanLimits()

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        parent: SpanContext | None = trace.get_current_span(context).get_span_context()
        sampling = self.sampling
        if parent is not None and parent.is_valid:
            # The parent's trace, random-id flag and trace state; its decision if parent-based.
            trace_id = parent.trace_id
            if sampling.parent_based:
                sampled = parent.trace_flags.sampled
            else:
                sampled = sampling.samples(trace_id)
            flags = (_SAMPLED if sampled else 0) | (parent.trace_flags & _RANDOM)
            state = parent.trace_state
        else:
            parent, state = None, None
            trace_id = sampling.ids.generate_trace_id()
            sampled = sampling.samples(trace_id)
            flags = (_SAMPLED if sampled else 0) | _RANDOM
        span_id = random.getrandbits(64)
        while span_id == INVALID_SPAN_ID:
            span_id = random.getrandbits(64)
        own = SpanContext(trace_id, span_id, False, TraceFlags(flags), state)
        if not sampled:
            return NonRecordingSpan(own)
        span = LightSpan(self, name, own, parent, kind, start_time or time.time_ns())
        if attributes:
            span.set_attributes(attributes)
        if links:
            span._link(links)
        for processor in self.processors:
            processor.on_start(span.readable(), context)  # type: ignore[arg-type]
        return span

    @contextmanager
    def start_as_current_span(  # type: ignore[override]
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = (),
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> Iterator[Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time)
        with trace.use_span(
            span,
            end_on_exit=end_on_exit,
            record_exception=record_exception,
            set_status_on_exception=set_status_on_exception,
        ) as current:
            yield current

    def shutdown(self) -> None:
        for processor in self.processors:
            processor.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return all(p.force_flush(timeout_millis) for p in self.processors)


class LightSpan(Span):
    """A sampled span: its fields are ``ReadableSpan``'s by name, so the processors and
    exporters read it as they read the SDK's."""

    __slots__ = (
        "_headers",
        "_tracer",
        "attributes",
        "context",
        "dropped_events",
        "dropped_links",
        "end_time",
        "events",
        "kind",
        "links",
        "name",
        "parent",
        "start_time",
        "status",
    )

    def __init__(
        self,
        tracer: LightTracer,
        name: str,
        context: SpanContext,
        parent: SpanContext | None,
        kind: SpanKind,
        start_time: int,
    ) -> None:
        self._tracer = tracer
        self.name = name
        self.context = context
        self.parent = parent
        self.kind = kind
        self.start_time = start_time
        self.end_time: int | None = None
        self.attributes: dict[str, AttributeValue] | BoundedAttributes = {}
        self.events: list[LightEvent] = []
        self.links: list[Link] = []
        self.status = _UNSET
        self.dropped_events = 0
        self.dropped_links = 0
        self._headers: Headers | None = None

    # -- what exporters read besides the fields ------------------------------------------------

    @property
    def resource(self) -> Resource:
        return self._tracer.resource

    @property
    def instrumentation_scope(self) -> InstrumentationScope:
        return self._tracer.scope

    @property
    def instrumentation_info(self) -> InstrumentationScope:
        return self._tracer.scope

    def readable(self) -> ReadableSpan:
        """This span where a ``ReadableSpan`` is asked for (it reads as one)."""
        return self  # type: ignore[return-value]

    def headers(self) -> Headers:
        """Its W3C trace-context headers, written once however many records carry them."""
        if self._headers is None:
            self._headers = trace_headers(self.context)
        return self._headers

    # -- the API -------------------------------------------------------------------------------

    def get_span_context(self) -> SpanContext:
        return self.context

    def is_recording(self) -> bool:
        return self.end_time is None

    def set_attributes(self, attributes: Mapping[str, AttributeValue]) -> None:
        if self.end_time is not None:
            return
        own = self.attributes
        limits = self._tracer.limits
        if (
            type(own) is dict
            and limits.max_span_attribute_length is None
            and len(own) + len(attributes) <= _most(limits.max_span_attributes)
            and all(isinstance(v, _SCALARS) for v in attributes.values())
        ):
            # The common case, nothing to check one by one. A key set again moves to the
            # end, as in the SDK's mapping.
            if not own.keys().isdisjoint(attributes):
                for key in attributes:
                    own.pop(key, None)
            own.update(attributes)
            return
        bounded = self._bounded()
        for key, value in attributes.items():
            bounded[key] = value

    def set_attribute(self, key: str, value: AttributeValue) -> None:
        self.set_attributes({key: value})

    def _bounded(self) -> BoundedAttributes:
        """The span's attributes in the SDK's own bounded mapping, from the first value that
        needs its rules (a limit reached, a value to clean or cut) on."""
        if type(self.attributes) is dict:
            limits = self._tracer.limits
            self.attributes = BoundedAttributes(
                limits.max_span_attributes,
                self.attributes,
                immutable=False,
                max_value_len=limits.max_span_attribute_length,
            )
        return self.attributes  # type: ignore[return-value]

    @property
    def dropped_attributes(self) -> int:
        attributes = self.attributes
        return attributes.dropped if isinstance(attributes, BoundedAttributes) else 0

    def add_event(
        self, name: str, attributes: Attributes = None, timestamp: int | None = None
    ) -> None:
        if self.end_time is not None:
            return
        limits = self._tracer.limits
        given = attributes or {}
        kept: Mapping[str, AttributeValue]
        if (
            limits.max_attribute_length is None
            and len(given) <= _most(limits.max_event_attributes)
            and all(isinstance(v, _SCALARS) for v in given.values())
        ):
            kept = dict(given)
        else:
            kept = BoundedAttributes(
                limits.max_event_attributes, given, max_value_len=limits.max_attribute_length
            )
        if len(self.events) >= _most(limits.max_events):
            del self.events[0]  # the SDK's bounded list keeps the latest
            self.dropped_events += 1
        self.events.append(LightEvent(name, timestamp or time.time_ns(), kept))

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        if self.end_time is None:
            self._link([Link(context, attributes)])

    def _link(self, links: Sequence[Link]) -> None:
        """``links`` added as the SDK adds them: the valid ones, their attributes bounded, the
        oldest dropped past the limit."""
        limits = self._tracer.limits
        for given in links:
            context, attributes = given.context, given.attributes
            if not (context and (context.is_valid or attributes or context.trace_state)):
                continue
            kept = given
            if attributes:
                bounded = BoundedAttributes(
                    limits.max_link_attributes,
                    attributes,
                    max_value_len=limits.max_attribute_length,
                )
                kept = Link(context, bounded)
            if len(self.links) >= _most(limits.max_links):
                self.dropped_links += 1
                if not self.links:
                    continue  # a limit of none
                del self.links[0]
            self.links.append(kept)

    def update_name(self, name: str) -> None:
        if self.end_time is None:
            self.name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        if self.end_time is not None or self.status.status_code is StatusCode.OK:
            return
        if isinstance(status, Status):
            if status.status_code is not StatusCode.UNSET:
                self.status = status
        elif status is not StatusCode.UNSET:
            self.status = Status(status, description)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Attributes = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        module = type(exception).__module__
        qualname = type(exception).__qualname__
        described: dict[str, AttributeValue] = {
            "exception.type": f"{module}.{qualname}"
            if module and module != "builtins"
            else qualname,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        described.update(attributes or {})
        self.add_event("exception", described, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self.end_time is not None:
            return
        self.end_time = end_time or time.time_ns()
        # What the exporter reads, apart from what a thread that has not seen the end yet may
        # still change (a step abandoned at its deadline runs on, and may set an attribute):
        # such a late change goes to the copies left behind.
        if type(self.attributes) is dict:
            self.attributes = dict(self.attributes)
        self.events = list(self.events)
        self.links = list(self.links)
        for processor in self._tracer.processors:
            processor.on_end(self.readable())

    def __repr__(self) -> str:
        return f'LightSpan(name="{self.name}", context={self.context})'


def _most(limit: int | None) -> int:
    """A limit of ``SpanLimits`` as a number (None: no limit)."""
    return sys.maxsize if limit is None else limit
