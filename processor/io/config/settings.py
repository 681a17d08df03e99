"""One typed settings object, built once at start from ``DUCTOR_*`` environment variables.

Every value is validated here so a bad configuration fails before anything connects, with a
message that names the variable to fix: a value out of range, settings that contradict each
other, a ``DUCTOR_*`` name that no part of Ductor reads (with the nearest known one), a
``DUCTOR_KAFKA_*`` property the project sets itself (io/config/kafka_properties.py). A secret may
come from a file (``DUCTOR_PG_DSN_FILE``, ``DUCTOR_KAFKA_SASL_PASSWORD_FILE``). Nothing else in the
package reads ``DUCTOR_*`` variables (``OTEL_*`` ones are read by io/config/otel.py and the
OpenTelemetry SDK).
"""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from processor.core.scopes import Scope, format_scope_list, parse_scope_list
from processor.io.config import kafka_properties
from processor.io.config.kafka_properties import PASSTHROUGH_PREFIX as KAFKA_PASSTHROUGH_PREFIX

# librdkafka properties can be passed through as DUCTOR_KAFKA_<PROPERTY>, with dots written as
# underscores (DUCTOR_KAFKA_SECURITY_PROTOCOL=SASL_SSL -> security.protocol=SASL_SSL).
HIDDEN = "***"  # what is shown in place of a secret


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
    # The step workers' own DSN (a login role in the ductor_worker group, which may claim,
    # record and read what steps need, nothing else: docs/operations/access.md); empty: pg_dsn.
    worker_pg_dsn: str = field(default="", repr=False)
    topic_prefix: str = "ductor"
    wakeup_partitions: int = 6
    delay_partitions: int = 6  # keep equal to wakeup_partitions: see group_protocol
    step_partitions: int = 12
    dlq_partitions: int = 1
    # Of the topics `ductor topics create` makes; 0: min(3, brokers in the cluster).
    replication_factor: int = 0
    # Of the topics it makes; 0: 2 where they have 3 replicas or more, else 1.
    min_insync_replicas: int = 0
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
    # A signal read from ductor.requests for a run that does not exist is kept this long for
    # its start (the two may race), then dead-lettered as unknown_run; a cancel is kept until
    # its start comes, however late (io/postgres/kept_signals.py).
    kept_signal_ttl_s: float = 300.0
    # What the requests topic may ask for (core/scopes.py): the workflows a start may name,
    # the prefixes every run id (started or signalled) must begin with, the signals it may
    # send. None (written "*"): any, the default: unscoped, as before scopes existed; ():
    # none. A request outside them is a not_allowed dead letter.
    requests_workflows: tuple[str, ...] | None = None
    requests_run_id_prefixes: tuple[str, ...] | None = None
    requests_signals: tuple[str, ...] | None = None
    # How often a processor reads the triggers again (a new one is followed this long after
    # `ductor triggers create` at most).
    trigger_refresh_s: float = 5.0
    # An instance (processor or worker) whose heartbeat in Postgres is older than this is
    # gone: the outbox rows it owns are relayed, the step attempts it started may run again
    # (io/postgres/instances.py). Heartbeats are written every second (a fifth of this, if shorter).
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
    # reading (io/kafka/group_watch.py). 0: never.
    group_stall_s: float = 30.0
    # A step worker's stable name (a StatefulSet pod's, a systemd unit instance's): its
    # consumer is then a static member of the workers' group (``group.instance.id``), so a
    # worker started again under the same name takes its partitions back without the group
    # moving them. Empty: a dynamic member. Two live workers must not share a name.
    worker_name: str = ""
    # How long the broker waits for a silent worker before its partitions go to the others
    # (what a dead worker's queued tasks wait: docs/operations/workers.md#membership-and-failover):
    # the workers' group's ``consumer.session.timeout.ms`` (set by each worker at start) under
    # the consumer protocol, the consumer's ``session.timeout.ms`` under classic. 0: the
    # broker's (consumer) or Ductor's 10 s (classic).
    worker_session_timeout_ms: int = 6000
    # Tests only: fault-injection points to arm (see io/runtime/faults.py). Empty in production.
    test_faults: str = ""
    # Tests only: this process's wall clock runs this far ahead (negative: behind), as a
    # machine whose clock drifted would (io/runtime/faults.py, ``skew_wall_clock``). 0 in
    # production.
    test_clock_ahead_ms: int = 0
    # `ductor ui`'s token: who gives it may retry and cancel runs from the web page; empty:
    # the page is read-only. A secret (never shown, or read from DUCTOR_UI_TOKEN_FILE).
    ui_token: str = field(default="", repr=False)
    # The names (Host headers) `ductor ui` answers to; empty: the address it is bound to, and
    # this machine's loopback names when that is a loopback address (processor/ui/hosts.py).
    ui_allowed_hosts: tuple[str, ...] = ()
    # Whether reading the web page needs the token too, not only retry and cancel.
    ui_read_token_required: bool = False
    # How much history one look of the web page reads (runs created, dead letters written):
    # this long back from its Until when the form gives no Since, and at most the maximum.
    ui_window_s: float = 86400.0
    ui_max_window_s: float = 7 * 86400.0
    kafka_extra: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_together(self)

    @property
    def worker_group_id(self) -> str:
        """The step workers' consumer group: the coordinator's group id, then ``-workers``."""
        return f"{self.group_id}-workers"

    @property
    def requests_scope(self) -> Scope:
        """What a record of the requests topic may ask for (core/scopes.py)."""
        return Scope(
            "the requests topic (DUCTOR_REQUESTS_*)",
            self.requests_workflows,
            self.requests_run_id_prefixes,
            self.requests_signals,
        )

    @property
    def pg_dsn_redacted(self) -> str:
        return redact_dsn(self.pg_dsn)

    @property
    def worker_dsn(self) -> str:
        """The DSN a step worker connects with: DUCTOR_WORKER_PG_DSN, else DUCTOR_PG_DSN."""
        return self.worker_pg_dsn or self.pg_dsn

    def for_worker(self) -> Settings:
        """These settings as a step worker uses them: its own DSN as ``pg_dsn`` (so nothing
        of the worker reaches Postgres as the coordinator), no other one kept."""
        return replace(self, pg_dsn=self.worker_dsn, worker_pg_dsn="")

    def kafka_common(self) -> dict[str, str | int | float | bool]:
        """librdkafka properties shared by every client (security settings pass through here)."""
        return {**self.kafka_extra, "bootstrap.servers": self.bootstrap_servers}

    def kafka_redacted(self) -> dict[str, object]:
        return redact_kafka(self.kafka_common())

    def redacted(self) -> dict[str, object]:
        """Every field, each secret hidden (``***``, the DSN's password only)."""
        return {f.name: _redacted_field(f.name, getattr(self, f.name)) for f in fields(self)}

    def __repr__(self) -> str:
        # dataclass keeps this one: a Settings printed, logged or in a traceback's locals never
        # shows a secret, whatever field holds it.
        shown = ", ".join(f"{name}={value!r}" for name, value in self.redacted().items())
        return f"Settings({shown})"


def redact_kafka(properties: Mapping[str, object]) -> dict[str, object]:
    """librdkafka properties with each secret one's value hidden (kafka_properties.is_secret)."""
    return {k: (HIDDEN if kafka_properties.is_secret(k) else v) for k, v in properties.items()}


def _redacted_field(name: str, value: object) -> object:
    if name == "kafka_extra" and isinstance(value, Mapping):
        return redact_kafka(value)
    if _variable(name) not in SECRET_VARIABLES:
        return value
    if name.endswith("dsn") and isinstance(value, str):
        return redact_dsn(value)
    return HIDDEN if value else value


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
    """One of ``choices``, in any case (``info`` is ``INFO``), given back as written there."""
    by_folded = {c.casefold(): c for c in choices}

    def parse(name: str, raw: str) -> str:
        choice = by_folded.get(raw.strip().casefold())
        if choice is None:
            raise ConfigError(f"{name}={raw!r} must be one of {', '.join(choices)}")
        return choice

    return parse


def _parse_dsn(name: str, raw: str) -> str:
    if not raw.strip():
        raise ConfigError(
            f"{name} is empty: set it to a Postgres DSN such as postgresql://user:pw@host:5432/db"
        )
    if "://" in raw and not raw.startswith(("postgresql://", "postgres://")):
        raise ConfigError(f"{name}={redact_dsn(raw)!r} must start with postgresql://")
    return raw


def _parse_optional_dsn(name: str, raw: str) -> str:
    """A DSN, or empty (another setting stands for it)."""
    return _parse_dsn(name, raw) if raw.strip() else ""


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


def _parse_optional_name(name: str, raw: str) -> str:
    """A name as ``_parse_name`` reads it, or empty (none)."""
    return _parse_name(name, raw) if raw else ""


def _parse_session_timeout(name: str, raw: str) -> int:
    """0 (the broker's, or the client's default), or a session timeout in milliseconds."""
    value = _parse_int(name, raw, 0, 1_800_000)
    if 0 < value < 1000:
        raise ConfigError(f"{name}={raw!r} must be 0 (the broker's) or at least 1000 ms")
    return value


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


# The longest window DUCTOR_UI_MAX_WINDOW_S may give: a year (the page reads what it shows
# through time-ordered indexes and offsets; a search beyond is `ductor runs list`'s).
UI_WINDOW_LIMIT_S = 366 * 86400.0

_FAULT = r"[a-z_.]+=([a-z]+(@\d+)?|raise:[^,\s]+)"


def _parse_faults(name: str, raw: str) -> str:
    if not re.fullmatch(rf"({_FAULT})?(,{_FAULT})*", raw):
        raise ConfigError(
            f"{name}={raw!r} must look like after_commit=kill@3 or tick=raise:RUN_ID (tests only)"
        )
    return raw


# A token a person types once; shorter ones could be guessed by trying (the page limits the
# tries, processor/ui/login_limit.py, but a long token is what makes guessing hopeless).
UI_TOKEN_MIN_LENGTH = 16


def _parse_token(name: str, raw: str) -> str:
    """Empty (no token), or at least UI_TOKEN_MIN_LENGTH printable ASCII characters."""
    if raw and (len(raw) < UI_TOKEN_MIN_LENGTH or not (raw.isascii() and raw.isprintable())):
        raise ConfigError(
            f"{name} must be at least {UI_TOKEN_MIN_LENGTH} printable ASCII characters"
            " (e.g. the output of `openssl rand -hex 24`), or empty for a read-only page"
        )
    return raw


def _parse_hosts(name: str, raw: str) -> tuple[str, ...]:
    """Comma-separated host names or IP addresses (an IPv6 one with or without its brackets),
    ``*.domain`` for every name under a domain, or ``*`` alone for any name: each as the Host
    header's host part is compared with it (lower case, IPv6 without brackets)."""
    hosts: list[str] = []
    for item in (part.strip().lower() for part in raw.split(",")):
        if not item:
            continue
        if item == "*":
            hosts.append(item)
            continue
        bare = item[1:-1] if item.startswith("[") and item.endswith("]") else item
        domain = bare.removeprefix("*.")
        try:
            hosts.append(str(ipaddress.ip_address(bare)))
            continue
        except ValueError:
            pass
        if len(domain) > 253 or not _HOSTNAME.fullmatch(domain):
            raise ConfigError(
                f"{name}: {item!r} is not a host name, an IP address, *.domain or *"
                " (e.g. ductor.example.com,10.0.0.5)"
            )
        hosts.append(item)
    return tuple(dict.fromkeys(hosts))


def _float_in(minimum: float, maximum: float) -> Callable[[str, str], float]:
    def parse(name: str, raw: str) -> float:
        value = _parse_float(name, raw, minimum)
        if value > maximum:
            raise ConfigError(f"{name}={raw!r} must be at most {maximum:g}")
        return value

    return parse


def _parse_scope(kind: str) -> Callable[[str, str], tuple[str, ...] | None]:
    """A scope's list (core/scopes.py): ``*`` any, empty none, else comma-separated items."""

    def parse(name: str, raw: str) -> tuple[str, ...] | None:
        try:
            return parse_scope_list(kind, raw)
        except ValueError as exc:
            raise ConfigError(
                f"{name}={raw!r}: {exc}; write '*' (any), nothing (none) or a comma-separated list"
            ) from None

    return parse


def _kafka_passthrough(env: Mapping[str, str]) -> dict[str, str]:
    """The librdkafka properties the DUCTOR_KAFKA_* variables give (whether each may be set
    is checked with the other settings: ``_check_together``)."""
    extra: dict[str, str] = {}
    for key, value in env.items():
        if key.startswith(KAFKA_PASSTHROUGH_PREFIX):
            prop = kafka_properties.property_of(key)
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
    ("worker_pg_dsn", _parse_optional_dsn),
    ("topic_prefix", _parse_name),
    ("wakeup_partitions", _int_in(1, 10_000)),
    ("delay_partitions", _int_in(1, 10_000)),
    ("step_partitions", _int_in(1, 10_000)),
    ("dlq_partitions", _int_in(1, 10_000)),
    ("replication_factor", _int_in(0, 32)),
    ("min_insync_replicas", _int_in(0, 32)),
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
    ("kept_signal_ttl_s", _float_min(1.0)),
    ("requests_workflows", _parse_scope("workflows")),
    ("requests_run_id_prefixes", _parse_scope("run_id_prefixes")),
    ("requests_signals", _parse_scope("signals")),
    ("trigger_refresh_s", _float_min(0.1)),
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
    ("worker_name", _parse_optional_name),
    ("worker_session_timeout_ms", _parse_session_timeout),
    ("test_faults", _parse_faults),
    ("test_clock_ahead_ms", _int_in(-86_400_000, 86_400_000)),
    ("ui_token", _parse_token),
    ("ui_allowed_hosts", _parse_hosts),
    ("ui_read_token_required", _parse_bool),
    ("ui_window_s", _float_in(60.0, UI_WINDOW_LIMIT_S)),
    ("ui_max_window_s", _float_in(60.0, UI_WINDOW_LIMIT_S)),
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
    if value is None or isinstance(value, tuple):  # a scope's or a host list: None is any
        return format_scope_list(value)
    return str(value)


# -- names: every DUCTOR_* variable any part of Ductor reads -----------------------------------

SETTING_VARIABLES: tuple[str, ...] = tuple(_variable(name) for name, _ in _FIELDS)

# The settings whose value is a secret: never shown or logged whole, and each may be read from
# a file named by <VARIABLE>_FILE instead (a mounted Kubernetes or Docker secret).
SECRET_VARIABLES: tuple[str, ...] = (
    "DUCTOR_PG_DSN",
    "DUCTOR_WORKER_PG_DSN",
    "DUCTOR_UI_TOKEN",
    *sorted(kafka_properties.variable_for(p) for p in kafka_properties.SECRET_PROPERTIES),
)
FILE_SUFFIX = "_FILE"

# DUCTOR_* variables read by other programs than the ``ductor`` command, which must not be
# refused when they share its environment: name -> who reads it.
READ_ELSEWHERE: Mapping[str, str] = {
    "DUCTOR_INFRA": "infra/local.py (local or docker) and the tests",
    "DUCTOR_INFRA_DIR": "infra/local.py (where the local services live)",
    "DUCTOR_LOCAL_KAFKA_PORT": "infra/local.py and infra/compose.yaml",
    "DUCTOR_LOCAL_KAFKA_CONTROLLER_PORT": "infra/local.py",
    "DUCTOR_LOCAL_KAFKA_SASL_PORT": "infra/local.py",
    "DUCTOR_LOCAL_KAFKA_BROKERS": "infra/local.py",
    "DUCTOR_LOCAL_PG_PORT": "infra/local.py and infra/compose.yaml",
    # At import: the pure-Python modules instead of the compiled ones; at build: a pure wheel.
    "DUCTOR_PURE_PYTHON": "processor/__init__.py (at import) and setup.py (at build)",
    # `make test`: the build each test run must be on, and where it built the wheel.
    "DUCTOR_EXPECT_BUILD": "the tests (tests/unit/test_build.py), set by the Makefile",
    "DUCTOR_TEST_DIST": "the tests (tests/integration/background_builds.py), set by the Makefile",
    # The database the tests' and the chaos run's step modules count executions in.
    "DUCTOR_TEST_EXECUTION_LOG": "the tests' and the chaos run's steps (tools/chaos_steps.py)",
}

KNOWN_VARIABLES: frozenset[str] = frozenset(
    {*SETTING_VARIABLES, *(v + FILE_SUFFIX for v in SECRET_VARIABLES), *READ_ELSEWHERE}
)
# Any name with this prefix is a librdkafka property (the client itself refuses one it does
# not know, when the command creates it).
KNOWN_PREFIXES: tuple[str, ...] = (KAFKA_PASSTHROUGH_PREFIX,)


def is_known_variable(name: str) -> bool:
    return name in KNOWN_VARIABLES or name.startswith(KNOWN_PREFIXES)


def _check_names(env: Mapping[str, str]) -> None:
    """Refuse the ``DUCTOR_*`` names nothing reads (a misspelt setting would otherwise be
    ignored without a word), each with the nearest known name."""
    unknown = sorted(k for k in env if k.startswith("DUCTOR_") and not is_known_variable(k))
    if not unknown:
        return
    known = {v.removeprefix("DUCTOR_"): v for v in KNOWN_VARIABLES}
    clauses = []
    for name in unknown:
        # Compared without the prefix every name shares, which would make any two look alike.
        close = difflib.get_close_matches(name.removeprefix("DUCTOR_"), sorted(known), n=1)
        hint = f" (did you mean {known[close[0]]}?)" if close else ""
        clauses.append(f"{name} is not a setting of Ductor{hint}")
    raise ConfigError("; ".join(clauses) + "; `ductor config show` lists the settings")


# -- secrets from files -------------------------------------------------------------------------


def _strip_newline(text: str) -> str:
    """A file's content without its one trailing newline (``echo secret > file`` adds one)."""
    if text.endswith("\r\n"):
        return text[:-2]
    return text[:-1] if text.endswith("\n") else text


def _with_secret_files(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with each ``<SECRET>_FILE`` replaced by ``<SECRET>`` holding the file's content."""
    resolved = dict(env)
    for var in SECRET_VARIABLES:
        file_var = var + FILE_SUFFIX
        path = resolved.pop(file_var, None)
        if path is None:
            continue
        if var in env:
            raise ConfigError(f"{var} and {file_var} are both set: keep one of them")
        try:
            with open(path, encoding="utf-8") as f:
                resolved[var] = _strip_newline(f.read())
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ConfigError(f"{file_var}={path!r} cannot be read: {why}") from None
    return resolved


def secret_file_warnings(env: Mapping[str, str] | None = None) -> list[str]:
    """A sentence for each ``<SECRET>_FILE`` that users other than its owner may read (its
    group or everyone): whoever shares the machine or the volume can read the secret. Warned,
    not refused (a file the process cannot stat is load_settings' refusal)."""
    given = os.environ if env is None else env
    warnings: list[str] = []
    for var in SECRET_VARIABLES:
        path = given.get(var + FILE_SUFFIX)
        if path is None:
            continue
        try:
            mode = os.stat(path).st_mode
        except OSError:
            continue
        readers = [
            w for w, bit in (("its group", stat.S_IRGRP), ("others", stat.S_IROTH)) if mode & bit
        ]
        if readers:
            warnings.append(
                f"{var}{FILE_SUFFIX}={path!r} is readable by {' and '.join(readers)}"
                f" (mode {stat.S_IMODE(mode):04o}): make it readable by its owner only"
                " (chmod 600, or a secret volume's defaultMode)"
            )
    return warnings


# -- settings that depend on each other ---------------------------------------------------------


def _check_together(settings: Settings) -> None:
    """What no single variable shows: values that contradict each other or the code."""
    if settings.delay_partitions != settings.wakeup_partitions:
        raise ConfigError(
            f"DUCTOR_DELAY_PARTITIONS={settings.delay_partitions} differs from"
            f" DUCTOR_WAKEUP_PARTITIONS={settings.wakeup_partitions}: a run's wakeups and its"
            " delayed wakeups go to the same partition number of each topic, so that one"
            " instance owns them all; make them equal"
        )
    if settings.metrics_port and settings.metrics_port == settings.health_port:
        raise ConfigError(
            f"DUCTOR_METRICS_PORT and DUCTOR_HEALTH_PORT are both {settings.metrics_port}: the"
            " metrics and health servers need a port each"
        )
    for prop in settings.kafka_extra:
        refused = kafka_properties.refusal(prop, settings.group_protocol)
        if refused is not None:
            raise ConfigError(refused)
    if settings.worker_name and "group.instance.id" in settings.kafka_extra:
        raise ConfigError(
            "DUCTOR_WORKER_NAME and DUCTOR_KAFKA_GROUP_INSTANCE_ID are both set: a worker's"
            " group.instance.id is its name; keep DUCTOR_WORKER_NAME"
        )
    _check_ui(settings)


def _check_ui(settings: Settings) -> None:
    if settings.ui_read_token_required and not settings.ui_token:
        raise ConfigError(
            "DUCTOR_UI_READ_TOKEN_REQUIRED is true but no DUCTOR_UI_TOKEN is set: the page"
            " would let nobody read it; set the token (or DUCTOR_UI_TOKEN_FILE)"
        )
    if settings.ui_window_s > settings.ui_max_window_s:
        raise ConfigError(
            f"DUCTOR_UI_WINDOW_S={settings.ui_window_s:g} is longer than"
            f" DUCTOR_UI_MAX_WINDOW_S={settings.ui_max_window_s:g}: the page's default window"
            " must fit in its largest one"
        )


# -- loading ------------------------------------------------------------------------------------


def load_settings(env: Mapping[str, str] | None = None) -> Settings:
    """Build the settings from ``env`` (default: the process environment) or raise ConfigError."""
    given = os.environ if env is None else env
    _check_names(given)
    source = _with_secret_files(given)
    values: dict[str, object] = {}
    for field_name, parse in _FIELDS:
        var = _variable(field_name)
        raw = source.get(var)
        if raw is not None:
            values[field_name] = parse(var, raw)
    values["kafka_extra"] = _kafka_passthrough(source)
    return replace(Settings(), **values)  # type: ignore[arg-type]


def setting_sources(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Where each variable's value comes from: ``default``, ``env``, or ``file <path>`` (every
    setting, and each ``DUCTOR_KAFKA_*`` property given)."""
    given = os.environ if env is None else env
    sources: dict[str, str] = {}
    for var in SETTING_VARIABLES:
        sources[var] = "default"
    for var in sorted(given):
        if var in sources or var.startswith(KAFKA_PASSTHROUGH_PREFIX):
            sources[var] = "env"
    for var in SECRET_VARIABLES:
        path = given.get(var + FILE_SUFFIX)
        if path is not None:
            sources.pop(var + FILE_SUFFIX, None)
            sources[var] = f"file {path}"
    return sources


def settings_env(settings: Settings) -> dict[str, str]:
    """The ``DUCTOR_*`` variables that give these settings through ``load_settings``: every
    setting, defaults included (see ``child_env``)."""
    env = {_variable(name): _format(getattr(settings, name)) for name, _ in _FIELDS}
    for prop, value in settings.kafka_extra.items():
        var = kafka_properties.variable_for(prop)
        if not prop or kafka_properties.property_of(var) != prop:
            raise ConfigError(
                f"librdkafka property {prop!r} cannot be written as a {KAFKA_PASSTHROUGH_PREFIX}*"
                " variable (lower case, dots, no underscores)"
            )
        env[var] = str(value)
    return env


def child_env(settings: Settings, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a child process that must run with exactly ``settings``: ``base``
    (default: this process's environment) without any variable ``load_settings`` reads (a
    ``DUCTOR_PG_DSN_FILE`` beside the ``DUCTOR_PG_DSN`` given would be refused, a
    ``DUCTOR_KAFKA_*`` property not among the settings would be added), plus
    ``settings_env``."""
    given = os.environ if base is None else base
    read_here = {*SETTING_VARIABLES, *(v + FILE_SUFFIX for v in SECRET_VARIABLES)}
    env = {
        k: v
        for k, v in given.items()
        if k not in read_here and not k.startswith(KAFKA_PASSTHROUGH_PREFIX)
    }
    env.update(settings_env(settings))
    return env
