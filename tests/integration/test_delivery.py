"""At-least-once without holes, against the real broker and database: good records waiting
in a processor's queue are never skipped by the offsets of bad records behind them, through
a rebalance and a SIGKILL in the middle of a flood.

Each good record is a run's only start wakeup, so a lost one would leave its run untouched;
each bad record must reach the dead-letter topic. Postgres is frozen mid-flood (a proxy holds
the processor's connection), so good records pile up waiting while the bad ones behind them
are dead-lettered and acknowledged at once; then a second instance joins, the first gives
partitions back (committing their offsets) and is killed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.io.config import Settings
from processor.io.dlq import read_dead_letters
from processor.io.kafka import produce, producer_config
from processor.io.runs_admin import count_ticked, insert_runs

from .conftest import now_ms, sample_workflow, wait_for
from .proxy import TcpProxy

pytestmark = pytest.mark.integration

GOOD = 600  # per partition


def test_a_rebalance_and_a_kill_mid_flood_lose_no_record_good_or_bad(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    conninfo = psycopg.conninfo.conninfo_to_dict(settings.pg_dsn)
    proxy = TcpProxy(str(conninfo.get("host", "127.0.0.1")), int(str(conninfo.get("port", 5432))))
    conninfo.update(host="127.0.0.1", port=str(proxy.port))
    settings = replace(settings, batch_size=50, shutdown_timeout_s=3.0)
    frozen_db = replace(settings, pg_dsn=psycopg.conninfo.make_conninfo("", **conninfo))
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    run_ids: list[str] = []
    bad: set[tuple[int, int]] = set()  # (partition, offset)
    producer = Producer(producer_config(settings, "test-flood"))
    for partition in range(settings.wakeup_partitions):
        for i in range(GOOD):  # good at offset 2i, bad at 2i + 1
            run_id = f"flood-{partition}-{i}"
            wakeup = Wakeup(run_id, "start", produced_at=now_ms())
            produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
            produce(producer, topic, f"garbage {i}".encode(), b"junk", partition)
            run_ids.append(run_id)
            bad.add((partition, 2 * i + 1))
    insert_runs(pg, sample_workflow(), [(r, {}) for r in run_ids], "t1")
    assert producer.flush(30) == 0

    try:
        first = spawn(["process"], frozen_db, "first")
        wait_for(lambda: count_ticked(pg, run_ids) >= 50, 60, "some runs to be ticked", 0.02)
        proxy.freeze()
        # Everything is read and every bad record dead-lettered, while good ones wait.
        wait_for(lambda: len(_dead_letters(settings, topic)) == len(bad), 60, "the bad records")
        second = spawn(["process"], settings, "second")
        wait_for(lambda: second.owned_partitions() > 0, 60, "the second instance to join")
        wait_for(lambda: count_ticked(pg, run_ids) > 50, 60, "the second instance to tick")
        first.kill()  # SIGKILL: no final commit for what it kept
    finally:
        proxy.close()
    assert count_ticked(pg, run_ids) < len(run_ids), "every run was ticked before the kill"

    wait_for(lambda: count_ticked(pg, run_ids) == len(run_ids), 120, "every run ticked", 0.2)
    assert second.terminate() == 0
    letters = _dead_letters(settings, topic)
    missing = sorted(bad - set(letters))
    assert not missing, f"{len(missing)} bad records never dead-lettered, e.g. {missing[:5]}"
    assert set(letters.values()) == {"not_json"}
    assert sum(second.final_stats()["errors"].values()) == 0


def _dead_letters(settings: Settings, topic: str) -> dict[tuple[int, int], str]:
    """Dead-lettered records of ``topic`` by source (partition, offset), with their reason."""
    return {
        (d.source_partition or 0, d.source_offset or 0): d.reason
        for d in read_dead_letters(settings)
        if d.source_topic == topic
    }
