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

import time
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
)

from processor.client import start_runs
from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config
from processor.io.kafka.delivery import PARK_AFTER
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.outbox import unpark_outbox
from processor.io.postgres.run_counts import count_ticked
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow

from .audit import assert_results_applied, assert_transitions_applied_once, timed_out_attempts
from .instances import ProcessorThread, WorkerThread
from .proxy import TcpProxy
from .runs import count_terminal, run_statuses
from .samples import now_ms, sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

GOOD = 600  # per partition


def test_a_rebalance_and_a_kill_mid_flood_lose_no_record_good_or_bad(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    proxy = TcpProxy.for_dsn(settings.pg_dsn)
    settings = replace(settings, batch_size=50, shutdown_timeout_s=3.0)
    frozen_db = replace(settings, pg_dsn=proxy.dsn(settings.pg_dsn))
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


def test_a_crash_between_commit_and_produce_loses_no_effect_and_costs_no_attempt(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    """An instance is SIGKILLed right after a batch committed, before it produced the batch's
    step tasks (the fault point `after_commit`). The tasks wait in the outbox and the other
    instance relays them within seconds: every run succeeds, no step attempt is dispatched
    twice, and no attempt is lost to a timeout (the sample's steps time out after 10 s)."""
    pg = audit
    settings = replace(settings, relay_after_s=2.0)
    run_ids = [f"crash-{i}" for i in range(300)]
    survivor = spawn(["process"], settings, "survivor")
    wait_for(lambda: survivor.owned_partitions() > 0, 60, "the survivor to own partitions")
    doomed = spawn(["process"], replace(settings, test_faults="after_commit=kill@3"), "doomed")
    wait_for(lambda: doomed.owned_partitions() > 0, 60, "the doomed instance to own partitions")
    worker = WorkerThread(settings)
    try:
        start_runs(settings, "sample", run_ids)
        wait_for(lambda: doomed.proc.poll() is not None, 60, "the fault to kill an instance")
        left = len(run_ids) - count_terminal(pg, run_ids)
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 120, "every run to end")
        assert survivor.terminate() == 0
    finally:
        worker.stop()
    assert left > 0, "every run ended before the crash"
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert_transitions_applied_once(pg)
    assert survivor.final_stats()["relayed"] > 0, "nothing came from the outbox"
    attempts = pg.execute(
        "SELECT n.key, max((n.value->>'attempt')::int) FROM eec_workflow_run r,"
        " jsonb_each(r.node_states) n WHERE r.run_id = ANY(%s) GROUP BY n.key",
        (run_ids,),
    ).fetchall()
    # transform is flaky by design (fails its first two attempts); the others succeed at once.
    assert {k: a for k, a in attempts if k != "transform"} == dict.fromkeys(
        ("fetch", "enrich", "publish"), 1
    ), f"an attempt was lost and retried: {attempts}"
    assert pg.execute("SELECT count(*) FROM eec_outbox").fetchone() == (0,)


def test_a_commit_whose_answer_is_lost_is_read_back_and_carried_on(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The connection drops after Postgres committed a batch but before the answer reached the
    processor (the proxy swallows it). The processor reads the rows back, finds the commit
    landed, and produces its step tasks at once: no attempt lost, nothing relayed later,
    nothing applied twice, and the case is counted apart from conflicts."""
    pg = audit
    proxy = TcpProxy.for_dsn(settings.pg_dsn)
    through_proxy = replace(settings, pg_dsn=proxy.dsn(settings.pg_dsn))
    run_ids = [f"lost-answer-{i}" for i in range(50)]
    proxy.lose_answer_to(b"INSERT INTO eec_outbox")  # the first commit statement
    instance = processor_thread(through_proxy)
    worker = WorkerThread(settings)
    try:
        start_runs(settings, "sample", run_ids)
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 90, "every run to end")
    finally:
        worker.stop()
        proxy.close()
    assert proxy.answers_lost == 1
    stats = instance.stats
    assert stats.unknown_commits["landed"] >= 1 and stats.unknown_commits["not_landed"] == 0
    assert stats.relayed == 0, "the landed commit's records waited for the relay"
    assert stats.conflicts == 0
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert_transitions_applied_once(pg)
    attempts = pg.execute(
        "SELECT max((n.value->>'attempt')::int) FROM eec_workflow_run r,"
        " jsonb_each(r.node_states) n WHERE r.run_id = ANY(%s) AND n.key = 'fetch'",
        (run_ids,),
    ).fetchone()
    assert attempts == (1,), "a step attempt was lost and retried"


def _set_topic_config(settings: Settings, topic: str, name: str, value: str | None) -> None:
    """Set (or, with None, delete back to the broker's default) one config of ``topic``."""
    op = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    resource = ConfigResource(
        ConfigResource.Type.TOPIC,
        topic,
        incremental_configs=[ConfigEntry(name, value or "", incremental_operation=op)],
    )
    admin = AdminClient(settings.kafka_common())
    for future in admin.incremental_alter_configs([resource]).values():
        future.result(timeout=30)


def test_a_record_the_broker_refuses_for_good_parks_its_outbox_row_until_unparked(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The steps topic is made to refuse every step task (max.message.bytes below their size):
    a permanent refusal. The processor sends each again with a growing backoff (never in a hot
    loop), then, after PARK_AFTER refusals, parks its outbox row: kept, with why, counted and
    logged, relayed by no one (two sweeps later, the topic fixed, it still waits), and the
    records' offsets move on. Unparked, the next sweep relays the rows and every run ends."""
    steps = TopicNames(settings.topic_prefix).steps
    _set_topic_config(settings, steps, "max.message.bytes", "64")
    run_ids = [f"refused-{i}" for i in range(5)]
    instance: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(settings)

    def parked() -> list[tuple[str, str]]:
        return pg.execute(
            "SELECT run_id, parked_reason FROM eec_outbox"
            " WHERE run_id = ANY(%s) AND parked_at IS NOT NULL",
            (run_ids,),
        ).fetchall()

    try:
        start_runs(settings, "sample", run_ids)
        wait_for(lambda: instance.stats.errors["produce_permanent"] >= 1, 60, "a refusal")
        first = time.monotonic()
        wait_for(lambda: len(parked()) == len(run_ids), 60, "every run's outbox row parked")
        spread = time.monotonic() - first
        # Each record waits 0.1 then 0.2 s between its sends (at once, thousands of refusals).
        assert spread >= 0.3, f"parked {spread:.2f} s after the first refusal"
        assert instance.stats.errors["produce_permanent"] == PARK_AFTER * len(run_ids)
        assert all("MSG_SIZE_TOO_LARGE" in why for _run, why in parked()), parked()
        assert instance.stats.parked == {"MSG_SIZE_TOO_LARGE": len(run_ids)}
        assert count_terminal(pg, run_ids) == 0 and instance.stats.ticks["committed"] == 5
        _set_topic_config(settings, steps, "max.message.bytes", None)
        sweeps = instance.processor.watchdog.sweeps
        wait_for(lambda: instance.processor.watchdog.sweeps >= sweeps + 2, 30, "two sweeps")
        assert len(parked()) == len(run_ids), "a parked row was relayed"
        assert unpark_outbox(pg, None, None) == len(run_ids)
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 90, "every run to end")
    finally:
        worker.stop()
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert instance.stats.relayed >= len(run_ids)
    assert not parked()
    assert not instance.stats.dead_letters


def test_a_backlog_the_database_cannot_drain_pauses_consumption(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Postgres unreachable while thousands of wakeups (and due timers on the delay ladder)
    wait: the runs retried through the outage fill the executor's book up to the backlog
    limit, then every source is paused — consumption stops instead of the heap growing —
    and once the database is back, every run is ticked."""
    limit, runs = 300, 4000
    proxy = TcpProxy.for_dsn(settings.pg_dsn)
    through_proxy = replace(
        settings, pg_dsn=proxy.dsn(settings.pg_dsn), tier_buffer_limit=limit, batch_size=100
    )
    run_ids = [f"backlog-{i}" for i in range(runs)]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in run_ids], "t1")
    # The instance starts with its database there (a start waits for it, io/runtime/outage.py), then
    # loses it; the wakeups come after.
    instance: ProcessorThread = processor_thread(through_proxy)
    processor = instance.processor
    try:
        wait_for(lambda: len(processor.assigned) > 0, 60, "partitions to be assigned")
        proxy.cut()
        names = TopicNames(settings.topic_prefix)
        producer = Producer(producer_config(settings, "test-backlog"))
        for i, run_id in enumerate(run_ids):  # a start wakeup, and a due timer for every 4th
            wakeup = Wakeup(run_id, "start", produced_at=now_ms())
            produce(producer, names.wakeup("t1"), wakeup.encode(), wakeup.key(), i % 3)
            if i % 4 == 0:
                timer = Wakeup(run_id, "timer", due_at=now_ms(), produced_at=now_ms())
                produce(producer, names.delay(100), timer.encode(), timer.key(), i % 3)
        assert producer.flush(30) == 0
        wait_for(
            processor.flow.all_held_by_backpressure,
            60,
            "every source to be paused by backpressure",
        )
        taken = instance.stats.records
        assert processor.executor.waiting_for_tick > limit  # runs retried through the outage
        assert taken < runs, f"{taken} records taken with the database away"
    finally:
        proxy.restore()
    wait_for(lambda: count_ticked(pg, run_ids) == runs, 120, "every run to be ticked", 0.2)
    proxy.close()


def test_an_instance_that_owns_no_partition_yet_relays_a_dead_instances_effects(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    """Found by the chaos run: every instance is killed within a few seconds, so the group's
    partitions stay with dead members until their session expires (10 s on the local broker)
    and the live instances own none meanwhile. The relay must not wait for partitions: a
    dead instance's step tasks go out once its heartbeat is stale (DUCTOR_INSTANCE_TIMEOUT_S,
    2 s here), not after the session timeout, so a step whose timeout is shorter than that
    session does not time out for it."""
    pg = audit
    settings = replace(settings, relay_after_s=2.0, instance_timeout_s=2.0)
    wf = parse_workflow(
        {
            "name": "relay-short",
            "version": 1,
            "steps": [
                {"name": "only", "type": "fast", "timeout_ms": 5000, "retry": {"max_attempts": 1}}
            ],
        }
    )
    register_workflow(pg, wf)
    run_ids = [f"orphan-{i}" for i in range(20)]
    doomed = spawn(["process"], replace(settings, test_faults="after_commit=kill@1"), "doomed")
    wait_for(lambda: doomed.owned_partitions() > 0, 60, "the doomed instance to own partitions")
    start_runs(settings, "relay-short", run_ids)
    wait_for(lambda: doomed.proc.poll() is not None, 60, "the fault to kill the instance")
    heir = spawn(["process"], settings, "heir")  # joins while the dead member holds everything
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 90, "every run to end")
        assert heir.terminate() == 0
    finally:
        worker.stop()
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}, "a step timed out"
    assert not timed_out_attempts(pg)
    assert_transitions_applied_once(pg)
    assert heir.final_stats()["relayed"] > 0
