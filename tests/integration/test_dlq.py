"""Dead letters end to end: garbage of every kind written by a client that is not ours (kcat)
into a wakeup topic while a processor keeps committing good runs; every bad record lands in
the dead-letter topic with its reason, original bytes and headers; `ductor dlq list` shows them
and `ductor dlq replay` sends a fixed or now-valid record back to be processed."""

from __future__ import annotations

import re
import subprocess
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.records import normalise_headers
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import DeadLetter, read_dead_letters
from processor.io.postgres.runs_admin import insert_runs

from .children import run_ductor
from .instances import ProcessorThread, WorkerThread
from .kcat import envelope, kcat_path, run_of_a_vanished_workflow
from .runs import count_terminal, run_statuses
from .samples import SAMPLE
from .waiting import wait_for

pytestmark = pytest.mark.integration

MAX_BYTES = 1024


@dataclass(frozen=True)
class Sent:
    """A record written with kcat; ``reason`` is the dead-letter reason expected (None: good)."""

    seq: int
    key: str
    value: bytes | None
    reason: str | None

    def headers(self) -> list[tuple[str, bytes]]:
        return [("x-origin", b"kcat"), ("x-seq", str(self.seq).encode())]


def _kcat_produce(settings: Settings, topic: str, record: Sent, tmp_path: Path) -> None:
    """One record per kcat run: a file given to `kcat -P` is sent whole as one message."""
    command = [kcat_path(), "-b", settings.bootstrap_servers, "-P", "-t", topic]
    for name, value in record.headers():
        command += ["-H", f"{name}={value.decode()}"]
    stdin = None
    if record.value is None:
        # A tombstone: kcat sends nothing for an empty file, but with -Z an empty value after
        # the key delimiter on stdin goes out as NULL.
        assert ":" not in record.key
        command += ["-K", ":", "-Z"]
        stdin = f"{record.key}:\n".encode()
    else:
        path = tmp_path / f"record-{record.seq}"
        path.write_bytes(record.value)
        command += ["-k", record.key, str(path)]
    done = subprocess.run(command, input=stdin, capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, f"kcat failed: {done.stderr.decode(errors='replace')}"


def _garbage(tag: str) -> list[tuple[bytes | None, str]]:
    """(value, expected reason) for every way a wakeup can be bad."""
    return [
        (b"\x00\xff\xfe binary, not JSON {", "not_json"),
        (b"hello, processor", "not_json"),
        (b'{"envelope_version": 1, "reason": "start"}', "wrong_schema"),  # no run_id
        (envelope(f"good-{tag}-0", colour="blue"), "wrong_schema"),  # unknown field
        (b"[1, 2, 3]", "wrong_schema"),
        (None, "wrong_schema"),  # tombstone
        (
            orjson.dumps({"envelope_version": 99, "run_id": "r", "reason": "start"}),
            "unknown_envelope_version",
        ),
        (envelope(f"good-{tag}-1") + b" " * (MAX_BYTES + 100), "oversize"),
        (envelope(f"ghost-{tag}"), "unknown_run"),
        (envelope(f"orphan-{tag}"), "unknown_workflow"),
        (envelope(f"tampered-{tag}"), "checksum_mismatch"),
    ]


def _read_at(settings: Settings, topic: str, partition: int, offset: int) -> Any:
    """The record at one offset of a topic, read with a plain consumer (no group, no commit)."""
    consumer = Consumer(
        {
            "bootstrap.servers": settings.bootstrap_servers,
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([KafkaTopicPartition(topic, partition, offset)])
    found: list[Any] = []

    def read() -> bool:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            found.append(message)
        return bool(found)

    wait_for(read, 30, f"the record at {topic}[{partition}]@{offset}")
    consumer.close()
    assert found[0].offset() == offset
    return found[0]


def test_garbage_from_an_outside_client_is_dead_lettered_listed_and_replayed(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any, tmp_path: Path
) -> None:
    # No overdue sweep: the runs are inserted long before kcat's records reach them (one kcat
    # run per record, slow under load), and a sweep's wakeup of the tampered or the orphaned
    # run would be a dead letter nobody sent.
    settings = replace(settings, max_record_bytes=MAX_BYTES, sweep_grace_s=3600.0)
    tag = uuid.uuid4().hex[:6]
    sample = parse_workflow(orjson.loads(SAMPLE.read_bytes()))
    good_ids = [f"good-{tag}-{i}" for i in range(20)]
    insert_runs(pg, sample, [(r, {}) for r in good_ids], "t1")
    insert_runs(pg, sample, [(f"tampered-{tag}", {}), (f"fixed-{tag}", {})], "t1")
    pg.execute(
        "UPDATE eec_workflow_run SET state_checksum = 'not-the-checksum' WHERE run_id = %s",
        (f"tampered-{tag}",),
    )
    garbage = _garbage(tag)
    # Good and bad records interleaved, so the processor commits good runs between poison.
    records: list[Sent] = []
    for i, run_id in enumerate(good_ids):
        records.append(Sent(len(records), f"{run_id}:0", envelope(run_id), None))
        if i < len(garbage):
            value, reason = garbage[i]
            records.append(Sent(len(records), f"bad-{i}", value, reason))
    bad = [r for r in records if r.reason is not None]
    assert {r.reason for r in bad} == {
        "not_json",
        "wrong_schema",
        "unknown_envelope_version",
        "oversize",
        "unknown_run",
        "unknown_workflow",
        "checksum_mismatch",
    }
    names = TopicNames(settings.topic_prefix)
    source_topic = names.wakeup("t1")

    with run_of_a_vanished_workflow(pg, f"orphan-{tag}"):
        instance: ProcessorThread = processor_thread(settings)
        worker = WorkerThread(settings)
        try:
            for record in records:
                _kcat_produce(settings, source_topic, record, tmp_path)
            wait_for(
                lambda: count_terminal(pg, good_ids) == len(good_ids), 120, "the good runs to end"
            )
            wait_for(
                lambda: sum(instance.stats.dead_letters.values()) == len(bad),
                60,
                f"{len(bad)} dead letters",
            )
            assert set(run_statuses(pg, good_ids).values()) == {"succeeded"}

            letters = read_dead_letters(settings)
            assert len(letters) == len(bad)
            by_seq = {int(letter.header("x-seq") or -1): letter for letter in letters}
            for record in bad:
                _check_letter(settings, by_seq[record.seq], record, source_topic)

            _check_list_command(settings, letters)
            _check_replays(settings, pg, letters, tag, tmp_path)
            # The replayed records were processed, not dead-lettered again.
            assert sum(instance.stats.dead_letters.values()) == len(bad)
        finally:
            worker.stop()
    # A row changed out of band is an error as well as a dead letter; nothing else failed.
    assert dict(instance.stats.errors) == {"checksum_mismatch": 1}


def _check_letter(settings: Settings, letter: DeadLetter, sent: Sent, source_topic: str) -> None:
    assert letter.reason == sent.reason, f"record {sent.seq}: {letter.describe()}"
    assert letter.key == sent.key.encode()
    # The original bytes, exactly: a tombstone stays a tombstone.
    assert letter.value == sent.value
    assert letter.original_headers() == sent.headers()
    assert letter.detail
    assert letter.source_topic == source_topic
    assert letter.source_partition is not None and letter.source_offset is not None
    # The source coordinates point at the very record kcat wrote.
    original = _read_at(settings, source_topic, letter.source_partition, letter.source_offset)
    assert original.key() == letter.key
    assert original.value() == letter.value
    assert normalise_headers(original) == sent.headers()


def _check_list_command(settings: Settings, letters: list[DeadLetter]) -> None:
    listed = run_ductor(settings, "dlq", "list")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert len(lines) == len(letters)
    for line, letter in zip(lines, letters, strict=True):
        source = f"{letter.source_topic}[{letter.source_partition}]@{letter.source_offset}"
        assert line.startswith(f"{letter.partition}:{letter.offset}  {letter.reason}  {source}")
        assert "key=" in line and "value=" in line
    assert f"{len(letters)} dead letter(s)" in listed.stderr

    only = run_ductor(settings, "dlq", "list", "--reason", "not_json")
    assert only.returncode == 0, only.stderr
    assert len(only.stdout.splitlines()) == 2
    assert all("  not_json  " in line for line in only.stdout.splitlines())

    limited = run_ductor(settings, "dlq", "list", "--limit", "3")
    assert limited.returncode == 0 and len(limited.stdout.splitlines()) == 3

    assert run_ductor(settings, "dlq", "list", "--reason", "no_such_reason").returncode == 2
    assert run_ductor(settings, "dlq", "list", "--limit", "0").returncode == 2


def _check_replays(
    settings: Settings,
    pg: psycopg.Connection[Any],
    letters: list[DeadLetter],
    tag: str,
    tmp_path: Path,
) -> None:
    not_json = next(d for d in letters if d.reason == "not_json")
    # Unfixed, it would only be dead-lettered again: refused.
    refused = run_ductor(settings, "dlq", "replay", str(not_json.offset))
    assert refused.returncode == 1
    assert "dead-lettered again" in refused.stderr

    # Fixed: a valid wakeup for a run that was never woken.
    fixed_id = f"fixed-{tag}"
    fix = tmp_path / "fixed.json"
    fix.write_bytes(envelope(fixed_id))
    replayed = run_ductor(settings, "dlq", "replay", str(not_json.offset), "--value-file", str(fix))
    assert replayed.returncode == 0, replayed.stderr
    where = re.search(r"to (\S+) partition (\d+) offset (\d+)", replayed.stdout)
    assert where is not None, replayed.stdout
    again = _read_at(settings, where[1], int(where[2]), int(where[3]))
    assert where[1] == not_json.source_topic
    assert again.key() == not_json.key
    assert again.value() == fix.read_bytes()
    assert normalise_headers(again) == not_json.original_headers()  # no ductor.dlq.* left
    wait_for(
        lambda: run_statuses(pg, [fixed_id]).get(fixed_id) == "succeeded",
        60,
        "the fixed record's run to succeed",
    )

    # A wakeup for a run that did not exist yet: once the run is there, the original bytes
    # replay as they are.
    unknown = next(d for d in letters if d.reason == "unknown_run")
    ghost_id = f"ghost-{tag}"
    insert_runs(pg, parse_workflow(orjson.loads(SAMPLE.read_bytes())), [(ghost_id, {})], "t1")
    replayed = run_ductor(settings, "dlq", "replay", str(unknown.offset), "--partition", "0")
    assert replayed.returncode == 0, replayed.stderr
    wait_for(
        lambda: run_statuses(pg, [ghost_id]).get(ghost_id) == "succeeded",
        60,
        "the replayed run to succeed",
    )

    missing = run_ductor(settings, "dlq", "replay", "999999")
    assert missing.returncode == 1
    assert "has no offset 999999" in missing.stderr
