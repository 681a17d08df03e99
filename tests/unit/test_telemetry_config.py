"""Nothing is exported, and no network touched, unless telemetry is configured."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from processor.core.stats import Stats
from processor.io.config.otel import SAMPLERS
from processor.io.telemetry.light_spans import LightTracer
from processor.io.telemetry.setup import ARRIVAL, END_TO_END, END_TO_END_STRIDE, Telemetry
from processor.io.telemetry.spans import context_headers


def test_without_otel_variables_or_a_metrics_port_telemetry_is_a_no_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in (
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
        "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
    ):
        monkeypatch.delenv(name, raising=False)
    telemetry = Telemetry.from_environment("ductor-test", metrics_port=0, group_id="g")
    assert not telemetry.tracing
    assert telemetry.meter_provider is None


def test_an_otlp_endpoint_turns_traces_and_metrics_on_and_none_turns_traces_off(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nothing listens there: building the exporters connects to nothing until an export.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    telemetry = Telemetry.from_environment("ductor-test", metrics_port=0, group_id="g")
    try:
        assert telemetry.tracing
        assert telemetry.meter_provider is not None
    finally:
        telemetry.shutdown()
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "none")
    telemetry = Telemetry.from_environment("ductor-test", metrics_port=0, group_id="g")
    try:
        assert not telemetry.tracing
        assert telemetry.meter_provider is not None
    finally:
        telemetry.shutdown()


def test_a_trace_not_sampled_still_passes_its_ids_and_decision_on() -> None:
    """What an unsampled tick puts on the records it produces: the W3C header a propagator
    would write, built without one."""
    provider = TracerProvider(sampler=ALWAYS_OFF)
    span = provider.get_tracer("t").start_span("process")
    assert not span.is_recording()
    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    assert context_headers(span) == [("traceparent", carrier["traceparent"].encode())]
    assert int(carrier["traceparent"][-2:], 16) & 1 == 0  # the sampled flag is off
    sampled = TracerProvider(sampler=ALWAYS_ON).get_tracer("t").start_span("process")
    assert int(context_headers(sampled)[0][1][-2:], 16) & 1 == 1
    assert context_headers(trace.INVALID_SPAN) == []


def test_one_trace_in_ten_is_sampled_unless_the_environment_says_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("OTEL_TRACES_EXPORTER", raising=False)
    monkeypatch.delenv("OTEL_TRACES_SAMPLER", raising=False)
    telemetry = Telemetry.from_environment("ductor-test", metrics_port=0, group_id="g")
    try:
        sampler = telemetry.tracer.sampler  # type: ignore[attr-defined]
        assert telemetry.sampling is not None and sampler is telemetry.sampling.sampler
        assert "TraceIdRatioBased{0.1}" in sampler.get_description()
    finally:
        telemetry.shutdown()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    telemetry = Telemetry.from_environment("ductor-test", metrics_port=0, group_id="g")
    try:
        # always_on is TraceIdRatioBased(1) alone: every id under its bound, no parent asked.
        assert telemetry.sampling is not None and not telemetry.sampling.parent_based
        assert telemetry.sampling.root.rate == 1.0
    finally:
        telemetry.shutdown()
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.25")
    telemetry = Telemetry.from_environment("ductor-test", metrics_port=0, group_id="g")
    try:
        assert telemetry.sampling is not None and telemetry.sampling.root.rate == 0.25
        assert telemetry.sampling.parent_based
    finally:
        telemetry.shutdown()
    for name in SAMPLERS:  # every sampler the configuration takes makes light spans
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", name)
        telemetry = Telemetry.from_environment("ductor-test", metrics_port=0, group_id="g")
        try:
            assert type(telemetry.tracer) is LightTracer, name
        finally:
            telemetry.shutdown()


def test_the_end_to_end_histogram_records_one_committed_tick_in_its_stride() -> None:
    """Every sample still reaches the stats' reservoir (the stats line, the benchmark); the
    end-to-end and arrival histograms take one in END_TO_END_STRIDE each, the others every
    sample."""
    reader = InMemoryMetricReader()
    telemetry = Telemetry.build(None, [], [reader])
    stats = Stats()
    telemetry.instrument(stats, lambda: {})
    for value in range(3 * END_TO_END_STRIDE):
        stats.sample("end_to_end", float(value))
        stats.sample("arrival", float(value))
        stats.sample("arrival", float(value))
        stats.sample("commit", 1.0)
    counts: dict[str, int] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name in (END_TO_END, ARRIVAL, "ductor.commit.duration"):
                    points = metric.data.data_points
                    counts[metric.name] = sum(getattr(p, "count", 0) for p in points)
    assert counts == {END_TO_END: 3, ARRIVAL: 6, "ductor.commit.duration": 3 * END_TO_END_STRIDE}
    assert len(stats.end_to_end_ms.samples) == 3 * END_TO_END_STRIDE
    assert len(stats.arrival_ms.samples) == 6 * END_TO_END_STRIDE
    telemetry.shutdown()
