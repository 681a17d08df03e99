"""Runs started and signalled by an upstream producer through Kafka alone: kcat, a client that
is not ours, writes start and signal records to ductor.requests (schemas/request.schema.json)
while runs flow. Every run starts once however often its start is written, every signal is
applied once, a signal that comes before its run's start waits for it, and every record that
cannot be honoured is one dead letter with its bytes; an instance SIGKILLed right after a
request statement committed loses nothing."""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.client import request_signal, request_starts, start_run
from processor.core.requests import SignalRequest, StartRequest
from processor.core.routing import TopicNames, partition_for, run_shard
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow

from .audit import assert_results_applied, assert_transitions_applied_once
from .children import run_ductor
from .instances import WorkerThread
from .kcat import kcat_produce_many
from .runs import count_terminal, run_statuses
from .samples import SAMPLE
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _write(settings: Settings, records: Sequence[tuple[str, bytes]]) -> None:
    """(run id, value) records written with kcat, keyed by run id, each on its run's partition
    (as a producer keying by run id with our partitioner does), in order per partition."""
    by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
    for run_id, value in records:
        by_partition[partition_for(run_id, settings.wakeup_partitions)].append(
            (run_id.encode(), value)
        )
    topic = TopicNames(settings.topic_prefix).requests
    for partition, batch in sorted(by_partition.items()):
        kcat_produce_many(settings, topic, partition, batch)


# A workflow of this test's own (definitions outlive a test): the sample's steps, named anew.
WORKFLOW = {**orjson.loads(SAMPLE.read_bytes()), "name": f"intake-{uuid.uuid4().hex[:8]}"}


def _start(run_id: str, **fields: Any) -> tuple[str, bytes]:
    workflow = fields.pop("workflow", WORKFLOW["name"])
    return run_id, StartRequest(run_id, workflow, **fields).encode()


def _cancel(run_id: str, signal_id: str) -> tuple[str, bytes]:
    return run_id, SignalRequest(run_id, "cancel", signal_id).encode()


def _signals(pg: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, int]:
    rows = pg.execute(
        "SELECT run_id, count(*) FROM eec_run_signal WHERE run_id = ANY(%s) GROUP BY run_id",
        (run_ids,),
    ).fetchall()
    return {r[0]: int(r[1]) for r in rows}


def _kept(pg: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in pg.execute("SELECT run_id FROM eec_kept_signal ORDER BY run_id")]


def _dead_letter_reasons(settings: Settings) -> dict[str, list[str]]:
    """Dead letters of the requests topic by reason: the run id each record named."""
    topic = TopicNames(settings.topic_prefix).requests
    found: dict[str, list[str]] = defaultdict(list)
    for letter in read_dead_letters(settings):
        assert letter.source_topic == topic, f"a dead letter from {letter.source_topic}"
        found[letter.reason].append((letter.key or b"").decode())
    return {reason: sorted(keys) for reason, keys in found.items()}


@pytest.fixture(autouse=True)
def _workflow(pg: psycopg.Connection[Any]) -> None:
    register_workflow(pg, parse_workflow(WORKFLOW))


def test_starts_and_signals_from_a_producer_apply_once_and_bad_ones_are_dead_letters(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    started = [f"req-{i}" for i in range(40)]
    processor_thread(settings)
    # No worker yet: the started runs wait at their first step, so a cancel finds them live.
    good = [_start(run_id, input={"n": i}) for i, run_id in enumerate(started)]
    _write(
        settings,
        [
            *good,
            *good[:10],  # the same starts again: one run each
            _start("req-0", input={"n": "another"}),  # conflicting: another input
            _start("nowhere-1", workflow="no-such-workflow"),
            _start("nowhere-2", workflow_version=7),
            ("junk-1", b"{not json"),
            ("junk-2", b'{"request_version": 1, "kind": "start", "run_id": "junk-2"}'),
            _cancel("early-1", "sig-early"),  # before its start: kept
        ],
    )
    wait_for(lambda: len(run_statuses(pg, started)) == len(started), 60, "every run to exist")
    wait_for(lambda: _kept(pg) == ["early-1"], 30, "the early signal to be kept")
    # A version 2: the same start again, naming no version, is still the same start (the
    # latest moved, the run did not); one naming version 2 conflicts with the run of 1.
    register_workflow(pg, parse_workflow({**WORKFLOW, "version": 2}))
    _write(settings, [good[3], _start("req-1", workflow_version=2)])
    # A signal for a live run, twice (a producer retrying): recorded once, and it cancels.
    _write(settings, [_cancel("req-5", "sig-5"), _cancel("req-5", "sig-5")])
    wait_for(lambda: run_statuses(pg, ["req-5"])["req-5"] == "cancelled", 60, "req-5 cancelled")
    # The early signal's start: the run takes it and is cancelled at its first tick.
    _write(settings, [_start("early-1")])
    wait_for(
        lambda: run_statuses(pg, ["early-1"]).get("early-1") == "cancelled",
        60,
        "the run started after its signal to be cancelled",
    )
    assert _kept(pg) == []
    worker = WorkerThread(settings)
    try:
        ended = [*started, "early-1"]
        wait_for(lambda: count_terminal(pg, ended) == len(ended), 120, "every run to end")
    finally:
        worker.stop()
    statuses = run_statuses(pg, ended)
    assert {statuses.pop("req-5"), statuses.pop("early-1")} == {"cancelled"}
    assert set(statuses.values()) == {"succeeded"}
    assert _signals(pg, ended) == {"req-5": 1, "early-1": 1}
    inputs = dict(pg.execute("SELECT run_id, input FROM eec_workflow_run WHERE run_id = 'req-0'"))
    assert inputs == {"req-0": {"n": 0}}, "the conflicting start changed the run"
    assert pg.execute("SELECT count(*) FROM eec_workflow_run").fetchone() == (len(ended),)
    assert_results_applied(pg, sorted(statuses))
    assert_transitions_applied_once(pg)
    assert _dead_letter_reasons(settings) == {
        "conflicting_start": ["req-0", "req-1"],
        "unknown_workflow": ["nowhere-1", "nowhere-2"],
        "not_json": ["junk-1"],
        "wrong_schema": ["junk-2"],
    }


def test_an_instance_killed_after_a_request_statement_loses_no_start_and_no_signal(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    """The instance is SIGKILLed right after its first request statement committed, before
    the start wakeups it makes are produced and before the offsets pass: its successor reads
    the same requests again, finds them done, and sends the wakeups (each run started once)."""
    pg = audit
    run_ids = [f"kill-{i}" for i in range(300)]
    cancelled = run_ids[::50]
    doomed = spawn(["process"], replace(settings, test_faults="after_requests=kill@1"), "doomed")
    wait_for(lambda: doomed.owned_partitions() > 0, 60, "the doomed instance to own partitions")
    records = [_cancel(run_id, f"stop-{run_id}") for run_id in cancelled]
    records += [_start(run_id, input={"i": i}) for i, run_id in enumerate(run_ids)]
    for chunk in range(0, len(records), 50):  # in several writes: the kill finds runs to come
        _write(settings, records[chunk : chunk + 50])
    wait_for(lambda: doomed.proc.poll() is not None, 60, "the fault to kill the instance")
    assert doomed.proc.returncode == -9
    before = len(run_statuses(pg, run_ids))
    heir = spawn(["process"], settings, "heir")
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 120, "every run to end")
        assert heir.terminate() == 0
    finally:
        worker.stop()
    assert 0 < before < len(run_ids), f"{before} runs existed at the kill"
    statuses = run_statuses(pg, run_ids)
    assert {statuses.pop(run_id) for run_id in cancelled} == {"cancelled"}
    assert set(statuses.values()) == {"succeeded"}
    assert _signals(pg, run_ids) == dict.fromkeys(cancelled, 1)
    assert _kept(pg) == []
    assert_transitions_applied_once(pg)
    assert read_dead_letters(settings) == []
    assert heir.final_stats()["ticks"].get("duplicate", 0) > 0, "nothing was redone"
    inputs = pg.execute("SELECT count(*) FROM eec_workflow_run WHERE input ? 'i'").fetchone()
    assert inputs == (len(run_ids),)


def test_a_kept_signal_is_applied_when_its_run_appears_and_dead_lettered_when_none_does(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Signals written before any run has their ids: one whose run is then started by the
    direct path (``ductor start``) is applied at its first tick; one left kept beside a run
    that exists (the state a start racing the signal's statement leaves) is adopted by the
    sweep; one whose run never comes is one dead letter, ``unknown_run``, with the record's
    own key, value, headers and position, once its time to live has passed; but a cancel
    whose run never came is kept past it, for its start (test_early_cancels.py)."""
    pg = audit
    settings = replace(settings, kept_signal_ttl_s=3.0)
    processor_thread(settings)
    topic = TopicNames(settings.topic_prefix).requests
    _write(settings, [_cancel("ghost-0", "sig-ghost-0")])  # kept first: it would expire first
    wait_for(lambda: _kept(pg) == ["ghost-0"], 30, "the cancel to be kept")
    ghost = SignalRequest("ghost-1", "approve", "sig-ghost", {"ok": True}).encode()
    kcat_produce_many(
        settings,
        topic,
        partition_for("ghost-1", settings.wakeup_partitions),
        [(b"ghost-1", ghost)],
        headers=[("producer", b"billing")],
    )
    _write(settings, [_cancel("late-1", "sig-late")])
    wait_for(lambda: _kept(pg) == ["ghost-0", "ghost-1", "late-1"], 30, "the signals to be kept")
    start_run(settings, WORKFLOW["name"], "late-1")  # the direct path takes its signal
    # The race's leftover: a run, and a signal kept for it that no start took.
    start_run(settings, WORKFLOW["name"], "race-1")
    pg.execute(
        "INSERT INTO eec_kept_signal (run_id, signal_id, kind, shard, record_value,"
        " source_topic, source_partition, source_offset)"
        " VALUES ('race-1', 'sig-race', 'cancel', %s, '\\x7b7d', %s, 0, 0)",
        (run_shard("race-1"), topic),
    )
    wait_for(
        lambda: (
            run_statuses(pg, ["late-1", "race-1"]) == {"late-1": "cancelled", "race-1": "cancelled"}
        ),
        60,
        "both runs to be cancelled by their kept signals",
    )
    wait_for(lambda: _kept(pg) == ["ghost-0"], 60, "the unclaimed signal to be dead-lettered")
    [letter] = read_dead_letters(settings)
    assert letter.reason == "unknown_run"
    assert (letter.key, letter.value) == (b"ghost-1", ghost)
    assert ("producer", b"billing") in letter.headers
    assert letter.source_topic == topic
    assert letter.header("ductor.dlq.partition") == str(
        partition_for("ghost-1", settings.wakeup_partitions)
    )
    assert "ghost-1" in (letter.header("ductor.dlq.detail") or "")
    assert _signals(pg, ["late-1", "race-1", "ghost-0", "ghost-1"]) == {"late-1": 1, "race-1": 1}
    assert_transitions_applied_once(pg)


def test_ductor_start_and_signal_via_kafka_need_no_database(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """`ductor start --via kafka` and `ductor signal --via kafka` with a DSN that points
    nowhere: the commands only write requests, a processor makes the runs and applies the
    signal; a start a processor would refuse is refused by the command, producing nothing."""
    pg = audit
    processor_thread(settings)
    offline = replace(settings, pg_dsn="postgresql://nobody@127.0.0.1:1/none?connect_timeout=1")
    name = WORKFLOW["name"]
    done = run_ductor(offline, "start", name, "--run-id", "cli-1", "--via", "kafka")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"cli-1 (start requested on {settings.topic_prefix}.requests)"
    many = run_ductor(offline, "start", name, "--run-id", "cli-m", "--count", "3", "--via", "kafka")
    assert many.returncode == 0, many.stderr
    wait_for(
        lambda: len(run_statuses(pg, ["cli-1", "cli-m-0", "cli-m-1", "cli-m-2"])) == 4,
        60,
        "the requested runs to exist",
    )
    signal = run_ductor(offline, "signal", "cli-1", "cancel", "--signal-id", "s1", "--via", "kafka")
    assert signal.returncode == 0, signal.stderr
    assert "s1" in signal.stdout
    wait_for(lambda: run_statuses(pg, ["cli-1"])["cli-1"] == "cancelled", 60, "cli-1 cancelled")
    # Refused before anything is produced: what the processor would dead-letter.
    bad = run_ductor(offline, "start", name, "--run-id", "x" * 201, "--via", "kafka")
    assert bad.returncode == 2 and "would be dead-lettered" in bad.stderr, bad.stderr
    policy = run_ductor(offline, "start", name, "--if-exists", "fail", "--via", "kafka")
    assert policy.returncode == 2 and "--via database" in policy.stderr, policy.stderr
    # The Python client alike.
    request_starts(offline, name, ["py-1"], {"from": "python"})
    wait_for(lambda: "py-1" in run_statuses(pg, ["py-1"]), 60, "the client's run to exist")
    assert request_signal(offline, "py-1", signal_id="py-stop") == "py-stop"
    wait_for(lambda: run_statuses(pg, ["py-1"])["py-1"] == "cancelled", 60, "py-1 cancelled")
    assert _signals(pg, ["cli-1", "py-1"]) == {"cli-1": 1, "py-1": 1}
    assert read_dead_letters(settings) == []


def test_a_kept_signals_dead_letter_claimed_by_an_instance_that_died_is_sent_once_by_another(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    """The instance that claimed an expired signal's dead letter is SIGKILLed before producing
    it: the row stays claimed by a dead instance, and another instance sends the dead letter
    once that one is gone from the registry; one dead letter, the row deleted."""
    pg = audit
    settings = replace(settings, kept_signal_ttl_s=2.0)
    doomed = spawn(["process"], replace(settings, test_faults="kept_claimed=kill@1"), "doomed")
    wait_for(lambda: doomed.owned_partitions() > 0, 60, "the doomed instance to own partitions")
    _write(settings, [("ghost-2", SignalRequest("ghost-2", "approve", "sig-ghost-2").encode())])
    wait_for(lambda: doomed.proc.poll() is not None, 60, "the fault to kill the instance")
    assert doomed.proc.returncode == -9
    claimed = pg.execute("SELECT dead_letter_by FROM eec_kept_signal").fetchall()
    assert len(claimed) == 1 and claimed[0][0] is not None, claimed
    assert read_dead_letters(settings) == []
    heir = spawn(["process"], settings, "heir")
    wait_for(lambda: _kept(pg) == [], 60, "the heir to send the dead letter and delete the row")
    assert heir.terminate() == 0
    [letter] = read_dead_letters(settings)
    assert (letter.reason, letter.key) == ("unknown_run", b"ghost-2")
