"""Telemetry: traces and metrics (OpenTelemetry) wrapped around the shell, the light spans and
the default sampler, the OTLP span exporters, and the structured logs."""
