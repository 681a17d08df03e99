"""The standard ``OTEL_*`` variables, read and checked once at start: what is exported, by
which OTLP protocol, and a ``ConfigError`` (exit 2) for a value that would otherwise be
ignored or misread without a word.

The OpenTelemetry SDK and its exporters read most of these variables themselves (endpoints,
headers, certificates, batch and export intervals); this module decides what they do not
(whether a signal is exported, and which exporter class speaks the protocol asked for) and
refuses what Ductor cannot honour: a protocol other than grpc, http/protobuf or http/json, an
exporter other than OTLP, a propagator other than the W3C trace context its Kafka headers
carry, a sampler or ratio the SDK would replace by its default, a timeout or compression the
exporters would fail on. Nothing is exported unless an OTLP endpoint is set or
``OTEL_<SIGNAL>_EXPORTER=otlp`` asks for the default one.
"""

from __future__ import annotations

import importlib
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from processor.io.config.values import ConfigError


class Protocol(StrEnum):
    GRPC = "grpc"
    HTTP_PROTOBUF = "http/protobuf"
    HTTP_JSON = "http/json"  # traces only: encoded by orjson (io/telemetry/otlp_json.py)


DEFAULT_PROTOCOL = Protocol.HTTP_PROTOBUF  # the specification's default
GRPC_MODULE = "opentelemetry.exporter.otlp.proto.grpc"
GRPC_EXTRA = "pip install 'ductor-processor[grpc]'"

# The samplers the SDK's TracerProvider knows by name (any other it replaces by its default).
SAMPLERS = (
    "always_on",
    "always_off",
    "traceidratio",
    "parentbased_always_on",
    "parentbased_always_off",
    "parentbased_traceidratio",
)
_RATIO_SAMPLERS = ("traceidratio", "parentbased_traceidratio")
_COMPRESSIONS = ("gzip", "deflate", "none")


@dataclass(frozen=True)
class OtelSettings:
    """What goes out: each signal's OTLP protocol, or None when it is not exported."""

    traces: Protocol | None = None
    metrics: Protocol | None = None

    def describe(self) -> dict[str, str]:
        """One line per signal, for ``ductor config show``."""
        return {
            "traces": "not exported" if self.traces is None else f"OTLP {self.traces}",
            "metrics": "not exported by OTLP" if self.metrics is None else f"OTLP {self.metrics}",
        }


def otel_settings(env: Mapping[str, str] | None = None) -> OtelSettings:
    """The OTLP export the ``OTEL_*`` variables ask for, or ConfigError saying what to fix."""
    source = os.environ if env is None else env
    _check_propagators(source)
    _check_sampler(source)
    _check_logs(source)
    traces = _signal(source, "traces")
    metrics = _signal(source, "metrics")
    settings = OtelSettings(traces=traces, metrics=metrics)
    if Protocol.GRPC in (settings.traces, settings.metrics) and not grpc_available():
        var = _protocol_variable(source, "traces" if settings.traces else "metrics")
        raise ConfigError(
            f"{var}=grpc needs the OTLP gRPC exporter, which is not installed: {GRPC_EXTRA}"
        )
    return settings


# The variables that give the OTLP exporters' headers (the SDK's and io/telemetry/otlp_http.py's):
# the place for a collector's credentials (``authorization=Bearer ...``), so their values are
# never shown, only their names (`ductor config show`).
HEADER_VARIABLES = (
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
    "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
)


def otlp_header_names(env: Mapping[str, str] | None = None) -> dict[str, list[str]]:
    """For each header variable set, the names of the headers it gives (W3C baggage form:
    ``name=value`` pairs, comma-separated, percent-encoded), without their values."""
    source = os.environ if env is None else env
    found: dict[str, list[str]] = {}
    for var in HEADER_VARIABLES:
        raw = _get(source, var)
        if raw:
            names = [
                urllib.parse.unquote(pair.partition("=")[0].strip()) for pair in raw.split(",")
            ]
            found[var] = [name for name in names if name]
    return found


def grpc_available() -> bool:
    try:
        importlib.import_module(GRPC_MODULE)
    except ImportError:
        return False
    return True


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip()


def _signal(env: Mapping[str, str], signal: str) -> Protocol | None:
    """The protocol ``signal`` is exported by, or None."""
    exporter_var = f"OTEL_{signal.upper()}_EXPORTER"
    exporters = [e.strip().lower() for e in _get(env, exporter_var).split(",") if e.strip()]
    for exporter in exporters:
        if exporter not in ("otlp", "none"):
            if signal == "metrics" and exporter == "prometheus":
                raise ConfigError(
                    f"{exporter_var}=prometheus: the Prometheus endpoint is"
                    " DUCTOR_METRICS_PORT (set it, and leave this variable unset)"
                )
            raise ConfigError(
                f"{exporter_var}={exporter!r}: Ductor exports {signal} by OTLP only (otlp, or none)"
            )
    _check_numbers_and_compression(env, signal)
    if "none" in exporters:
        return None
    endpoint = _get(env, "OTEL_EXPORTER_OTLP_ENDPOINT") or _get(
        env, f"OTEL_EXPORTER_OTLP_{signal.upper()}_ENDPOINT"
    )
    if "otlp" not in exporters and not endpoint:
        return None
    protocol_var = _protocol_variable(env, signal)
    raw = _get(env, protocol_var).lower() if protocol_var else ""
    if not raw:
        return DEFAULT_PROTOCOL
    try:
        protocol = Protocol(raw)
    except ValueError:
        raise ConfigError(
            f"{protocol_var}={env[protocol_var]!r} is not an OTLP protocol:"
            f" {', '.join(p.value for p in Protocol)}"
        ) from None
    if protocol is Protocol.HTTP_JSON and signal == "metrics":
        if protocol_var == "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL":
            raise ConfigError(
                "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL=http/json: metrics are exported by grpc or"
                " http/protobuf (OTLP/JSON is for traces: OTEL_EXPORTER_OTLP_TRACES_PROTOCOL)"
            )
        return Protocol.HTTP_PROTOBUF  # the general variable's http/json is for the traces
    return protocol


def _protocol_variable(env: Mapping[str, str], signal: str) -> str:
    """The variable that says the signal's protocol: its own, else the general one."""
    own = f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL"
    return own if _get(env, own) else "OTEL_EXPORTER_OTLP_PROTOCOL"


def _check_numbers_and_compression(env: Mapping[str, str], signal: str) -> None:
    for var in ("OTEL_EXPORTER_OTLP_TIMEOUT", f"OTEL_EXPORTER_OTLP_{signal.upper()}_TIMEOUT"):
        raw = _get(env, var)
        if raw:
            try:
                ok = float(raw) > 0
            except ValueError:
                ok = False
            if not ok:
                raise ConfigError(
                    f"{var}={env[var]!r} must be a number of seconds > 0 (the SDK's unit)"
                )
    for var in (
        "OTEL_EXPORTER_OTLP_COMPRESSION",
        f"OTEL_EXPORTER_OTLP_{signal.upper()}_COMPRESSION",
    ):
        raw = _get(env, var).lower()
        if raw and raw not in _COMPRESSIONS:
            raise ConfigError(f"{var}={env[var]!r} must be one of {', '.join(_COMPRESSIONS)}")


def _check_propagators(env: Mapping[str, str]) -> None:
    raw = _get(env, "OTEL_PROPAGATORS")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if names and names != ["tracecontext"]:
        raise ConfigError(
            f"OTEL_PROPAGATORS={raw!r}: Ductor carries the W3C trace context (tracecontext) in"
            " its Kafka headers and nothing else; set tracecontext or leave it unset"
        )


def _check_sampler(env: Mapping[str, str]) -> None:
    name = _get(env, "OTEL_TRACES_SAMPLER").lower()
    if not name:
        return
    if name not in SAMPLERS:
        raise ConfigError(
            f"OTEL_TRACES_SAMPLER={env['OTEL_TRACES_SAMPLER']!r} is not a sampler the SDK knows:"
            f" {', '.join(SAMPLERS)}"
        )
    arg = _get(env, "OTEL_TRACES_SAMPLER_ARG")
    if name in _RATIO_SAMPLERS and arg:
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise ConfigError(
                f"OTEL_TRACES_SAMPLER_ARG={env['OTEL_TRACES_SAMPLER_ARG']!r} must be a ratio"
                " between 0 and 1"
            )


def _check_logs(env: Mapping[str, str]) -> None:
    raw = _get(env, "OTEL_LOGS_EXPORTER")
    names = [n.strip().lower() for n in raw.split(",") if n.strip()]
    if any(n != "none" for n in names):
        raise ConfigError(
            f"OTEL_LOGS_EXPORTER={raw!r}: Ductor's logs are JSON lines on stderr, not exported by"
            " OTLP; leave it unset (or none) and collect stderr"
        )
