"""The benchmark's two reference points, measured on the same broker and database as the
instance: what Postgres alone can do, and what a naive consumer loop does. Each also gives the
CPU the processes spent over its timed part (``meter``: see bench_cpu.py)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from processor.core.decide import tick_batch
from processor.core.envelope import Wakeup, decode_wakeup
from processor.core.model import LoadedRun
from processor.core.plans import Commit
from processor.core.routing import TopicNames
from processor.core.shapes import OutboxKey
from processor.core.tick import tick
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import admin_config, producer_config
from processor.io.kafka.logs import with_logger
from processor.io.postgres.store import Definitions, commit_batch, load_runs
from processor.tools.bench_cpu import CpuMeter, CpuUse


def ceiling_rate(
    conn: psycopg.Connection[Any],
    run_ids: Sequence[str],
    batch_size: int,
    names: TopicNames,
    meter: CpuMeter,
) -> tuple[float, CpuUse]:
    """Ticks per second of the batched conditional UPDATE alone, on new runs, with its outbox
    writes and deletions as the instance does them: the states are loaded and ticked first,
    only the commits are timed."""
    definitions = Definitions()
    now_ms = int(time.time() * 1000)
    batches: list[list[Commit]] = []
    for start in range(0, len(run_ids), batch_size):
        loaded = load_runs(conn, definitions, run_ids[start : start + batch_size])
        batches.append(list(tick_batch(loaded, now_ms, names).values()))
    meter.start()
    started = time.perf_counter()
    committed = 0
    acknowledged: list[OutboxKey] = []
    for batch in batches:  # each commit deletes the previous batch's outbox rows, as live
        committed += len(commit_batch(conn, batch, acknowledged).committed)
        acknowledged = [(c.run_id, c.state.seq) for c in batch]
    elapsed = time.perf_counter() - started
    cpu = meter.stop()
    assert committed == len(run_ids), f"ceiling: only {committed} of {len(run_ids)} committed"
    return committed / elapsed, cpu


def naive_rate(
    settings: Settings,
    conn: psycopg.Connection[Any],
    run_ids: Sequence[str],
    group: str,
    meter: CpuMeter,
) -> tuple[float, CpuUse]:
    """The baseline: one record at a time, load, tick, conditional UPDATE, synchronous offset
    commit, on a topic of its own (``<prefix>.naive``)."""
    topic = f"{settings.topic_prefix}.naive"
    admin = AdminClient(with_logger(admin_config(settings, "bench-naive")))
    for future in admin.create_topics([NewTopic(topic, num_partitions=6)]).values():
        future.result(timeout=30)
    producer = Producer(with_logger(producer_config(settings, "bench-naive")))
    for run_id in run_ids:
        produce(producer, topic, Wakeup(run_id, "start").encode(), run_id.encode())
        producer.poll(0)
    producer.flush(60)
    consumer = Consumer(
        with_logger(
            {
                "bootstrap.servers": settings.bootstrap_servers,
                "group.id": group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
    )
    consumer.subscribe([topic])
    definitions = Definitions()
    done = 0
    started: float | None = None
    while done < len(run_ids):
        message = consumer.poll(5.0)
        if message is None:
            raise RuntimeError("naive baseline: no record within 5 s")
        if message.error() is not None:
            continue
        if started is None:
            meter.start()
            started = time.perf_counter()
        wakeup = decode_wakeup(message.value(), 65536)
        assert isinstance(wakeup, Wakeup)
        run = load_runs(conn, definitions, [wakeup.run_id])[wakeup.run_id]
        assert isinstance(run, LoadedRun)
        decision = tick(run.state, run.wf, run.results, run.signals, int(time.time() * 1000))
        if decision.new_state is not None:
            commit_batch(conn, [Commit(run.run_id, run.version, decision.new_state)])
        consumer.commit(message=message, asynchronous=False)
        done += 1
    elapsed = time.perf_counter() - (started or time.perf_counter())
    cpu = meter.stop()
    consumer.close()
    return done / elapsed, cpu
