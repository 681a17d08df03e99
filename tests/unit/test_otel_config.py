"""Every OTEL_* value the SDK would accept works or is refused (processor/io/config/otel.py):
gRPC is spoken when asked for, an unknown protocol, exporter, propagator or sampler is one
sentence at start instead of a silent substitute."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from concurrent import futures
from typing import Any

import grpc  # type: ignore[import-untyped]
import pytest
from opentelemetry.proto.collector.trace.v1 import (
    trace_service_pb2,
    trace_service_pb2_grpc,
)

from processor.cli.main import main
from processor.io.config.otel import GRPC_MODULE, OtelSettings, Protocol, otel_settings
from processor.io.config.values import ConfigError
from processor.io.telemetry.setup import Telemetry


@pytest.fixture(autouse=True)
def _no_otel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


def test_nothing_is_exported_without_an_endpoint_or_an_exporter_asked_for() -> None:
    assert otel_settings({}) == OtelSettings(None, None)
    assert otel_settings({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}) == OtelSettings(None, None)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, ("http/protobuf", "http/protobuf")),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            ("grpc", "grpc"),
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "GRPC"},
            ("grpc", "grpc"),
        ),
        # The general http/json is for the traces; metrics have no JSON exporter: protobuf.
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"},
            ("http/json", "http/protobuf"),
        ),
        (
            {
                "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json",
            },
            ("http/json", "grpc"),
        ),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, ("http/protobuf", None)),  # the default endpoint
        (
            {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c/v1/traces"},
            ("http/protobuf", None),
        ),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_METRICS_EXPORTER": "none"},
            ("http/protobuf", None),
        ),
    ],
)
def test_each_signal_is_exported_by_the_protocol_asked_for(
    env: dict[str, str], expected: tuple[str | None, str | None]
) -> None:
    settings = otel_settings(env)
    assert (settings.traces, settings.metrics) == expected


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "http"}, "'http' is not an OTLP protocol: grpc, http/"),
        ({"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "thrift"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"),
        ({"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/json"}, "metrics are exported by grpc"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "OTLP only"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "OTLP only"),
        ({"OTEL_METRICS_EXPORTER": "prometheus"}, "DUCTOR_METRICS_PORT"),
        ({"OTEL_LOGS_EXPORTER": "otlp"}, "JSON lines on stderr"),
        ({"OTEL_PROPAGATORS": "b3"}, "W3C trace context"),
        ({"OTEL_PROPAGATORS": "tracecontext,baggage"}, "W3C trace context"),
        ({"OTEL_TRACES_SAMPLER": "sometimes"}, "not a sampler the SDK knows"),
        (
            {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"},
            "between 0 and 1",
        ),
        ({"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "number of seconds"),
        ({"OTEL_EXPORTER_OTLP_TRACES_COMPRESSION": "br"}, "gzip, deflate, none"),
    ],
)
def test_a_value_that_would_be_ignored_or_misread_is_refused(
    env: dict[str, str], says: str
) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", **env}
    with pytest.raises(ConfigError) as info:
        otel_settings(env)
    assert says in str(info.value)
    assert "\n" not in str(info.value)


def test_values_the_sdk_reads_itself_pass() -> None:
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c",
        "OTEL_PROPAGATORS": "tracecontext",
        "OTEL_TRACES_SAMPLER": "ALWAYS_ON",
        "OTEL_TRACES_SAMPLER_ARG": "whatever",  # read only by the ratio samplers
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",
        "OTEL_EXPORTER_OTLP_COMPRESSION": "gzip",
        "OTEL_LOGS_EXPORTER": "none",
    }
    assert otel_settings(env) == OtelSettings(Protocol.HTTP_PROTOBUF, Protocol.HTTP_PROTOBUF)


def test_grpc_without_its_exporter_installed_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, GRPC_MODULE, None)  # an import of it fails
    with pytest.raises(ConfigError) as info:
        otel_settings(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
        )
    assert str(info.value) == (
        "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the OTLP gRPC exporter, which is not installed:"
        " pip install 'ductor-processor[grpc]'"
    )


@pytest.fixture
def grpc_collector() -> Iterator[tuple[int, list[Any]]]:
    """A local OTLP/gRPC trace collector that keeps the requests it is sent."""
    received: list[Any] = []

    class Traces(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:
            received.append(request)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port, received
    server.stop(None)


def test_traces_are_exported_over_grpc_when_grpc_is_asked_for(
    grpc_collector: tuple[int, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    port, received = grpc_collector
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_INSECURE", "true")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_on")
    telemetry = Telemetry.from_environment("ductor-grpc-test", metrics_port=0, group_id="g")
    assert telemetry.meter_provider is None  # only the traces have an endpoint
    telemetry.tracer.start_span("over grpc").end()
    telemetry.shutdown()  # flushes the batch
    spans = [
        span.name
        for request in received
        for resource in request.resource_spans
        for scope in resource.scope_spans
        for span in scope.spans
    ]
    assert spans == ["over grpc"]


def test_a_bad_otel_value_stops_a_service_command_with_exit_2_and_one_sentence(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    for command in (["process"], ["worker"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err == (
            "ductor: configuration error: OTEL_EXPORTER_OTLP_PROTOCOL='http' is not an OTLP"
            " protocol: grpc, http/protobuf, http/json\n"
        )
