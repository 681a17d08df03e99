"""What the standard ``OTEL_*`` variables choose: the trace sampler (one trace in ten by
default) and the OTLP exporters of spans and metrics for the protocol configured."""

from __future__ import annotations

import os

from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import MetricExporter
from opentelemetry.sdk.trace.export import SpanExporter

from processor.io.config.otel import Protocol
from processor.io.telemetry.otlp_json import OtlpJsonSpanExporter
from processor.io.telemetry.otlp_proto import OtlpProtobufSpanExporter
from processor.io.telemetry.sampling import RatioSampling

DEFAULT_SAMPLE_RATIO = 0.1


def sampler_from_environment() -> RatioSampling | None:
    """One trace in ten unless OTEL_TRACES_SAMPLER says otherwise (the SDK's own default
    samples every trace, which costs several times the tick itself). The standard samplers
    (always on or off, a ratio of trace ids, each parent-based or not) are ratio sampling
    (io/telemetry/sampling.py), with light spans and the shortcut for the traces they do not sample;
    any other, or a ratio that is not one, is left to the SDK (None)."""
    name = os.environ.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if not name:
        return RatioSampling(DEFAULT_SAMPLE_RATIO)
    parent_based = name.startswith("parentbased_")
    rule = name.removeprefix("parentbased_")
    if rule == "always_on":
        return RatioSampling(1.0, parent_based)
    if rule == "always_off":
        return RatioSampling(0.0, parent_based)
    if rule != "traceidratio":
        return None
    try:
        ratio = float(os.environ.get("OTEL_TRACES_SAMPLER_ARG", "1.0"))
    except ValueError:
        return None  # the SDK warns and takes its own default
    return RatioSampling(ratio, parent_based) if 0.0 <= ratio <= 1.0 else None


def span_exporter(protocol: Protocol) -> SpanExporter:
    """The OTLP span exporter that speaks ``protocol`` (each reads its endpoint, headers,
    timeout, compression and certificates from the standard variables)."""
    if protocol is Protocol.HTTP_JSON:
        # Encoded by orjson, several times cheaper than the SDK's protobuf (docs/performance.md).
        return OtlpJsonSpanExporter()
    if protocol is Protocol.GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as GrpcSpanExporter,
        )

        return GrpcSpanExporter()
    # Encoded here, field by field: the SDK's protobuf messages cost several times as much.
    return OtlpProtobufSpanExporter()


def metric_exporter(protocol: Protocol) -> MetricExporter:
    if protocol is Protocol.GRPC:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (  # noqa: PLC0415
            OTLPMetricExporter as GrpcMetricExporter,
        )

        return GrpcMetricExporter()
    return OTLPMetricExporter()
