"""One typed settings object, built once at start from ``DUCTOR_*`` environment variables.

Every value is validated when it is read (each kind's parser in values.py, each variable in
variables.py), so a bad configuration fails before anything connects, with a message that
names the variable to fix: a value out of range, settings that contradict each other (here), a
``DUCTOR_*`` name that no part of Ductor reads (with the nearest known one), a
``DUCTOR_KAFKA_*`` property the project sets itself (io/config/kafka_properties.py). A secret
may come from a file (``DUCTOR_PG_DSN_FILE``, ``DUCTOR_KAFKA_SASL_PASSWORD_FILE``). Nothing
else in the package reads ``DUCTOR_*`` variables (``OTEL_*`` ones are read by
io/config/otel.py and the OpenTelemetry SDK).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

from processor.core.scopes import Scope
from processor.io.config import kafka_properties
from processor.io.config.kafka_properties import PASSTHROUGH_PREFIX as KAFKA_PASSTHROUGH_PREFIX
from processor.io.config.values import (
    HIDDEN,
    ConfigError,
    TierWeights,
    kafka_passthrough,
    redact_dsn,
    redact_kafka,
)
from processor.io.config.variables import (
    FIELDS,
    FILE_SUFFIX,
    SECRET_VARIABLES,
    SETTING_VARIABLES,
    check_names,
    format_value,
    variable,
    with_secret_files,
)


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


def _redacted_field(name: str, value: object) -> object:
    if name == "kafka_extra" and isinstance(value, Mapping):
        return redact_kafka(value)
    if variable(name) not in SECRET_VARIABLES:
        return value
    if name.endswith("dsn") and isinstance(value, str):
        return redact_dsn(value)
    return HIDDEN if value else value


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
    check_names(given)
    source = with_secret_files(given)
    values: dict[str, object] = {}
    for field_name, parse in FIELDS:
        var = variable(field_name)
        raw = source.get(var)
        if raw is not None:
            values[field_name] = parse(var, raw)
    values["kafka_extra"] = kafka_passthrough(source)
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
    env = {variable(name): format_value(getattr(settings, name)) for name, _ in FIELDS}
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
