"""``ductor config show`` (every setting in effect, secrets hidden, and where each came from)
and ``ductor config check`` (whether the settings work with the services they name)."""

from __future__ import annotations

import argparse
from typing import Any

from processor.cli.common import EXIT_FAILED, EXIT_OK
from processor.io import kafka_properties
from processor.io.config import (
    SECRET_VARIABLES,
    SETTING_VARIABLES,
    Settings,
    redact_dsn,
    setting_sources,
    settings_env,
)
from processor.io.config_check import run_checks
from processor.io.kafka import consumer_config, producer_config
from processor.io.otel_config import otel_settings

# The client properties another setting gives.
_FROM_SETTING = {
    "bootstrap.servers": "DUCTOR_BOOTSTRAP_SERVERS",
    "group.id": "DUCTOR_GROUP_ID",
    "group.protocol": "DUCTOR_GROUP_PROTOCOL",
    "message.max.bytes": "DUCTOR_MAX_RECORD_BYTES",
}


def cmd_config_show(settings: Settings, _args: argparse.Namespace) -> int:
    for line in show_lines(settings):
        print(line)
    return EXIT_OK


def show_lines(settings: Settings, env: dict[str, str] | None = None) -> list[str]:
    """``NAME=VALUE  # where it came from`` for every setting, then the properties of the
    processor's Kafka clients and what the telemetry exports."""
    sources = setting_sources(env)
    values = settings_env(settings)
    lines = ["# settings: default, env (the variable) or file (<NAME>_FILE)"]
    kafka = sorted(v for v in values if v not in SETTING_VARIABLES)
    for var in [*SETTING_VARIABLES, *kafka]:
        lines.append(f"{var}={_shown(var, values[var])}  # {sources.get(var, 'env')}")
    lines.append(
        "# the processor's Kafka clients: default (Ductor's, a DUCTOR_KAFKA_* variable replaces"
        " it), env, fixed (Ductor's own: refused as a variable) or the setting that gives it"
    )
    for client, config in (
        ("producer", producer_config(settings, "<instance id>")),
        ("consumer", consumer_config(settings, "<instance id>")),
    ):
        for prop in sorted(config):
            value = _text(config[prop])
            if prop in kafka_properties.SECRET_PROPERTIES:
                value = "***"
            lines.append(f"kafka.{client} {prop}={value}  # {_origin(settings, prop, sources)}")
    otel = otel_settings().describe()
    lines.append("# telemetry (OTEL_* variables; Prometheus: DUCTOR_METRICS_PORT)")
    lines.append(f"traces: {otel['traces']}")
    prometheus = (
        f"; Prometheus on {settings.http_host}:{settings.metrics_port}"
        if settings.metrics_port
        else ""
    )
    lines.append(f"metrics: {otel['metrics']}{prometheus}")
    return lines


def _shown(var: str, value: str) -> str:
    if var == "DUCTOR_PG_DSN":
        return redact_dsn(value)
    if var in SECRET_VARIABLES:
        return "***"
    return value


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _origin(settings: Settings, prop: str, sources: dict[str, str]) -> str:
    if prop in settings.kafka_extra:
        var = kafka_properties.variable_for(prop)
        return f"{sources.get(var, 'env')} {var}"
    if prop in _FROM_SETTING:
        return _FROM_SETTING[prop]
    return "fixed" if prop in kafka_properties.OWNED else "default"


def cmd_config_check(settings: Settings, _args: argparse.Namespace) -> int:
    checks = run_checks(settings)
    for check in checks:
        print(f"{'ok  ' if check.ok else 'FAIL'}  {check.name}: {check.detail}")
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED
