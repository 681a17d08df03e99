"""Nothing is exported, and no network touched, unless telemetry is configured."""

from __future__ import annotations

import pytest

from processor.io.telemetry import Telemetry


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
