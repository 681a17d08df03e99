"""What one hop cannot go below on this machine's broker and Postgres: the floor under the idle
latency (bench_latency.py). `python -m processor.tools.bench_floor [N]`.

- a Kafka round trip: one record produced (and flushed) until a consumer assigned to its
  partition has it, with the fetch settings of the processor's consumer (a fetch waits for
  64 KiB or 10 ms) and with the client's defaults (a fetch answered with the first record);
- a Postgres commit of a one-row UPDATE, with ``synchronous_commit`` as the project's local
  Postgres sets it (``off``: the commit returns before its WAL is flushed) and with ``on``
  (Postgres's default, what a production database usually keeps): the WAL flush on the commit
  path.

Each is the median and p99 of N tries, one at a time.
"""

from __future__ import annotations

import sys
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from processor.io.config.settings import Settings, load_settings
from processor.io.kafka.configs import admin_config, consumer_config
from processor.io.kafka.logs import with_logger
from processor.tools.latency_figures import Percentiles


def kafka_round_trip(settings: Settings, tries: int, processor_fetch: bool) -> Percentiles:
    """Produce one record at a time; the time until the consumer returns it, in ms."""
    topic = f"ductor-floor-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(with_logger(admin_config(settings, "floor")))
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    fetch: dict[str, Any] = consumer_config(settings, "floor") if processor_fetch else {}
    consumer = Consumer(
        with_logger(
            {
                **settings.kafka_common(),
                "group.id": f"floor-{topic}",
                "enable.auto.commit": False,
                **{k: v for k, v in fetch.items() if k.startswith("fetch.")},
            }
        )
    )
    producer = Producer(with_logger({**settings.kafka_common(), "linger.ms": 0}))
    try:
        consumer.assign([KafkaTopicPartition(topic, 0, 0)])
        took = []
        for i in range(tries + 5):  # the first few connect and fetch metadata
            started = time.perf_counter()
            producer.produce(topic, str(i).encode(), partition=0)
            producer.flush(10)
            while (message := consumer.poll(10)) is None or message.error() is not None:
                pass
            if i >= 5:
                took.append((time.perf_counter() - started) * 1000)
        return Percentiles.of(took)
    finally:
        consumer.close()
        for future in admin.delete_topics([topic]).values():
            future.result(30)


def postgres_commit(dsn: str, tries: int, synchronous_commit: str) -> Percentiles:
    """A one-row UPDATE committed on its own, one at a time, in ms."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"SET synchronous_commit = {synchronous_commit}")
        conn.execute("CREATE TABLE IF NOT EXISTS ductor_floor_row (id int PRIMARY KEY, n int)")
        conn.execute("INSERT INTO ductor_floor_row VALUES (1, 0) ON CONFLICT DO NOTHING")
        return _timed(
            lambda: conn.execute("UPDATE ductor_floor_row SET n = n + 1 WHERE id = 1"), tries
        )


def _timed(call: Callable[[], object], tries: int) -> Percentiles:
    took = []
    for _ in range(tries):
        started = time.perf_counter()
        call()
        took.append((time.perf_counter() - started) * 1000)
    return Percentiles.of(took)


def floor_lines(settings: Settings, tries: int) -> list[str]:
    """The report's lines: each hop's floor, p50 / p99 ms."""
    rows = [
        ("Kafka round trip, the processor's fetch", kafka_round_trip(settings, tries, True)),
        ("Kafka round trip, a fetch answered at once", kafka_round_trip(settings, tries, False)),
        ("Postgres commit, synchronous_commit=off", postgres_commit(settings.pg_dsn, tries, "off")),
        ("Postgres commit, synchronous_commit=on", postgres_commit(settings.pg_dsn, tries, "on")),
    ]
    lines = [f"the floor of one hop, {tries} tries each (ms)       p50      p99"]
    lines += [f"  {what:<44} {p.p50:>6.2f}  {p.p99:>7.2f}" for what, p in rows]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    print("\n".join(floor_lines(load_settings(), int(args[0]) if args else 200)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
