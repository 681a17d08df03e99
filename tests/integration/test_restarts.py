"""infra/local.py restarts a service on its data: what was acknowledged before a crash of the
broker or an immediate restart of the database is still there afterwards."""

from __future__ import annotations

import uuid
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from infra.local import StopMode
from processor.io.config.settings import Settings

from .restarts import LocalInfra
from .waiting import wait_for

pytestmark = pytest.mark.integration


def test_a_record_an_offset_and_a_row_survive_restarts_on_the_same_data(
    settings: Settings, pg: psycopg.Connection[Any], local_infra: LocalInfra
) -> None:
    topic = f"{settings.topic_prefix}.steps"
    value = uuid.uuid4().hex.encode()
    producer = Producer({**settings.kafka_common(), "enable.idempotence": True})
    producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0
    group = f"restart-{uuid.uuid4().hex[:6]}"
    consumer = Consumer({**settings.kafka_common(), "group.id": group})
    consumer.commit(offsets=[KafkaTopicPartition(topic, 0, 1)], asynchronous=False)
    consumer.close()

    pg.execute("CREATE TABLE IF NOT EXISTS test_restart_probe (value text PRIMARY KEY)")
    # A durable commit (the local server's default is asynchronous commit, which an immediate
    # restart may roll back): what the row proves is that the data directory was kept.
    with pg.transaction():
        pg.execute("SET LOCAL synchronous_commit = on")
        pg.execute("INSERT INTO test_restart_probe VALUES (%s)", (value.decode(),))

    kafka_down_s = local_infra.restart_kafka(keep_data=True, mode=StopMode.KILL)
    pg_down_s = local_infra.restart_postgres(mode=StopMode.IMMEDIATE)
    print(f"kafka back {kafka_down_s:.1f} s after SIGKILL, postgres {pg_down_s:.1f} s")

    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT value FROM test_restart_probe WHERE value = %s", (value.decode(),)
        ).fetchone()
        conn.execute("DROP TABLE test_restart_probe")
    assert row == (value.decode(),)

    reader = Consumer({**settings.kafka_common(), "group.id": group})
    try:
        committed: list[KafkaTopicPartition] = []

        def read_committed() -> bool:
            # A broker started a moment ago may not coordinate the group yet: it says so
            # (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS) until it has loaded its offsets.
            try:
                committed[:] = reader.committed([KafkaTopicPartition(topic, 0)], timeout=10)
            except KafkaException:
                return False
            return True

        wait_for(read_committed, 60, "the group's coordinator to answer")
        assert committed[0].offset == 1, "the group's committed offset was lost"
        reader.assign([KafkaTopicPartition(topic, 0, 0)])  # from the start: the record itself
        seen: list[bytes] = []

        def read() -> bool:
            message = reader.poll(0.2)
            if message is not None and message.error() is None:
                seen.append(message.value() or b"")
            return bool(seen)

        wait_for(read, 60, "the record written before the restart")
    finally:
        reader.close()
    assert seen == [value]
