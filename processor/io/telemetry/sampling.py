"""The default trace sampler, and its decision for the ticks it does not sample, made without
the SDK's span machinery.

Nine ticks in ten are not sampled by the default sampler, ParentBased(TraceIdRatioBased(r)).
For each, the SDK would still extract the record's context through the propagator, run the
sampler, generate ids and build a non-recording span: ~7 µs, a tenth of the whole tick. Only
the span's context is ever used (it travels on in the records the tick produces), so
``RatioSampling.unsampled`` builds just that when the SDK's decision is certain to be "not
sampled": a record whose ``traceparent`` says not sampled (the parent-based rule), or a fresh
trace id under the ratio's bound (the ratio rule, on the same id the SDK would test). When
the answer is "sampled", or the headers are anything but plain (a ``tracestate``, a
traceparent the SDK might read differently), it returns None and the SDK decides as before,
on the very trace id drawn here (``PrimedIds``), so a tick is sampled exactly when the SDK's
own sampler says so.
"""

from __future__ import annotations

import random
import threading

from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import ParentBased, Sampler, TraceIdRatioBased
from opentelemetry.trace import (
    INVALID_SPAN_ID,
    INVALID_TRACE_ID,
    NonRecordingSpan,
    SpanContext,
    TraceFlags,
)

Headers = list[tuple[str, bytes]]
_SAMPLED = TraceFlags.SAMPLED
# The W3C "random trace id" flag: set on a root whose id is random (ours are), passed on from a
# parent, as the SDK does.
_RANDOM = TraceFlags.RANDOM_TRACE_ID
_ROOT_FLAGS = TraceFlags(_RANDOM)
_HEX = frozenset(b"0123456789abcdef")
_ZERO_TRACE, _ZERO_SPAN = b"0" * 32, b"0" * 16


class PrimedIds(RandomIdGenerator):
    """Random ids, except that the next trace id of a thread can be set beforehand: the id
    the ratio rule was tested on becomes the id of the root span the SDK then starts."""

    def __init__(self) -> None:
        self._primed = threading.local()

    def prime(self, trace_id: int) -> None:
        self._primed.trace_id = trace_id

    def generate_trace_id(self) -> int:
        trace_id: int | None = getattr(self._primed, "trace_id", None)
        if trace_id is None:
            return super().generate_trace_id()
        self._primed.trace_id = None
        return trace_id


class RatioSampling:
    """ParentBased(TraceIdRatioBased(``ratio``)) with the SDK's default delegates, or, not
    ``parent_based``, TraceIdRatioBased(``ratio``) alone (a parent's decision ignored), and
    the shortcut for the traces it does not sample. The SDK's other standard samplers are
    these at a ratio of 1 or 0: ``always_on`` is TraceIdRatioBased(1), whose bound no id
    reaches, ``parentbased_always_off`` ParentBased(TraceIdRatioBased(0))."""

    def __init__(self, ratio: float, parent_based: bool = True) -> None:
        self.root = TraceIdRatioBased(ratio)
        self.parent_based = parent_based
        self.sampler: Sampler = ParentBased(self.root) if parent_based else self.root
        self.ids = PrimedIds()

    def unsampled(self, headers: Headers) -> CarriedSpan | None:
        """The span context a not-sampled tick of a record with these ``headers`` carries on,
        or None when the SDK must decide (sampled, or headers out of the ordinary)."""
        traceparent: bytes | None = None
        for key, value in headers:
            if key == "traceparent":
                if traceparent is not None:
                    return None
                traceparent = value
            elif key == "tracestate":
                return None
        if traceparent is None:
            return self._unsampled_root()
        return self._unsampled_child(traceparent)

    def _unsampled_root(self) -> CarriedSpan | None:
        """A new trace's root, unless its id is sampled (then primed for the SDK's span)."""
        trace_id = random.getrandbits(128)
        if trace_id == INVALID_TRACE_ID:
            return None
        if self.samples(trace_id):
            self.ids.prime(trace_id)  # sampled: the SDK's root span gets this very id
            return None
        return CarriedSpan(b"00-%032x-%016x-%02x" % (trace_id, _span_id(), _ROOT_FLAGS))

    def _unsampled_child(self, traceparent: bytes) -> CarriedSpan | None:
        """The child of the producer's context, unless it is sampled or not canonical."""
        flags = canonical_flags(traceparent)
        if flags is None:
            return None
        if self.parent_based:
            if flags & _SAMPLED:
                return None
        elif self.samples(int(traceparent[3:35], 16)):
            return None
        # The child's traceparent written from the parent's: its trace id as it came (no
        # integer made of it), a new span id, the random-id flag passed on.
        trace_hex = traceparent[3:35]
        return CarriedSpan(b"00-%s-%016x-%02x" % (trace_hex, _span_id(), flags & _RANDOM))

    def samples(self, trace_id: int) -> bool:
        """The ratio rule, on the id's low 64 bits as the SDK tests it."""
        return trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < self.root.bound


class CarriedSpan(NonRecordingSpan):
    """A span the sampler did not take: it records nothing, and its context rides on in the
    records its work produces. Made from its traceparent, the header it is carried in; the
    span context is read from it only when something asks (most ticks never do)."""

    def __init__(self, traceparent: bytes) -> None:
        self._traceparent = traceparent
        self._read: SpanContext | None = None

    def get_span_context(self) -> SpanContext:
        if self._read is None:
            ids = parse_traceparent(self._traceparent)
            assert ids is not None  # written canonical by RatioSampling.unsampled
            trace_id, span_id, flags = ids
            self._read = SpanContext(trace_id, span_id, False, TraceFlags(flags))
        return self._read

    def headers(self) -> Headers:
        return [("traceparent", self._traceparent)]

    def __repr__(self) -> str:
        return f"CarriedSpan({self._traceparent.decode()})"


def trace_headers(context: SpanContext) -> Headers:
    """The W3C trace-context headers of ``context`` (none for an invalid one)."""
    if not context.is_valid:
        return []
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    headers = [("traceparent", parent.encode())]
    if context.trace_state:
        headers.append(("tracestate", context.trace_state.to_header().encode()))
    return headers


def canonical_flags(value: bytes) -> int | None:
    """The flags of a version-00 W3C traceparent in its one canonical form with valid ids
    (what ``parse_traceparent`` reads), without reading the ids; None for anything else."""
    if len(value) != 55 or value[:3] != b"00-" or value[35:36] != b"-" or value[52:53] != b"-":
        return None
    if not _HEX.issuperset(value[3:35] + value[36:52] + value[53:55]):
        return None
    if value[3:35] == _ZERO_TRACE or value[36:52] == _ZERO_SPAN:
        return None
    return int(value[53:55], 16)


def parse_traceparent(value: bytes) -> tuple[int, int, int] | None:
    """(trace id, span id, flags) of a version-00 W3C traceparent in its one canonical form;
    None for anything else (the SDK's propagator then has the last word)."""
    flags = canonical_flags(value)
    if flags is None:
        return None
    return int(value[3:35], 16), int(value[36:52], 16), flags


def _span_id() -> int:
    span_id = random.getrandbits(64)
    while span_id == INVALID_SPAN_ID:
        span_id = random.getrandbits(64)
    return span_id
