"""The coordinator against the real broker and database: concurrency, requeues, livelock,
crashes. Each test proves one line of the issue's "done when"."""

from __future__ import annotations

import random
import threading
import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Consumer

from processor.client import start_runs
from processor.core.envelope import Wakeup, decode_wakeup
from processor.core.records import normalise_headers
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow

from .audit import assert_results_applied, assert_transitions_applied_once
from .contention import drive_into_livelock
from .instances import ProcessorThread, WorkerThread
from .runs import count_terminal, run_statuses
from .samples import now_ms, produce_wakeups, sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _chain(name: str, length: int) -> WorkflowDef:
    steps = [{"name": f"s{i}", "type": "fast", "timeout_ms": 20000} for i in range(length)]
    for i in range(1, length):
        steps[i]["depends_on"] = [f"s{i - 1}"]
    return parse_workflow({"name": name, "version": 1, "steps": steps})


@pytest.mark.parametrize("group_protocol", ["consumer", "classic"])
def test_runs_of_the_sample_workflow_succeed(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any, group_protocol: str
) -> None:
    """End to end with either group protocol (KIP-848 by default, classic for old brokers)."""
    settings = replace(settings, group_protocol=group_protocol)
    run_ids = [f"basic-{i}" for i in range(50)]
    start_runs(settings, "sample", run_ids)
    instance: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 90, "50 runs to end")
    finally:
        worker.stop()
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert instance.stats.error_count == 0
    assert instance.stats.ticks["committed"] >= 50 * 5


def test_three_instances_with_every_wakeup_delivered_three_times(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    """1,000 runs, each start wakeup produced three times onto random partitions, three
    `ductor process` instances and two workers at once: every run succeeds, every step result
    is applied exactly once, conflicts happen and are counted, errors are zero."""
    pg = audit
    settings = replace(settings, partition_by_run=False)
    wf = _sample()
    run_ids = [f"trio-{i}" for i in range(1000)]
    insert_runs(pg, wf, [(r, {}) for r in run_ids], "t1")
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    records = [
        (topic, Wakeup(run_id=r, reason="start", produced_at=now_ms()), random.randrange(3))
        for r in run_ids
        for _ in range(3)
    ]
    random.shuffle(records)
    processors = [spawn(["process"], settings, f"process-{i}") for i in range(3)]
    workers = [spawn(["worker", "--threads", "4"], settings, f"worker-{i}") for i in range(2)]
    # Every instance holds partitions first: the first to join would otherwise tick the whole
    # backlog alone before the others arrive, and nobody would race anybody.
    wait_for(
        lambda: all(p.owned_partitions() > 0 for p in processors), 60, "all three to own partitions"
    )
    produce_wakeups(settings, records)

    wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 240, "1,000 runs to end", 0.5)
    for child in processors + workers:
        assert child.terminate() == 0
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert assert_transitions_applied_once(pg) >= 1000 * 5

    stats = [p.final_stats() for p in processors]
    conflicts = sum(s["conflicts"] for s in stats)
    errors = sum(sum(s["errors"].values()) for s in stats)
    assert conflicts > 0, "three instances on shared runs should have lost some races"
    assert errors == 0, f"conflicts must never count as errors: {stats}"
    assert sum(s["ticks"].get("conflict", 0) for s in stats) == conflicts
    assert not any(s["force_fails"] for s in stats)


def _sample() -> WorkflowDef:
    return sample_workflow()


def test_a_run_kept_conflicting_is_force_failed_for_livelock(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """An outside writer makes every commit lose: after N non-progressing requeues the run is
    force-failed with reason livelock. Requeues land on the right rung with the right key and
    are processed no earlier than due."""
    settings = replace(settings, livelock_requeues=2)
    run_id, instance = drive_into_livelock(settings, pg, processor_thread)
    names = TopicNames(settings.topic_prefix)
    row = pg.execute(
        "SELECT failure_reason FROM eec_workflow_run WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert row is not None and row[0] == "livelock"
    stats = instance.stats
    assert stats.force_fails == {"livelock": 1}
    assert dict(stats.requeues) == {100: 1, 200: 1}
    assert stats.conflicts == 15  # five in-process tries in each of three rounds
    assert stats.error_count == 0
    assert stats.lateness_ms.samples and min(stats.lateness_ms.samples) >= 0

    # The requeues themselves: one per rung, keyed run_id:requeue_seq, count on the envelope.
    seen = _read_all(settings, [names.delay(100), names.delay(200)], expected=2)
    assert {(t, k) for t, k, _ in seen} == {
        (names.delay(100), f"{run_id}:1"),
        (names.delay(200), f"{run_id}:2"),
    }
    for topic, _key, wakeup in seen:
        rung = int(topic.rsplit(".", 1)[1])
        assert wakeup.reason == "requeue"
        assert wakeup.requeue_count == {100: 1, 200: 2}[rung]
        assert wakeup.produced_at is not None and wakeup.due_at == wakeup.produced_at + rung


def _read_all(
    settings: Settings, topics: list[str], expected: int
) -> list[tuple[str, str, Wakeup]]:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe(topics)
    seen: list[tuple[str, str, Wakeup]] = []

    def read() -> bool:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            decoded = decode_wakeup(message.value(), 65536)
            assert isinstance(decoded, Wakeup)
            seen.append((message.topic() or "", (message.key() or b"").decode(), decoded))
        return len(seen) >= expected

    wait_for(read, 30, f"{expected} records on {topics}")
    consumer.close()
    return seen


def test_a_hot_run_that_keeps_progressing_is_never_force_failed(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Two instances hammer one long run with hundreds of wakeups on random partitions; it
    conflicts often but commits progress, so even a livelock limit of 1 never trips."""
    settings = replace(settings, livelock_requeues=1, partition_by_run=False)
    wf = _chain("hot-chain", 12)
    register_workflow(pg, wf)
    run_id = f"hot-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, wf, [(run_id, {})], "t0")
    instances = [processor_thread(settings) for _ in range(2)]
    worker = WorkerThread(settings)
    topic = TopicNames(settings.topic_prefix).wakeup("t0")
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            batch = [
                (topic, Wakeup(run_id, "signal", produced_at=now_ms()), random.randrange(3))
                for _ in range(20)
            ]
            produce_wakeups(settings, batch)
            stop.wait(0.01)

    hammerer = threading.Thread(target=hammer, daemon=True)
    hammerer.start()
    try:
        wait_for(
            lambda: (
                run_statuses(pg, [run_id])[run_id] != "pending"
                and count_terminal(pg, [run_id]) == 1
            ),
            120,
            "the hot run to end",
        )
    finally:
        stop.set()
        hammerer.join(10)
        worker.stop()
    assert run_statuses(pg, [run_id])[run_id] == "succeeded"
    assert sum(sum(i.stats.force_fails.values()) for i in instances) == 0
    assert sum(i.stats.error_count for i in instances) == 0


def test_an_instance_killed_mid_batch_loses_nothing_and_applies_nothing_twice(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    settings = replace(settings, sweep_grace_s=0.5)
    run_ids = [f"kill-{i}" for i in range(400)]
    first = spawn(["process"], settings, "victim")
    second = spawn(["process"], settings, "survivor")
    worker = spawn(["worker", "--threads", "8"], settings, "worker")
    wait_for(
        lambda: first.owned_partitions() > 0 and second.owned_partitions() > 0,
        60,
        "both instances to own partitions",
    )
    start_runs(settings, "sample", run_ids)
    wait_for(
        lambda: count_terminal(pg, run_ids) >= 60, 120, "some runs to end before the kill", 0.05
    )
    assert first.owned_partitions() > 0, "the victim must own partitions when it is killed"
    first.kill()  # SIGKILL: no shutdown, no flush, no offset commit
    replacement = spawn(["process"], settings, "replacement")
    wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 180, "every run to end", 0.5)
    # (the survivor may finish every run before the replacement is even up: it must be, to
    # be asked to stop and to answer it as a running instance does)
    wait_for(lambda: replacement.owned_partitions() > 0, 60, "the replacement to join")
    for child in (second, replacement, worker):
        assert child.terminate() == 0
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert_transitions_applied_once(pg)
    for child in (second, replacement):
        assert sum(child.final_stats()["errors"].values()) == 0


def test_a_row_changed_out_of_band_is_reported_not_overwritten(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    # No overdue sweep: its wakeup of the inserted run, should the instance start slowly,
    # would be a second report of the one change.
    settings = replace(settings, sweep_grace_s=3600.0)
    run_id = f"tampered-{uuid.uuid4().hex[:6]}"
    wf = _sample()
    insert_runs(pg, wf, [(run_id, {})], "t1")
    pg.execute(
        "UPDATE eec_workflow_run SET node_states = jsonb_set(node_states, '{fetch,attempt}', '7')"
        " WHERE run_id = %s",
        (run_id,),
    )
    before = pg.execute(
        "SELECT node_states, db_record_version FROM eec_workflow_run WHERE run_id = %s", (run_id,)
    ).fetchone()
    instance: ProcessorThread = processor_thread(settings)
    names = TopicNames(settings.topic_prefix)
    produce_wakeups(
        settings, [(names.wakeup("t1"), Wakeup(run_id, "start", produced_at=now_ms()), None)]
    )
    wait_for(
        lambda: instance.stats.dead_letters["checksum_mismatch"] == 1, 30, "the mismatch report"
    )
    after = pg.execute(
        "SELECT node_states, db_record_version FROM eec_workflow_run WHERE run_id = %s", (run_id,)
    ).fetchone()
    assert after == before
    assert instance.stats.errors["checksum_mismatch"] == 1
    dead = _read_raw(settings, names.dlq)
    assert dict(dead[0])["ductor.dlq.reason"] == b"checksum_mismatch"


def _read_raw(settings: Settings, topic: str) -> list[list[tuple[str, bytes]]]:
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
        }
    )
    consumer.subscribe([topic])
    seen: list[list[tuple[str, bytes]]] = []

    def read() -> bool:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            seen.append(normalise_headers(message))
        return bool(seen)

    wait_for(read, 30, f"a record on {topic}")
    consumer.close()
    return seen


def test_a_row_whose_state_cannot_be_read_is_reported_and_the_batch_goes_on(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    settings = replace(settings, sweep_grace_s=3600.0)  # one report: see the test above
    broken, fine = f"broken-{uuid.uuid4().hex[:6]}", f"fine-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, _sample(), [(broken, {}), (fine, {})], "t1")
    pg.execute(
        'UPDATE eec_workflow_run SET node_states = \'{"fetch": {"status": "bogus"}}\''
        " WHERE run_id = %s",
        (broken,),
    )
    instance: ProcessorThread = processor_thread(settings)
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    produce_wakeups(
        settings, [(topic, Wakeup(r, "start", produced_at=now_ms()), 0) for r in (broken, fine)]
    )
    wait_for(lambda: run_statuses(pg, [fine])[fine] == "running", 30, "the readable run to tick")
    wait_for(lambda: instance.stats.dead_letters["checksum_mismatch"] == 1, 30, "the report")
    assert run_statuses(pg, [broken])[broken] == "pending"
    assert instance.stats.errors["checksum_mismatch"] == 1
