"""Traces and metrics (OpenTelemetry), wrapped around the shell; the pure core knows nothing.

Traces follow the messaging semantic conventions: a CONSUMER span ``process <topic>`` for the
wakeup records of a run, with the producer's context (the ``traceparent`` header) as parent when
it is one record and as links when several records were coalesced into one tick (and to the
contexts a record carries in ``ductor-link`` headers: a worker's wakeup for several step
executions, recorded together), with a ``tick`` event for each try of the run's tick (its
outcome and the batch's tick and commit times); a PRODUCER span ``send <topic>`` for every
record the tick produced, ended when the broker acknowledged it, whose context travels in the
record's headers. A conflict is a span event
plus ``ductor.outcome=conflict`` with the status left unset; only a genuine failure sets the
status to ERROR, ``error.type`` and the recorded exception.

Metrics are observable counters read from ``Stats`` (the hot path only bumps integers) and
histograms recorded where the latencies are measured. Nothing is exported, and no network is
touched, unless OTLP is configured by the standard ``OTEL_*`` variables or a Prometheus port
is set.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.metrics import Histogram, Meter, MeterProvider, Observation
from opentelemetry.sdk.metrics import AlwaysOffExemplarFilter
from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Sampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    Span,
    SpanKind,
    Tracer,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client import start_http_server

from processor.core.shapes import TopicPartition
from processor.core.stats import Stats
from processor.io.config.otel import otel_settings
from processor.io.runtime.listen import ListenError
from processor.io.telemetry.exporters import (
    metric_exporter,
    sampler_from_environment,
    span_exporter,
)
from processor.io.telemetry.light_spans import LightTracer
from processor.io.telemetry.metrics import PROCESSOR, Read, histogram, observe
from processor.io.telemetry.sampling import (
    RatioSampling,
)
from processor.io.telemetry.spans import Headers, carried_links, extract_context

_PROPAGATOR = TraceContextTextMapPropagator()
_NOOP_TRACER: Tracer = trace.NoOpTracer()
END_TO_END = "ductor.end_to_end.latency"
END_TO_END_STRIDE = 8  # the end-to-end histogram records one committed tick in this many
ARRIVAL = "ductor.wakeup.arrival"
# The histograms fed a sample per committed tick or per wakeup taken in: each records one
# sample in END_TO_END_STRIDE, since a histogram record goes through the SDK's whole
# measurement pipeline (~5 µs).
_STRIDED = frozenset({END_TO_END, ARRIVAL})
_SCOPE = "ductor.processor"


@dataclass
class Telemetry:
    """The tracer and meter of one process; a no-op unless something is configured."""

    tracer: Tracer = _NOOP_TRACER
    meter_provider: MeterProvider | None = None
    group_id: str = ""
    histograms: dict[str, Histogram] = field(default_factory=dict)
    sampling: RatioSampling | None = None  # the ratio sampler's shortcut, when it is the one
    _seen: Counter[str] = field(default_factory=Counter)  # samples of the _STRIDED, by name
    _shutdown: list[Callable[[], Any]] = field(default_factory=list)

    @property
    def tracing(self) -> bool:
        return self.tracer is not _NOOP_TRACER

    @staticmethod
    def from_environment(
        service: str, metrics_port: int, group_id: str, http_host: str = "127.0.0.1"
    ) -> Telemetry:
        """OTLP as the standard OTEL_* variables say (io/config/otel.py: ConfigError for a
        value it cannot honour), Prometheus on ``http_host``:``metrics_port`` if the port is > 0
        (this machine only by default: DUCTOR_HTTP_HOST; ListenError if it is taken)."""
        otel = otel_settings()
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME", service)})
        sampler = sampler_from_environment()
        processors: list[SpanProcessor] = []
        if otel.traces is not None:
            processors.append(BatchSpanProcessor(span_exporter(otel.traces)))
        readers: list[MetricReader] = []
        if otel.metrics is not None:
            readers.append(PeriodicExportingMetricReader(metric_exporter(otel.metrics)))
        if metrics_port > 0:
            try:
                start_http_server(metrics_port, addr=http_host)
            except OSError as exc:
                raise ListenError("metrics", http_host, metrics_port, exc) from None
            readers.append(PrometheusMetricReader())
        return Telemetry.build(resource, processors, readers, group_id, sampler)

    @staticmethod
    def build(
        resource: Resource | None,
        span_processors: Sequence[SpanProcessor],
        metric_readers: Sequence[MetricReader],
        group_id: str = "",
        sampler: Sampler | RatioSampling | None = None,
        light_spans: bool = True,
    ) -> Telemetry:
        """Explicit wiring (tests pass in-memory exporters and readers here). The ratio
        sampler's spans are light ones unless ``light_spans`` is false (the SDK's)."""
        telemetry = Telemetry(group_id=group_id)
        if span_processors and isinstance(sampler, RatioSampling) and light_spans:
            # The default sampler's spans, recorded as plain objects (io/telemetry/light_spans.py).
            telemetry.sampling = sampler
            light = LightTracer(
                sampler,
                span_processors,
                resource or Resource.create(),
                InstrumentationScope(_SCOPE),
            )
            telemetry.tracer = light
            telemetry._shutdown.append(light.shutdown)
        elif span_processors:
            # Without a sampler, the SDK's: OTEL_TRACES_SAMPLER, or every trace.
            if isinstance(sampler, RatioSampling):
                telemetry.sampling = sampler
                provider = TracerProvider(
                    resource=resource, sampler=sampler.sampler, id_generator=sampler.ids
                )
            else:
                provider = TracerProvider(resource=resource, sampler=sampler)
            for processor in span_processors:
                provider.add_span_processor(processor)
            telemetry.tracer = provider.get_tracer(_SCOPE)
            telemetry._shutdown.append(provider.shutdown)
        if metric_readers:
            # No exemplars unless OTEL_METRICS_EXEMPLAR_FILTER asks for them: the default
            # filter consults the current trace context on every histogram record.
            exemplars = None
            if not os.environ.get("OTEL_METRICS_EXEMPLAR_FILTER"):
                exemplars = AlwaysOffExemplarFilter()
            meter_provider = SdkMeterProvider(
                metric_readers=list(metric_readers), resource=resource, exemplar_filter=exemplars
            )
            telemetry.meter_provider = meter_provider
            telemetry._shutdown.append(meter_provider.shutdown)
        return telemetry

    @staticmethod
    def in_memory(
        exporter: SpanExporter, reader: MetricReader | None = None, light_spans: bool = True
    ) -> Telemetry:
        """Every trace sampled (the ratio sampler at 1, its light spans unless
        ``light_spans`` is false), each span exported as it ends."""
        return Telemetry.build(
            None,
            [SimpleSpanProcessor(exporter)],
            [reader] if reader else [],
            sampler=RatioSampling(1.0),
            light_spans=light_spans,
        )

    def shutdown(self) -> None:
        for close in self._shutdown:
            close()
        self._shutdown.clear()

    # -- metrics -------------------------------------------------------------------------------

    def instrument(self, stats: Stats, lag: Callable[[], Mapping[TopicPartition, int]]) -> None:
        """Expose ``stats`` as OpenTelemetry instruments (io/telemetry/metrics.py names them; no
        run id is ever a label)."""
        if self.meter_provider is None:
            return
        meter: Meter = self.meter_provider.get_meter(PROCESSOR.value)
        observe(meter, PROCESSOR, _processor_reads(stats, lag))
        limit_wait = histogram(meter, PROCESSOR, "ductor.limit.wait.duration")
        stats.observe_limit_wait = lambda name, ms: limit_wait.record(ms, {"ductor.limit": name})
        for name in _RECORDED:
            self.histograms[name] = histogram(meter, PROCESSOR, name)
        stats.observe = self.record

    def instrument_readiness(self, ready: Callable[[], bool], assigned: Callable[[], int]) -> None:
        """``ductor.ready`` (1 when ``/readyz`` would answer 200, else 0) and the partitions the
        instance owns, read only when metrics are collected (a scrape), never on the loop."""
        if self.meter_provider is None:
            return
        reads: dict[str, Read] = {
            "ductor.ready": lambda: [Observation(1 if ready() else 0)],
            "ductor.partitions.assigned": lambda: [Observation(assigned())],
        }
        observe(self.meter_provider.get_meter(PROCESSOR.value), PROCESSOR, reads)

    def record(self, name: str, value_ms: float) -> None:
        histogram = self.histograms.get(name)
        if histogram is None:
            return
        if name in _STRIDED:
            self._seen[name] += 1
            if self._seen[name] % END_TO_END_STRIDE:
                return
        histogram.record(value_ms)

    # -- traces --------------------------------------------------------------------------------

    def start_consumer_span(
        self,
        topic: str,
        records: Sequence[tuple[str, int, int, bytes | None, Headers]],
        run_id: str,
    ) -> Span:
        """``process <topic>`` for the records of one run's tick: parent or links from each
        record's producer context."""
        if self.sampling is not None and len(records) == 1:
            unsampled = self.sampling.unsampled(records[0][4])
            if unsampled is not None:
                # certain not to be sampled: no SDK span (io/telemetry/sampling.py)
                return unsampled
        contexts = [extract_context(headers) for *_rest, headers in records]
        parent: Context | None = None
        links: list[Link] = []
        if len(records) == 1:
            parent = contexts[0]
        else:
            links = [
                Link(sc)
                for sc in (trace.get_current_span(c).get_span_context() for c in contexts)
                if sc.is_valid
            ]
        links += carried_links(records)
        span = self.tracer.start_span(
            f"process {topic}", context=parent, kind=SpanKind.CONSUMER, links=links
        )
        if not span.is_recording():
            return span  # not sampled: build nothing more (the ratio sampler reads no attribute)
        first_topic, partition, offset, key, _headers = records[0]
        attributes: dict[str, Any] = {
            "messaging.system": "kafka",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": first_topic,
            "messaging.destination.partition.id": str(partition),
            "messaging.kafka.offset": offset,
            "messaging.consumer.group.name": self.group_id,
            "messaging.batch.message_count": len(records),
            "ductor.run_id": run_id,
        }
        if key is not None:
            attributes["messaging.kafka.message.key"] = key.decode(errors="replace")
        span.set_attributes(attributes)
        return span

    def note_send(self, span: Span, topic: str, attributes: Iterable[tuple[str, Any]]) -> None:
        """A record produced by the work of ``span`` (its context rides in the record)."""
        span.add_event("send", {"messaging.destination.name": topic, **dict(attributes)})

    def start_producer_span(
        self, parent: Span | None, topic: str, attributes: Mapping[str, Any]
    ) -> tuple[Span, Headers]:
        """``send <topic>``, ended on delivery; returns the headers that carry its context."""
        context = trace.set_span_in_context(parent) if parent is not None else None
        span = self.tracer.start_span(
            f"send {topic}",
            context=context,
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.destination.name": topic,
                **attributes,
            },
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
        return span, [(k, v.encode()) for k, v in carrier.items()]


# The histograms ``Telemetry.record`` records, by name (the limit's wait is recorded by the
# stats' own hook, with the limit's name as its label).
_RECORDED = (
    "ductor.tick.duration",
    "ductor.commit.duration",
    "ductor.end_to_end.latency",
    "ductor.wakeup.arrival",
    "ductor.delay.lateness",
)


def _by(
    label: str, counts: Mapping[Any, int], zero: bool = False
) -> Callable[[], list[Observation]]:
    """A counter's reading by one label; ``zero``: a 0 without a label while nothing counted
    (the series exists from the start). The items are copied first (in C, under the GIL): the
    scrape thread reads while the loop adds a key."""
    return lambda: (
        [Observation(n, {label: k}) for k, n in list(counts.items())]
        or ([Observation(0)] if zero else [])
    )


def _processor_reads(
    stats: Stats, lag: Callable[[], Mapping[TopicPartition, int]]
) -> dict[str, Read]:
    """How each of the processor's observable metrics is read from its stats."""

    def read_lag() -> list[Observation]:
        return [
            Observation(
                value,
                {"messaging.destination.name": t, "messaging.destination.partition.id": str(p)},
            )
            for (t, p), value in lag().items()
        ]

    return {
        "ductor.ticks": _by("ductor.outcome", stats.ticks),
        "ductor.conflicts": lambda: [Observation(stats.conflicts)],
        "ductor.relayed": lambda: [Observation(stats.relayed)],
        "ductor.errors": _by("error.type", stats.errors, zero=True),
        "ductor.requeues": _by("ductor.delay.rung_ms", stats.requeues),
        "ductor.force_fails": _by("ductor.reason", stats.force_fails),
        "ductor.dead_letters": _by("ductor.reason", stats.dead_letters),
        "ductor.quarantined": _by("ductor.reason", stats.quarantined),
        "ductor.isolated": _by("ductor.stage", stats.isolated, zero=True),
        "ductor.consumer.rejoins": lambda: [Observation(stats.rejoins)],
        "ductor.trigger.records": lambda: [
            Observation(n, {"ductor.trigger": t, "ductor.outcome": o})
            for (t, o), n in list(stats.trigger_records.items())
        ],
        "ductor.outbox.parked": _by("error.type", stats.parked, zero=True),
        "ductor.runs.started": _by("ductor.workflow", stats.runs.started),
        "ductor.runs.ended": lambda: [
            Observation(n, {"ductor.workflow": w, "ductor.status": s.value})
            for (w, s), n in list(stats.runs.ended.items())
        ],
        "ductor.limit.refused": _by("ductor.limit", stats.limit_refused),
        "ductor.consumer.lag": read_lag,
    }
