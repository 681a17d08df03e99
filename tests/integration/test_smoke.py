"""Smoke tests of the real services: the group protocol, manual offsets, the versioned UPDATE."""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from processor.io.config.settings import Settings
from processor.io.kafka.configs import producer_config
from processor.io.kafka.topics import create_topics, delete_topics, desired_topics
from processor.io.postgres.migrate import migrate

from .waiting import wait_for

pytestmark = pytest.mark.integration


def _consumer(settings: Settings, group: str) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "partition.assignment.strategy": "cooperative-sticky",
        }
    )


def test_group_member_reads_what_a_producer_wrote_and_commits_offsets(settings: Settings) -> None:
    topic = f"{settings.topic_prefix}.steps"
    producer = Producer(
        {"bootstrap.servers": settings.bootstrap_servers, "enable.idempotence": True}
    )
    values = [f"m{i}".encode() for i in range(10)]
    for value in values:
        producer.produce(topic, value=value, partition=0)
    assert producer.flush(30) == 0

    group = f"smoke-{uuid.uuid4().hex[:6]}"
    consumer = _consumer(settings, group)
    consumer.subscribe([topic])
    seen: list[bytes] = []

    def read_all() -> bool:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            seen.append(message.value() or b"")
            consumer.commit(message=message, asynchronous=False)
        return len(seen) >= len(values)

    wait_for(read_all, 60, "the consumer to read the 10 records")
    consumer.close()
    assert seen == values

    # A new member of the same group resumes after the committed offset: nothing is re-read.
    again = _consumer(settings, group)
    committed = again.committed([KafkaTopicPartition(topic, 0)], timeout=10)
    again.close()
    assert committed[0].offset == len(values)


def test_two_writers_race_a_versioned_update_and_exactly_one_wins(
    pg: psycopg.Connection[Any], base_settings: Settings
) -> None:
    pg.execute("DROP TABLE IF EXISTS smoke_race")
    pg.execute("CREATE TABLE smoke_race (id int PRIMARY KEY, v bigint, who text)")
    pg.execute("INSERT INTO smoke_race VALUES (1, 7, NULL)")
    barrier = threading.Barrier(2)
    results: dict[str, int] = {}

    def writer(name: str) -> None:
        with psycopg.connect(base_settings.pg_dsn, autocommit=True) as conn:
            version = conn.execute("SELECT v FROM smoke_race WHERE id = 1").fetchone()
            assert version is not None and version[0] == 7
            barrier.wait(10)  # both have read version 7 before either writes
            cur = conn.execute(
                "UPDATE smoke_race SET v = v + 1, who = %s WHERE id = 1 AND v = %s", (name, 7)
            )
            results[name] = cur.rowcount

    threads = [threading.Thread(target=writer, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(results.values()) == [0, 1]
    row = pg.execute("SELECT v, who FROM smoke_race WHERE id = 1").fetchone()
    assert row is not None
    assert row[0] == 8
    assert results[row[1]] == 1
    pg.execute("DROP TABLE smoke_race")


def test_migrate_and_topic_creation_are_idempotent(settings: Settings) -> None:
    assert migrate(settings.pg_dsn) == []  # already applied by the session fixture
    report = create_topics(settings)  # the fixture created them: a second run creates none
    assert set(report.values()) == {"exists"}


def test_created_topics_take_records_at_once(base_settings: Settings) -> None:
    """Once create_topics returns, every partition is served by its leader: a record the
    idempotent producer sends to each at once is in the log. (The topic is in the metadata a
    moment before its leader has the partitions: a record sent then was once acknowledged
    and never written.)"""
    settings = replace(base_settings, topic_prefix=f"test-{uuid.uuid4().hex[:8]}")
    create_topics(settings)
    try:
        admin = AdminClient({"bootstrap.servers": settings.bootstrap_servers})
        topics = desired_topics(settings)
        everything = [KafkaTopicPartition(t, p) for t, n in topics.items() for p in range(n)]
        latest = OffsetSpec.latest()  # type: ignore[no-untyped-call]
        asked = admin.list_offsets(dict.fromkeys(everything, latest), request_timeout=30)
        unserved = [tp for tp, f in asked.items() if f.exception(timeout=30) is not None]
        assert unserved == []
        producer = Producer(producer_config(settings, "test-created-topics"))
        reports: list[object] = []  # delivery errors, None when delivered
        for tp in everything:
            producer.produce(
                tp.topic, b"x", partition=tp.partition, on_delivery=lambda e, _m: reports.append(e)
            )
        assert producer.flush(60) == 0
        assert [e for e in reports if e is not None] == []
        assert len(reports) == len(everything)  # every record acknowledged
        ends = admin.list_offsets(dict.fromkeys(everything, latest), request_timeout=30)
        written = [tp for tp, f in ends.items() if f.result(timeout=30).offset == 1]
        assert len(written) == len(everything)
    finally:
        delete_topics(settings)
