"""``ductor config check``: whether the settings work with the services they name, one check
at a time, each bounded by a short timeout: Postgres answers and its schema is migrated to
this version, the Kafka clients accept their properties, a broker answers (and takes the
credentials), the topics exist with the partition counts the settings give.

Each check gives a ``Check``; a check that cannot run because an earlier one failed (no
database: no schema) says so, and counts as failed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer

from processor.core.routing import TopicNames
from processor.io.config.otel import otel_settings
from processor.io.config.settings import Settings
from processor.io.config.values import ConfigError
from processor.io.config.variables import secret_file_warnings
from processor.io.kafka.clients import refusal_message
from processor.io.kafka.configs import consumer_config, producer_config
from processor.io.kafka.topics import desired_topics
from processor.io.postgres.migrate import MIGRATIONS_TABLE
from processor.io.postgres.workflows import registered_queues
from processor.io.shipped.files import PackageFileMissing, migrations
from processor.io.telemetry.logs import first_line

PG_TIMEOUT_S = 3
KAFKA_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    # Passed, with something to fix all the same (printed WARN; the exit code stays 0).
    warning: bool = False


def run_checks(settings: Settings, clock: Callable[[], float] = time.monotonic) -> list[Check]:
    checks = [_telemetry(), *_secret_files()]
    queues: list[str] = []
    postgres, conn = _postgres(settings, clock)
    checks.append(postgres)
    if conn is None:
        checks.append(Check("schema", False, "not checked: Postgres did not answer"))
        checks.append(_requests_scope(settings, None))
    else:
        with conn:
            checks.append(_schema(conn))
            try:
                queues = registered_queues(conn)
            except psycopg.Error:
                queues = []  # no workflow table yet: the schema check said why
            checks.append(_requests_scope(settings, conn))
    clients, producer, errors = _kafka_clients(settings)
    checks.append(clients)
    if producer is None:
        checks.append(Check("kafka", False, "not checked: the client settings are refused"))
        checks.append(Check("topics", False, "not checked: no Kafka client"))
        return checks
    broker, metadata = _broker(settings, producer, errors, clock)
    checks.append(broker)
    if metadata is None:
        checks.append(Check("topics", False, "not checked: no broker answered"))
    else:
        checks += _topics(settings, metadata, queues)
    return checks


def _telemetry() -> Check:
    try:
        described = otel_settings().describe()
    except ConfigError as exc:
        return Check("telemetry", False, str(exc))
    return Check("telemetry", True, f"traces {described['traces']}, metrics {described['metrics']}")


def _secret_files() -> list[Check]:
    """A warning for each secret file others than its owner may read; nothing when no
    setting is read from a file."""
    return [Check("secret file", True, warning, warning=True) for warning in secret_file_warnings()]


def _postgres(
    settings: Settings, clock: Callable[[], float]
) -> tuple[Check, psycopg.Connection[Any] | None]:
    started = clock()
    try:
        conn = psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=PG_TIMEOUT_S)
    except psycopg.Error as exc:
        return Check(
            "postgres", False, f"cannot connect to {settings.pg_dsn_redacted}: {first_line(exc)}"
        ), None
    info = conn.info
    version = conn.execute("SHOW server_version").fetchone()
    took_ms = (clock() - started) * 1000
    where = f"{info.host}:{info.port}/{info.dbname} as {info.user}"
    detail = f"{where}, PostgreSQL {version[0] if version else '?'} ({took_ms:.0f} ms)"
    return Check("postgres", True, detail), conn


def _schema(conn: psycopg.Connection[Any]) -> Check:
    try:
        known = {m.name for m in migrations()}
    except PackageFileMissing as exc:
        return Check("schema", False, str(exc))
    try:
        applied = {r[0] for r in conn.execute(f"SELECT name FROM {MIGRATIONS_TABLE}").fetchall()}
    except psycopg.errors.UndefinedTable:
        return Check("schema", False, "no migration applied: run `ductor migrate`")
    missing = sorted(known - applied)
    if missing:
        return Check(
            "schema",
            False,
            f"{len(missing)} migration(s) not applied ({', '.join(missing)}): run `ductor migrate`",
        )
    unknown = sorted(applied - known)
    if unknown:
        return Check(
            "schema",
            False,
            f"the database has migration(s) this version of Ductor does not know"
            f" ({', '.join(unknown)}): it is older than the schema",
        )
    return Check("schema", True, f"up to date ({max(applied) if applied else 'none'})")


def _requests_scope(settings: Settings, conn: psycopg.Connection[Any] | None) -> Check:
    """What the requests topic may ask for (docs/requests.md#who-may-do-what); a workflow the
    scope names that is not registered is said (a typo would refuse every start of it)."""
    scope = settings.requests_scope
    detail = scope.describe().split(": ", 1)[1]
    if scope.unscoped:
        detail += (
            ": whoever may write the topic may start and signal anything (DUCTOR_REQUESTS_*"
            " scope it)"
        )
    if conn is not None and scope.workflows:
        try:
            rows = conn.execute(
                "SELECT DISTINCT name FROM eec_workflow_definition WHERE name = ANY(%s)",
                (list(scope.workflows),),
            ).fetchall()
        except psycopg.Error:
            rows = []  # no workflow table yet: the schema check said why
        unknown = sorted(set(scope.workflows) - {r[0] for r in rows})
        if unknown:
            detail += f" (not registered: {', '.join(unknown)})"
    return Check("requests scope", True, detail)


def _quiet(config: dict[str, Any], errors: list[KafkaError]) -> dict[str, Any]:
    # Not registered with logging, and above every level: librdkafka's lines are dropped, the
    # checks say what they found.
    silent = logging.Logger("ductor.kafka.config-check", logging.CRITICAL + 1)
    return {**config, "error_cb": errors.append, "logger": silent}


def _kafka_clients(settings: Settings) -> tuple[Check, Producer | None, list[KafkaError]]:
    errors: list[KafkaError] = []
    try:
        producer = Producer(_quiet(producer_config(settings, "ductor-config-check"), errors))
        Consumer(_quiet(consumer_config(settings, "ductor-config-check"), errors)).close()
    except KafkaException as exc:
        error = exc.args[0] if exc.args else exc
        text = error.str() if isinstance(error, KafkaError) else first_line(exc)
        failed = Check("kafka settings", False, f"{text}; check the DUCTOR_KAFKA_* variables")
        return failed, None, errors
    accepted = Check("kafka settings", True, "the producer and the consumer accept them")
    return accepted, producer, errors


def _broker(
    settings: Settings, producer: Producer, errors: list[KafkaError], clock: Callable[[], float]
) -> tuple[Check, Any]:
    deadline = clock() + KAFKA_TIMEOUT_S
    while clock() < deadline:
        try:
            metadata = producer.list_topics(timeout=0.5)
        except KafkaException:
            metadata = None
        if metadata is not None and metadata.brokers:
            brokers = len(metadata.brokers)
            return Check(
                "kafka",
                True,
                f"{brokers} broker(s) at {settings.bootstrap_servers} answered"
                f" (cluster {metadata.cluster_id})",
            ), metadata
        producer.poll(0.05)
        refused = next((e for e in errors if e.code() == KafkaError._AUTHENTICATION), None)
        if refused is not None:
            return Check("kafka", False, refusal_message(settings, refused.str())), None
    return Check(
        "kafka",
        False,
        f"no broker at {settings.bootstrap_servers} answered within {KAFKA_TIMEOUT_S:g} s",
    ), None


_PARTITION_SETTING = {
    "wakeup": "DUCTOR_WAKEUP_PARTITIONS",
    "delay": "DUCTOR_DELAY_PARTITIONS",
    "steps": "DUCTOR_STEP_PARTITIONS",
    "dlq": "DUCTOR_DLQ_PARTITIONS",
}


def _topics(settings: Settings, metadata: Any, queues: list[str]) -> list[Check]:
    prefix = TopicNames(settings.topic_prefix).prefix
    wanted = desired_topics(settings, queues)
    problems: list[Check] = []
    for topic, partitions in wanted.items():
        kind = topic[len(prefix) + 1 :].split(".")[0]
        meta = metadata.topics.get(topic)
        if meta is None or meta.error is not None or not meta.partitions:
            problems.append(
                Check(f"topic {topic}", False, "does not exist: run `ductor topics create`")
            )
        elif len(meta.partitions) != partitions:
            problems.append(
                Check(
                    f"topic {topic}",
                    False,
                    f"has {len(meta.partitions)} partition(s), {_PARTITION_SETTING[kind]}"
                    f" says {partitions}",
                )
            )
    if problems:
        return problems
    return [
        Check(
            "topics",
            True,
            f"{len(wanted)} topics of prefix {prefix!r} with the configured partition counts",
        )
    ]
