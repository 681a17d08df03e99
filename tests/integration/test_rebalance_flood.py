"""A rebalance in the middle of a flood of bad records dead-letters each of them once: the
instance that gives partitions up finishes, before it commits, the work it had taken from
them (the runs waiting for a tick, their effects, the dead letters and hops on their way), so
the offset it commits passes every record it dead-lettered and the partitions' next owner
does not dead-letter them again."""

from __future__ import annotations

from collections import Counter
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

pytestmark = pytest.mark.integration

GOOD = 100  # per partition, each followed by bad records
BAD_PER_GOOD = 40


def test_a_rebalance_mid_flood_dead_letters_each_bad_record_once(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    # Small batches: when the rebalance comes, the first instance holds runs read and not yet
    # ticked, with dead-lettered records behind them.
    settings = replace(settings, batch_size=20)
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    run_ids: list[str] = []
    producer = Producer(producer_config(settings, "test-flood"))
    for partition in range(settings.wakeup_partitions):
        for i in range(GOOD):
            run_id = f"reb-{partition}-{i}"
            wakeup = Wakeup(run_id, "start", produced_at=now_ms())
            produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
            for j in range(BAD_PER_GOOD):
                produce(producer, topic, f"garbage {i}.{j}".encode(), b"junk", partition)
            run_ids.append(run_id)
    insert_runs(pg, sample_workflow(), [(r, {}) for r in run_ids], "t1")
    assert producer.flush(30) == 0
    bad = GOOD * BAD_PER_GOOD * settings.wakeup_partitions

    first = spawn(["process"], settings, "first")
    wait_for(lambda: count_ticked(pg, run_ids) >= 20, 60, "the flood to be under way", 0.02)
    second = spawn(["process"], settings, "second")  # the rebalance, mid-flood
    wait_for(lambda: second.owned_partitions() > 0, 60, "the second instance to join")
    wait_for(lambda: count_ticked(pg, run_ids) == len(run_ids), 120, "every run ticked", 0.2)
    assert first.terminate() == 0 and second.terminate() == 0

    sources = Counter(
        (d.source_partition, d.source_offset)
        for d in read_dead_letters(settings)
        if d.source_topic == topic
    )
    assert len(sources) == bad
    twice = {source: n for source, n in sources.items() if n > 1}
    assert not twice, f"{len(twice)} of {bad} bad records dead-lettered more than once"
