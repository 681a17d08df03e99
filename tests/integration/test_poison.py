"""One bad row never stops the line, against the real database: a run whose commit fails on
what it holds is isolated from its batch and dead-lettered as poison while the runs batched
with it go on; runs of a workflow whose definition row cannot be read are dead-lettered."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from processor.client import start_runs
from processor.core.dead_letters import TRUNCATED
from processor.core.envelope import Wakeup
from processor.core.routing import TopicNames
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import DeadLetter, read_dead_letters
from processor.io.postgres.runs_admin import insert_runs

from .instances import ProcessorThread
from .runs import count_terminal, run_statuses
from .samples import produce_wakeups, sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

# A row that makes any batched UPDATE containing it fail with a data error (SQLSTATE 22000),
# the way text Postgres cannot store or a constraint would: test-only, dropped afterwards.
_POISON_TRIGGER = """
CREATE OR REPLACE FUNCTION test_poison_fn() RETURNS trigger AS $$
BEGIN
  IF NEW.run_id LIKE 'poison-%' THEN
    RAISE EXCEPTION 'this row cannot be written' USING ERRCODE = '22000';
  END IF;
  RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE TRIGGER test_poison_trg BEFORE UPDATE ON eec_workflow_run
    FOR EACH ROW EXECUTE FUNCTION test_poison_fn();
"""


@pytest.fixture
def poison_trigger(pg: psycopg.Connection[Any]) -> Iterator[None]:
    pg.execute(_POISON_TRIGGER)
    yield
    pg.execute("DROP TRIGGER IF EXISTS test_poison_trg ON eec_workflow_run")


def test_a_run_that_fails_its_batch_is_isolated_and_dead_lettered_as_poison(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any, poison_trigger: None
) -> None:
    good = [f"good-{i}" for i in range(60)]
    run_ids = [*good[:30], "poison-1", *good[30:]]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in run_ids], "t1")
    # All on one partition, produced before the processor starts: they arrive in one fetch and
    # go into one batch, the poison run in the middle of the good ones.
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    produce_wakeups(settings, [(topic, Wakeup(r, "start"), 0) for r in run_ids])
    # (and a linger long enough for the first batch to take them all; no sweep re-wakes them
    # meanwhile, which would give the poison run a second wakeup, so a second dead letter)
    instance: ProcessorThread = processor_thread(
        replace(settings, batch_linger_ms=1000, sweep_grace_s=3600.0)
    )
    # Their first tick dispatches `fetch`: every good run moves to running in the same batches.
    wait_for(
        lambda: set(run_statuses(pg, good).values()) == {"running"}, 60, "the good runs to move"
    )
    # The counter moves when the dead letter is decided; the topic has it once acknowledged.
    wait_for(lambda: len(_letters(settings, "poison")) == 1, 30, "the poison dead letter")
    (letter,) = _letters(settings, "poison")
    assert letter.key == b"poison-1:0"
    assert "this row cannot be written" in letter.detail
    assert run_statuses(pg, ["poison-1"]) == {"poison-1": "pending"}  # never written
    # Isolated at once: the batch never failed as a whole, no run was retried for it.
    assert dict(instance.stats.errors) == {"poison": 1} and not instance.stats.ticks["error"]
    assert instance.stats.conflicts == 0
    assert instance.stats.ticks["committed"] == len(good)  # each good run once, none held


def _letters(settings: Settings, reason: str) -> list[DeadLetter]:
    return [d for d in read_dead_letters(settings) if d.reason == reason]


def test_runs_of_an_unreadable_workflow_definition_are_dead_lettered(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """A definition row written by hand that does not parse: its runs are dead-lettered as
    unknown_workflow, and the processor goes on with every other run."""
    # One start record, one dead letter: the overdue sweep's wakeup of broken-1 (not ticked
    # within the grace while the processor joins on a slow machine) would be a second.
    settings = replace(settings, sweep_grace_s=3600.0)
    start_runs(settings, "sample", ["broken-1", "fine-1"])
    pg.execute(
        "INSERT INTO eec_workflow_definition (name, version, definition) VALUES (%s, 1, %s)"
        " ON CONFLICT (name, version) DO NOTHING",  # left by an earlier run that failed
        ("broken", '{"name": "broken"}'),
    )
    pg.execute("UPDATE eec_workflow_run SET workflow_name = 'broken' WHERE run_id = 'broken-1'")
    instance: ProcessorThread = processor_thread(settings)
    wait_for(
        lambda: run_statuses(pg, ["fine-1"]) == {"fine-1": "running"}, 60, "the fine run to move"
    )
    wait_for(lambda: instance.stats.dead_letters["unknown_workflow"] == 1, 30, "the dead letter")
    # Counted when decided; in the topic once the broker acknowledged it.
    wait_for(lambda: len(_letters(settings, "unknown_workflow")) == 1, 30, "it in its topic")
    (letter,) = _letters(settings, "unknown_workflow")
    assert "cannot be read" in letter.detail and letter.key == b"broken-1:0"
    assert count_terminal(pg, ["broken-1", "fine-1"]) == 0
    pg.execute(
        "DELETE FROM eec_outbox WHERE run_id IN"
        " (SELECT run_id FROM eec_workflow_run WHERE workflow_name = 'broken')"
    )
    pg.execute("DELETE FROM eec_workflow_run WHERE workflow_name = 'broken'")
    pg.execute("DELETE FROM eec_workflow_definition WHERE name = 'broken'")


def test_a_record_too_large_to_dead_letter_whole_goes_truncated_and_nothing_stops(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """A 1,040,000-byte record (the broker takes it; our producer's limit is 1,000,000) on a
    wakeup topic beside good runs: its dead letter keeps a prefix and says the original size,
    the processor does not stop, and the good runs move."""
    good = [f"beside-big-{i}" for i in range(20)]
    start_runs(settings, "sample", good)
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    big = b"{" + b" " * 1_039_998 + b"}"
    producer = Producer({**settings.kafka_common(), "message.max.bytes": 2_000_000})
    producer.produce(topic, value=big, key=b"big", headers=[("origin", b"test")], partition=1)
    assert producer.flush(30) == 0
    instance: ProcessorThread = processor_thread(settings)
    wait_for(
        lambda: set(run_statuses(pg, good).values()) == {"running"}, 60, "the good runs to move"
    )
    wait_for(lambda: len(_letters(settings, "oversize")) == 1, 30, "the oversize dead letter")
    assert instance.stats.dead_letters["oversize"] == 1
    (letter,) = _letters(settings, "oversize")
    assert letter.header(TRUNCATED) == str(len(big))
    assert letter.value is not None and big.startswith(letter.value)
    assert 0 < len(letter.value) < 1_000_000 and letter.key == b"big"
    assert letter.header("origin") == "test" and letter.source_offset is not None
    assert not instance.stats.errors
