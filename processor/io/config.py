"""One typed settings object, built once at start from ``DUCTOR_*`` environment variables.

Every value is validated here so a bad configuration fails before anything connects, with a
message that names the variable to fix. Nothing else in the package reads the environment
(apart from the OpenTelemetry SDK, which reads the standard ``OTEL_*`` variables itself).
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# librdkafka properties can be passed through as DUCTOR_KAFKA_<PROPERTY>, with dots written as
# underscores (DUCTOR_KAFKA_SECURITY_PROTOCOL=SASL_SSL -> security.protocol=SASL_SSL).
KAFKA_PASSTHROUGH_PREFIX = "DUCTOR_KAFKA_"
SECRET_KAFKA_KEYS = frozenset({"sasl.password", "ssl.key.password", "ssl.keystore.password"})


class ConfigError(ValueError):
    """A configuration value is invalid; the message says which variable and what to do."""


@dataclass(frozen=True)
class TierWeights:
    t0: int
    t1: int
    t2: int
    delay: int

    def as_dict(self) -> dict[str, int]:
        return {"t0": self.t0, "t1": self.t1, "t2": self.t2, "delay": self.delay}


@dataclass(frozen=True)
class Settings:
    bootstrap_servers: str = "127.0.0.1:19092"
    group_id: str = "ductor-coordinator"
    # "consumer" (KIP-848, Kafka 4.0+): incremental rebalances with the broker's range
    # assignor, which gives partition i of every topic to the same instance, so a run's
    # wakeups from every tier and rung meet in one instance when partition counts are equal.
    # "classic": the classic protocol with cooperative-sticky (older brokers).
    group_protocol: str = "consumer"
    pg_dsn: str = "postgresql://ductor:ductor@127.0.0.1:55432/ductor"
    topic_prefix: str = "ductor"
    wakeup_partitions: int = 6
    delay_partitions: int = 6  # keep equal to wakeup_partitions: see group_protocol
    step_partitions: int = 12
    dlq_partitions: int = 1
    replication_factor: int = 1
    batch_size: int = 500
    batch_linger_ms: int = 0  # batches fill on their own while the previous one is in flight
    tier_weights: TierWeights = field(default_factory=lambda: TierWeights(8, 4, 1, 4))
    tier_buffer_limit: int = 5000
    livelock_requeues: int = 8
    stuck_after_s: float = 3600.0
    sweep_interval_s: float = 1.0
    sweep_grace_s: float = 2.0
    sweep_limit: int = 1000
    # Outbox rows (a committed transition's records) left unacknowledged this long are sent
    # again by any instance's relay: their instance died between commit and produce.
    relay_after_s: float = 3.0
    # An instance (processor or worker) whose heartbeat in Postgres is older than this is
    # gone: the outbox rows it owns are relayed, the step attempts it started may run again
    # (io/instances.py). Heartbeats are written every second (a fifth of this, if shorter).
    instance_timeout_s: float = 5.0
    partition_by_run: bool = True
    max_record_bytes: int = 65536
    shutdown_timeout_s: float = 20.0
    log_format: str = "json"
    log_level: str = "INFO"
    metrics_port: int = 0
    stats_log_interval_s: float = 10.0
    health_port: int = 0
    # The address the health and metrics servers listen on: this machine only by default;
    # 0.0.0.0 (or ::) for every interface, e.g. for probes from outside a container.
    http_host: str = "127.0.0.1"
    # /healthz fails once the poll loop has not turned for this long (see health.py).
    health_stall_s: float = 30.0
    # A processor or worker that has read nothing for this long looks at its group as the
    # broker sees it, and joins again with a new client if records wait that it should be
    # reading (io/group_watch.py). 0: never.
    group_stall_s: float = 30.0
    # Tests only: fault-injection points to arm (see io/faults.py). Empty in production.
    test_faults: str = ""
    # Tests only: this process's wall clock runs this far ahead (negative: behind), as a
    # machine whose clock drifted would (io/faults.py, ``skew_wall_clock``). 0 in production.
    test_clock_ahead_ms: int = 0
    kafka_extra: Mapping[str, str] = field(default_factory=dict)

    @property
    def pg_dsn_redacted(self) -> str:
        return redact_dsn(self.pg_dsn)

    def kafka_common(self) -> dict[str, str | int | float | bool]:
        """librdkafka properties shared by every client (security settings pass through here)."""
        return {"bootstrap.servers": self.bootstrap_servers, **self.kafka_extra}

    def kafka_redacted(self) -> dict[str, str | int | float | bool]:
        return {k: ("***" if k in SECRET_KAFKA_KEYS else v) for k, v in self.kafka_common().items()}


# libpq parameters whose value is a secret: the server password and the client key's password.
_SECRET_DSN_KEYS = frozenset({"password", "sslpassword"})
_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def redact_dsn(dsn: str) -> str:
    """The DSN with every password replaced, for logs and error messages.

    The DSN is read by libpq's own parser (through psycopg), so a password is found wherever
    libpq would take it from: a URI's userinfo or ``password`` query parameter, or a (possibly
    quoted) ``password=`` keyword. The result is in keyword form (``user=u password=*** ...``).
    A DSN libpq cannot parse is hidden whole, but for its URI scheme.
    """
    try:
        params = conninfo_to_dict(dsn)
        hidden = {k: ("***" if k in _SECRET_DSN_KEYS else v) for k, v in params.items()}
        return make_conninfo("", **hidden)
    except (psycopg.Error, ValueError, TypeError):
        scheme = _URI_SCHEME.match(dsn)
        return f"{scheme.group(0)}***" if scheme else "***"


def _parse_int(name: str, raw: str, minimum: int, maximum: int | None = None) -> int:
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name}={raw!r} must be {bound}")
    return value


def _parse_float(name: str, raw: str, minimum: float) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not value >= minimum:  # also rejects NaN
        raise ConfigError(f"{name}={raw!r} must be >= {minimum}")
    return value


def _parse_bool(name: str, raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}={raw!r} must be one of true/false/1/0/yes/no/on/off")


def _parse_weights(name: str, raw: str) -> TierWeights:
    parts = raw.split(":")
    if len(parts) not in (3, 4):
        raise ConfigError(f"{name}={raw!r} must look like 8:4:1 (t0:t1:t2) or 8:4:1:4 (with delay)")
    values = [_parse_int(name, p, 1, 1000) for p in parts]
    delay = values[3] if len(values) == 4 else values[1]
    return TierWeights(values[0], values[1], values[2], delay)


def _parse_choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        if raw not in choices:
            raise ConfigError(f"{name}={raw!r} must be one of {', '.join(choices)}")
        return raw

    return parse


def _parse_dsn(name: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(
            f"{name} is empty: set it to a Postgres DSN such as postgresql://user:pw@host:5432/db"
        )
    if "://" in raw and not raw.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{name}={redact_dsn(raw)!r} must start with postgresql://")
    return raw


def _parse_servers(name: str, raw: str) -> str:
    servers = [s.strip() for s in raw.split(",") if s.strip()]
    if not servers:
        raise ConfigError(f"{name} is empty: set it to host:port[,host:port...]")
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ConfigError(f"{name}: {server!r} is not host:port")
    return ",".join(servers)


def _parse_name(name: str, raw: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9._-]{1,200}", raw):
        raise ConfigError(f"{name}={raw!r} may only contain letters, digits, '.', '_' and '-'")
    return raw


# A host name: dot-separated labels of letters, digits and inner hyphens (RFC 1123).
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*")


def _parse_host(name: str, raw: str) -> str:
    """An IPv4 or IPv6 address (without brackets) or a host name, to listen on."""
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        pass
    if len(raw) > 253 or not _HOSTNAME.fullmatch(raw):
        raise ConfigError(
            f"{name}={raw!r} is not an IP address or a host name to listen on"
            " (e.g. 127.0.0.1, 0.0.0.0, ::1)"
        )
    return raw


def _kafka_property(var: str) -> str:
    """The librdkafka property a DUCTOR_KAFKA_<PROPERTY> variable names."""
    return var[len(KAFKA_PASSTHROUGH_PREFIX) :].lower().replace("_", ".")


def _parse_faults(name: str, raw: str) -> str:
    if not re.fullmatch(r"([a-z_.]+=[a-z]+(@\d+)?)?(,[a-z_.]+=[a-z]+(@\d+)?)*", raw):
        raise ConfigError(f"{name}={raw!r} must look like after_commit=kill@3 (tests only)")
    return raw


def _kafka_passthrough(env: Mapping[str, str]) -> dict[str, str]:
    extra: dict[str, str] = {}
    for key, value in env.items():
        if key.startswith(KAFKA_PASSTHROUGH_PREFIX):
            prop = _kafka_property(key)
            if not prop:
                raise ConfigError(f"{key}: name a librdkafka property after the prefix")
            extra[prop] = value
    return extra


def _int_in(minimum: int, maximum: int | None = None) -> Callable[[str, str], int]:
    return lambda n, r: _parse_int(n, r, minimum, maximum)


def _float_min(minimum: float) -> Callable[[str, str], float]:
    return lambda n, r: _parse_float(n, r, minimum)


# Every setting but kafka_extra, with the parser of its DUCTOR_<FIELD> variable. Both
# load_settings and settings_env are built from this one table, so they cannot drift apart.
_FIELDS: tuple[tuple[str, Callable[[str, str], object]], ...] = (
    ("bootstrap_servers", _parse_servers),
    ("group_id", _parse_name),
    ("group_protocol", _parse_choice(("consumer", "classic"))),
    ("pg_dsn", _parse_dsn),
    ("topic_prefix", _parse_name),
    ("wakeup_partitions", _int_in(1, 10_000)),
    ("delay_partitions", _int_in(1, 10_000)),
    ("step_partitions", _int_in(1, 10_000)),
    ("dlq_partitions", _int_in(1, 10_000)),
    ("replication_factor", _int_in(1, 32)),
    ("batch_size", _int_in(1, 100_000)),
    ("batch_linger_ms", _int_in(0, 10_000)),
    ("tier_weights", _parse_weights),
    ("tier_buffer_limit", _int_in(1, 10_000_000)),
    ("livelock_requeues", _int_in(1, 1000)),
    ("stuck_after_s", _float_min(1.0)),
    ("sweep_interval_s", _float_min(0.05)),
    ("sweep_grace_s", _float_min(0.0)),
    ("sweep_limit", _int_in(1, 1_000_000)),
    ("relay_after_s", _float_min(0.5)),
    ("instance_timeout_s", _float_min(1.0)),
    ("partition_by_run", _parse_bool),
    ("max_record_bytes", _int_in(256, 100 * 1024 * 1024)),
    ("shutdown_timeout_s", _float_min(0.5)),
    ("log_format", _parse_choice(("json", "text"))),
    ("log_level", _parse_choice(("DEBUG", "INFO", "WARNING", "ERROR"))),
    ("metrics_port", _int_in(0, 65535)),
    ("stats_log_interval_s", _float_min(0.5)),
    ("health_port", _int_in(0, 65535)),
    ("http_host", _parse_host),
    ("health_stall_s", _float_min(0.1)),
    ("group_stall_s", _float_min(0.0)),
    ("test_faults", _parse_faults),
    ("test_clock_ahead_ms", _int_in(-86_400_000, 86_400_000)),
)


def _variable(field_name: str) -> str:
    return f"DUCTOR_{field_name.upper()}"


def _format(value: object) -> str:
    """A setting's value written the way its parser reads it back."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, TierWeights):
        return f"{value.t0}:{value.t1}:{value.t2}:{value.delay}"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    return str(value)


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from ``env`` (default: the process environment) or raise ConfigError."""
    source = os.environ if env is None else env
    values: dict[str, object] = {}
    for field_name, parse in _FIELDS:
        var = _variable(field_name)
        raw = source.get(var)
        if raw is not None:
            values[field_name] = parse(var, raw)
    values["kafka_extra"] = _kafka_passthrough(source)
    return replace(Settings(), **values)  # type: ignore[arg-type]


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``DUCTOR_*`` variables that give these settings through ``load_settings``: every
    setting, defaults included, so a child process gets exactly them whatever else its
    environment says (except ``DUCTOR_KAFKA_*`` variables not among ``kafka_extra``)."""
    env = {_variable(name): _format(getattr(settings, name)) for name, _ in _FIELDS}
    for prop, value in settings.kafka_extra.items():
        var = KAFKA_PASSTHROUGH_PREFIX + prop.upper().replace(".", "_")
        if not prop or _kafka_property(var) != prop:
            raise ConfigError(
                f"librdkafka property {prop!r} cannot be written as a {KAFKA_PASSTHROUGH_PREFIX}*"
                " variable (lower case, dots, no underscores)"
            )
        env[var] = str(value)
    return env
