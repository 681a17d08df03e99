"""What the client's operations share: the connection to Postgres, the checks of what
enters (each bound as a processor checks it), and producing wakeups and requests to Kafka."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

from processor.client.errors import ClientError, InvalidArgument, OutOfBounds, ReservedRunId
from processor.client.kept import kept_connection, kept_producer, partition_count
from processor.core.bounds import json_problem, text_problem
from processor.core.envelope import MAX_RUN_ID_LENGTH, Rejected, Wakeup
from processor.core.outcomes import DeadLetterReason
from processor.core.requests import (
    MAX_NAME_LENGTH,
    Request,
    decode_request,
    request_key,
)
from processor.core.routing import TIERS, TopicNames
from processor.io.config.settings import Settings
from processor.io.kafka.clients import choose_partition, produce, topic_partitions
from processor.io.kafka.configs import producer_config
from processor.io.kafka.logs import ClientLog, pid_retry, with_logger
from processor.io.telemetry.logs import first_line


def connect(settings: Settings) -> psycopg.Connection[Any]:
    """An autocommit connection to the settings' Postgres, or ClientError naming the DSN
    (its password hidden)."""
    try:
        return psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise ClientError(
            f"cannot connect to Postgres at {settings.pg_dsn_redacted} ({first_line(exc)});"
            " is it running (make up) and is DUCTOR_PG_DSN right?"
        ) from None


@contextmanager
def connection(settings: Settings) -> Iterator[psycopg.Connection[Any]]:
    """A connection for one operation of the client: kept from an earlier one when there is
    one (client/kept.py), else new (``connect``); kept for the next afterwards."""
    with kept_connection(settings.pg_dsn, lambda: connect(settings)) as conn:
        yield conn


def check_json(name: str, value: Any) -> None:
    problem = json_problem(value)
    if problem is not None:
        raise OutOfBounds(problem.describe(name) + "; nothing was written")


def check_text(name: str, value: str, most: int) -> None:
    if not 1 <= len(value) <= most:
        raise InvalidArgument(f"{name} must be 1 to {most} characters, not {len(value)}")
    problem = text_problem(value, most)
    if problem is not None:
        raise OutOfBounds(f"{name} {problem}")


def wake(settings: Settings, run_ids: Sequence[str], tier: str, reason: str) -> None:
    """Produce a wakeup for each run on its tier's wakeup topic and wait for the broker's
    acknowledgement (ClientError after 30 s)."""
    topic = TopicNames(settings.topic_prefix).wakeup(tier)
    now_ms = int(time.time() * 1000)
    wakeups = [Wakeup(run_id=run_id, reason=reason, produced_at=now_ms) for run_id in run_ids]
    _produce_keyed(
        settings, topic, [(w.run_id, w.key(), w.encode()) for w in wakeups], f"{reason} wakeup"
    )


def produce_requests(settings: Settings, requests: Sequence[Request], what: str) -> None:
    """The requests, each checked as a processor decodes it (InvalidArgument with what is
    wrong, and nothing produced, if one would be dead-lettered: OutOfBounds or ReservedRunId
    for those reasons), produced."""
    records = []
    for request in requests:
        try:
            value = request.encode()
        except TypeError as exc:
            raise InvalidArgument(f"the {what} cannot be written as JSON: {exc}") from None
        decoded = decode_request(value, settings.max_record_bytes)
        if isinstance(decoded, Rejected):
            refusal = _REFUSALS.get(decoded.reason, InvalidArgument)
            raise refusal(
                f"the {what} for run {request.run_id!r} would be dead-lettered by a processor"
                f" ({decoded.reason.value}): {decoded.detail}"
            )
        records.append((request.run_id, request_key(request), value))
    _produce_keyed(settings, TopicNames(settings.topic_prefix).requests, records, what)


# The exception a request refused for these reasons raises (others: InvalidArgument; all are
# refused input, nothing was written: exit 2 from `ductor`, 400 from the HTTP API).
_REFUSALS: dict[DeadLetterReason, type[ClientError]] = {
    DeadLetterReason.OUT_OF_BOUNDS: OutOfBounds,
    DeadLetterReason.RESERVED_RUN_ID: ReservedRunId,
}


# The client's producer's own lines: warnings and errors only. A command's user can do nothing
# with librdkafka's notes (a fresh broker's "coordinator load in progress: retrying", which
# the producer retries by itself, is said at INFO), and its stderr is the command's own.
_CLIENT_LOG = logging.getLogger("ductor.librdkafka.client")
_CLIENT_LOG.setLevel(logging.WARNING)


def _produce_keyed(
    settings: Settings, topic: str, records: Sequence[tuple[str, bytes, bytes]], what: str
) -> None:
    """Produce (run id, key, value) records, each on its run's partition, and wait for the
    broker's acknowledgement of every one (ClientError after 30 s)."""
    producer = kept_producer(
        producer_config(settings, "ductor-cli"),
        lambda config: Producer(with_logger(config, ClientLog(_CLIENT_LOG, expected=pid_retry))),
    )
    try:
        partitions = partition_count(producer, topic, _ask_partitions, time.monotonic())
    except KafkaException as exc:
        raise ClientError(f"the broker cannot be reached: {exc.args[0]}") from None
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    for run_id, key, value in records:
        partition = choose_partition(run_id, partitions, settings.partition_by_run)
        produce(producer, topic, value, key, partition, on_delivery=delivered)
    if producer.flush(30) != 0:
        raise ClientError(f"the broker did not acknowledge every {what} within 30 s")
    if failed:
        raise ClientError(f"{len(failed)} {what}(s) not delivered: {failed[0].str()}")


def _ask_partitions(producer: Producer, topic: str) -> int:
    return topic_partitions(producer, [topic])[topic]


def check_run_id(run_id: str) -> None:
    if not 1 <= len(run_id) <= MAX_RUN_ID_LENGTH:
        raise InvalidArgument(f"a run id is 1 to {MAX_RUN_ID_LENGTH} characters, not {len(run_id)}")
    problem = text_problem(run_id, MAX_RUN_ID_LENGTH)
    if problem is not None:
        raise OutOfBounds(f"the run id {run_id[:60]!r} {problem}")


def check_signal(run_id: str, signal_id: str, payload: Any) -> None:
    check_run_id(run_id)
    check_text("the signal id", signal_id, MAX_NAME_LENGTH)
    check_json("the payload", payload)


def check_tier(tier: str) -> None:
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {', '.join(TIERS)}, not {tier!r}")
