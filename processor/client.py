"""A small Python client of Ductor: what a program (or the ``ductor`` command line) calls to
drive workflow runs from outside the processors.

Failures are ``ClientError`` (a RuntimeError) with a one-sentence message.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
from confluent_kafka import Producer

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.io.config import Settings
from processor.io.kafka import choose_partition, produce, producer_config, topic_partitions
from processor.io.logs import first_line
from processor.io.runs_admin import insert_runs
from processor.io.store import Definitions


class ClientError(RuntimeError):
    """An operation that could not be done; the message says why, in one sentence."""


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


def start_runs(
    settings: Settings,
    workflow: str,
    run_ids: Sequence[str],
    run_input: Any = None,
    tier: str = "t1",
    version: int | None = None,
) -> list[str]:
    """Insert the runs (idempotently) and produce their first wakeups. Returns the new ids."""
    with connect(settings) as conn:
        definitions = Definitions()
        wf = (
            definitions.get(conn, (workflow, version))
            if version
            else definitions.latest(conn, workflow)
        )
        inserted: list[str] = []
        for start in range(0, len(run_ids), 5000):
            chunk = run_ids[start : start + 5000]
            inserted += insert_runs(conn, wf, [(r, run_input or {}) for r in chunk], tier)
    # A repeated start wakes the run again; its tick is then a no-op.
    wake(settings, run_ids, tier, "start")
    return inserted


def wake(settings: Settings, run_ids: Sequence[str], tier: str, reason: str) -> None:
    """Produce a wakeup for each run on its tier's wakeup topic and wait for the broker's
    acknowledgement (ClientError after 30 s)."""
    producer = Producer(producer_config(settings, "ductor-cli"))
    topic = TopicNames(settings.topic_prefix).wakeup(tier)
    partitions = topic_partitions(producer, [topic])[topic]
    now_ms = int(time.time() * 1000)
    for run_id in run_ids:
        wakeup = Wakeup(run_id=run_id, reason=reason, produced_at=now_ms)
        partition = choose_partition(run_id, partitions, settings.partition_by_run)
        produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
    if producer.flush(30) != 0:
        raise ClientError(f"the broker did not acknowledge every {reason} wakeup within 30 s")
