"""``ductor config show`` (every setting in effect, secrets hidden, and where each came from)
and ``ductor config check`` (whether the settings work with the services they name).

What is shown is built once (``shown_config``), then printed as text or JSON: both forms
hide the same things. A secret setting is ``***`` (the DSN keeps all but its password), and so
is every librdkafka property that carries one (kafka_properties.is_secret) and the value of
every OTLP header (the standard place for a collector's credentials)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from processor.cli.common import EXIT_FAILED, EXIT_OK
from processor.cli.grammar import print_json, print_json_lines
from processor.io.config import kafka_properties
from processor.io.config.check import run_checks
from processor.io.config.otel import otel_settings, otlp_header_names
from processor.io.config.settings import Settings, setting_sources, settings_env
from processor.io.config.values import HIDDEN, redact_dsn
from processor.io.config.variables import SECRET_VARIABLES, SETTING_VARIABLES
from processor.io.kafka.configs import consumer_config, producer_config

# The client properties another setting gives.
_FROM_SETTING = {
    "bootstrap.servers": "DUCTOR_BOOTSTRAP_SERVERS",
    "group.id": "DUCTOR_GROUP_ID",
    "group.protocol": "DUCTOR_GROUP_PROTOCOL",
    "message.max.bytes": "DUCTOR_MAX_RECORD_BYTES",
}


def register(sub: Any) -> None:
    config = sub.add_parser("config", help="the settings in effect, and whether they work")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    p = config_sub.add_parser(
        "show",
        help="every setting in effect (secrets hidden) and where it came from (default, env,"
        " file), the Kafka clients' properties, what the telemetry exports",
    )
    p.set_defaults(func=cmd_config_show)
    p = config_sub.add_parser(
        "check",
        help="reach Postgres and Kafka (short timeouts), check the schema version, the Kafka"
        " client settings and the topics' partition counts; one line per check, exit 1 if one"
        " fails",
    )
    p.set_defaults(func=cmd_config_check)


def cmd_config_show(settings: Settings, args: argparse.Namespace) -> int:
    if args.output == "json":
        print_json(shown_config(settings))
        return EXIT_OK
    for line in show_lines(settings):
        print(line)
    return EXIT_OK


def shown_config(settings: Settings, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Every setting (value, source), the processor's Kafka clients' properties (value,
    origin) and what the telemetry exports, each secret hidden."""
    sources = setting_sources(env)
    values = settings_env(settings)
    kafka_vars = sorted(v for v in values if v not in SETTING_VARIABLES)
    shown_settings = {
        var: {"value": _shown(var, values[var]), "source": sources.get(var, "env")}
        for var in [*SETTING_VARIABLES, *kafka_vars]
    }
    clients: dict[str, dict[str, dict[str, str]]] = {}
    for client, config in (
        ("producer", producer_config(settings, "<instance id>")),
        ("consumer", consumer_config(settings, "<instance id>")),
    ):
        clients[client] = {
            prop: {
                "value": HIDDEN if kafka_properties.is_secret(prop) else _text(config[prop]),
                "origin": _origin(settings, prop, sources),
            }
            for prop in sorted(config)
        }
    otel = otel_settings(env).describe()
    headers = {
        var: [f"{name}={HIDDEN}" for name in names] for var, names in otlp_header_names(env).items()
    }
    prometheus = f"{settings.http_host}:{settings.metrics_port}" if settings.metrics_port else None
    telemetry = {**otel, "prometheus": prometheus, "otlp_headers": headers}
    return {"settings": shown_settings, "kafka": clients, "telemetry": telemetry}


def show_lines(settings: Settings, env: dict[str, str] | None = None) -> list[str]:
    """``NAME=VALUE  # where it came from`` for every setting, then the properties of the
    processor's Kafka clients and what the telemetry exports."""
    shown = shown_config(settings, env)
    lines = ["# settings: default, env (the variable) or file (<NAME>_FILE)"]
    for var, setting in shown["settings"].items():
        lines.append(f"{var}={setting['value']}  # {setting['source']}")
    lines.append(
        "# the processor's Kafka clients: default (Ductor's, a DUCTOR_KAFKA_* variable replaces"
        " it), env, fixed (Ductor's own: refused as a variable) or the setting that gives it"
    )
    for client, properties in shown["kafka"].items():
        for prop, prop_shown in properties.items():
            lines.append(f"kafka.{client} {prop}={prop_shown['value']}  # {prop_shown['origin']}")
    telemetry = shown["telemetry"]
    lines.append("# telemetry (OTEL_* variables; Prometheus: DUCTOR_METRICS_PORT)")
    lines.append(f"traces: {telemetry['traces']}")
    prometheus = f"; Prometheus on {telemetry['prometheus']}" if telemetry["prometheus"] else ""
    lines.append(f"metrics: {telemetry['metrics']}{prometheus}")
    for var, headers in telemetry["otlp_headers"].items():
        lines.append(f"{var}={','.join(headers)}  # env")
    return lines


def _shown(var: str, value: str) -> str:
    if var in SECRET_VARIABLES and var.endswith("_DSN"):
        return redact_dsn(value)
    if var in SECRET_VARIABLES or (
        var.startswith(kafka_properties.PASSTHROUGH_PREFIX)
        and kafka_properties.is_secret(kafka_properties.property_of(var))
    ):
        return HIDDEN
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


def cmd_config_check(settings: Settings, args: argparse.Namespace) -> int:
    checks = run_checks(settings)
    if args.output == "json":
        print_json_lines([dataclasses.asdict(check) for check in checks])
    for check in checks if args.output == "text" else ():
        state = "FAIL" if not check.ok else "WARN" if check.warning else "ok  "
        print(f"{state}  {check.name}: {check.detail}")
    return EXIT_OK if all(c.ok for c in checks) else EXIT_FAILED
