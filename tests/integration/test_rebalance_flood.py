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
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.run_counts import count_ticked
from processor.io.postgres.runs_admin import insert_runs

from .samples import now_ms, sample_workflow
from .waiting import wait_for

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

    _assert_each_dead_lettered_once(settings, topic, bad)


def test_records_done_past_one_that_cannot_finish_are_not_done_again_by_the_next_owner(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    """Each partition starts with a run whose row an outside transaction holds (its tick
    cannot commit while it does), then bad records, then a free run. The first instance
    dead-letters the bad records and ticks the free runs, but the offset it commits cannot
    pass the held run; a second instance joins and takes partitions from it. The commit says,
    in its metadata, which records past its offset are done: the next owner does not
    dead-letter them again, and once the rows are free every run ticks."""
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    producer = Producer(producer_config(settings, "test-held-flood"))
    held: list[str] = []
    free: list[str] = []
    for partition in range(settings.wakeup_partitions):
        for run_ids, kind in ((held, "held"), (free, "free")):
            run_id = f"{kind}-{partition}"
            wakeup = Wakeup(run_id, "start", produced_at=now_ms())
            produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
            run_ids.append(run_id)
            if kind == "held":
                for j in range(BAD_PER_GOOD):
                    produce(producer, topic, f"garbage {j}".encode(), b"junk", partition)
    insert_runs(pg, sample_workflow(), [(r, {}) for r in held + free], "t1")
    assert producer.flush(30) == 0
    bad = BAD_PER_GOOD * settings.wakeup_partitions
    holder = psycopg.connect(settings.pg_dsn)  # its transaction holds the rows until rollback
    holder.execute("SELECT 1 FROM eec_workflow_run WHERE run_id = ANY(%s) FOR UPDATE", (held,))

    first = spawn(["process"], settings, "first")
    wait_for(lambda: count_ticked(pg, free) == len(free), 60, "the records after the held ones")
    second = spawn(["process"], settings, "second")
    wait_for(lambda: second.owned_partitions() > 0, 60, "the second instance to take partitions")
    holder.rollback()
    holder.close()
    wait_for(lambda: count_ticked(pg, held + free) == len(held + free), 60, "every run ticked")
    assert first.terminate() == 0 and second.terminate() == 0

    _assert_each_dead_lettered_once(settings, topic, bad)
    stopped = next(line for line in second.log_lines() if line.get("msg") == "processor stopped")
    assert stopped["stats"]["done_before"] > 0, "the second instance read no bad record again"


def _assert_each_dead_lettered_once(settings: Settings, topic: str, bad: int) -> None:
    """Every one of the ``bad`` records of ``topic`` has exactly one dead letter."""
    sources = Counter(
        (d.source_partition, d.source_offset)
        for d in read_dead_letters(settings)
        if d.source_topic == topic
    )
    assert len(sources) == bad
    twice = {source: n for source, n in sources.items() if n > 1}
    assert not twice, f"{len(twice)} of {bad} bad records dead-lettered more than once"
