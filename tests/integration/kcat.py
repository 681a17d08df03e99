"""Writing records with kcat, a Kafka client that is not ours, and reading back what it wrote;
the wakeup envelope such records imitate, and a run row no valid wakeup can be processed for
(its workflow definition is gone). Shared by test_dlq.py and test_flood.py."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.records import Headers, normalise_headers
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow

from .waiting import wait_for

# Bulk input for `kcat -P`: records split by MESSAGE_DELIMITER, each one's key and value by
# KEY_DELIMITER. Multi-byte, with no backslash (kcat would unescape it); a record holding either
# is refused before anything is written (kcat would split it in two).
MESSAGE_DELIMITER = b"\n<<ductor-flood: end of record 5c1e9a>>\n"
KEY_DELIMITER = b"\t<<key ends 0b7d>>\t"
_FK = "eec_workflow_run_workflow_name_workflow_version_fkey"


def kcat_path() -> str:
    found = shutil.which("kcat") or shutil.which("kafkacat")
    if found is None:
        pytest.fail("kcat is not installed: run `make tools` (apt-get install kafkacat)")
    return found


def envelope(run_id: str, **extra: Any) -> bytes:
    return orjson.dumps({"envelope_version": 1, "run_id": run_id, "reason": "start", **extra})


def _run_kcat(command: Sequence[str | bytes], stdin: bytes | None) -> None:
    done = subprocess.run(
        [kcat_path(), *command], input=stdin, capture_output=True, timeout=60, check=False
    )
    assert done.returncode == 0, f"kcat failed: {done.stderr.decode(errors='replace')}"


def _produce_flags(
    settings: Settings,
    topic: str,
    partition: int,
    headers: Sequence[tuple[str, bytes]],
    max_bytes: int,
) -> list[str | bytes]:
    flags: list[str | bytes] = ["-b", settings.bootstrap_servers, "-P", "-t", topic]
    flags += ["-p", str(partition), "-X", f"message.max.bytes={max_bytes}"]
    # Idempotent: in order and never duplicated, so the n-th record is at start offset + n.
    flags += ["-X", "enable.idempotence=true"]
    for name, value in headers:
        assert "=" not in name
        flags += ["-H", name.encode() + b"=" + value]  # the same headers on every record
    return flags


def kcat_produce_many(
    settings: Settings,
    topic: str,
    partition: int,
    records: Sequence[tuple[bytes | None, bytes | None]],
    headers: Sequence[tuple[str, bytes]] = (),
    *,
    nulls: bool = False,
) -> None:
    """(key, value) records written by one kcat run, in order, read from its stdin.

    With ``nulls`` (kcat -Z) an empty key or value goes out as NULL, so a None key is a null
    key and a None value a tombstone, and no record may hold an empty one; without it, empty
    is empty and nothing may be None."""
    chunks = []
    for key, value in records:
        for part in (key, value):
            if nulls:
                assert part != b"", "with -Z, kcat would send an empty key or value as NULL"
            else:
                assert part is not None, "without -Z, kcat cannot send a NULL key or value"
            assert part is None or (MESSAGE_DELIMITER not in part and KEY_DELIMITER not in part)
        chunks.append((key or b"") + KEY_DELIMITER + (value or b""))
    command = _produce_flags(settings, topic, partition, headers, 1_000_000)
    command += ["-K", KEY_DELIMITER.decode(), "-D", MESSAGE_DELIMITER.decode()]
    if nulls:
        command.append("-Z")
    _run_kcat(command, MESSAGE_DELIMITER.join(chunks))


def kcat_produce_file(
    settings: Settings,
    topic: str,
    partition: int,
    key: bytes,
    value: bytes,
    headers: Headers,
    tmp_path: Path,
) -> None:
    """One record from a file (a file given to `kcat -P` goes whole as one message), up to
    2,000,000 bytes on the client's side."""
    path = tmp_path / f"record-{uuid.uuid4().hex[:8]}"
    path.write_bytes(value)
    command = _produce_flags(settings, topic, partition, headers, 2_000_000)
    _run_kcat([*command, "-k", key, str(path)], None)


@dataclass(frozen=True)
class Written:
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers


def end_offset(settings: Settings, topic: str, partition: int) -> int:
    """The partition's end offset, asked of its leader (waiting for a new topic to have one)."""
    consumer = Consumer({**settings.kafka_common(), "group.id": f"ends-{uuid.uuid4().hex[:6]}"})
    ends: list[int] = []

    def ask() -> bool:
        try:
            _, high = consumer.get_watermark_offsets(
                KafkaTopicPartition(topic, partition), timeout=5, cached=False
            )
        except KafkaException:  # no leader yet: a topic just created
            return False
        ends.append(int(high))
        return True

    try:
        wait_for(ask, 30, f"the end offset of {topic}[{partition}]", interval=0.2)
    finally:
        consumer.close()
    return ends[0]


def committed_offset(settings: Settings, topic: str, partition: int, group: str) -> int | None:
    """The offset ``group`` has committed on one partition (asked without joining it)."""
    consumer = Consumer({**settings.kafka_common(), "group.id": group})
    try:
        (tp,) = consumer.committed([KafkaTopicPartition(topic, partition)], timeout=10)
    finally:
        consumer.close()
    return int(tp.offset) if tp.offset >= 0 else None


def read_partition(
    settings: Settings, topic: str, partition: int, start: int, end: int
) -> list[Written]:
    """The records at offsets ``start`` to ``end`` (exclusive) of one partition, read with a
    plain consumer (assigned, never subscribed, never committing)."""
    consumer = Consumer(
        {
            **settings.kafka_common(),
            "group.id": f"reader-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 4 * 1024 * 1024,
        }
    )
    found: list[Written] = []

    def read() -> bool:
        for message in consumer.consume(500, 0.2):
            if message.error() is None:
                offset = message.offset()
                assert offset is not None
                headers = normalise_headers(message)
                found.append(Written(offset, message.key(), message.value(), headers))
        return bool(found) and found[-1].offset >= end - 1

    try:
        if end > start:
            consumer.assign([KafkaTopicPartition(topic, partition, start)])
            wait_for(read, 30, f"the records of {topic}[{partition}] up to offset {end}")
    finally:
        consumer.close()
    return [w for w in found if w.offset < end]


@contextmanager
def run_of_a_vanished_workflow(pg: psycopg.Connection[Any], run_id: str) -> Iterator[None]:
    """A run whose workflow definition is gone. The foreign key forbids that state, so the
    key is dropped, the definition deleted and the key added back NOT VALID (enforced for new
    rows, not checked against this one). Afterwards the row goes and the key is validated."""
    wf = parse_workflow(
        {"name": f"vanished-{run_id}", "version": 1, "steps": [{"name": "a", "type": "fast"}]}
    )
    register_workflow(pg, wf)
    insert_runs(pg, wf, [(run_id, {})], "t1")
    with pg.transaction():
        pg.execute(f"ALTER TABLE eec_workflow_run DROP CONSTRAINT {_FK}")
        pg.execute("DELETE FROM eec_workflow_definition WHERE name = %s", (wf.name,))
        pg.execute(
            f"ALTER TABLE eec_workflow_run ADD CONSTRAINT {_FK} FOREIGN KEY"
            " (workflow_name, workflow_version) REFERENCES eec_workflow_definition (name, version)"
            " NOT VALID"
        )
    try:
        yield
    finally:
        pg.execute("DELETE FROM eec_outbox WHERE run_id = %s", (run_id,))
        pg.execute("DELETE FROM eec_workflow_run WHERE run_id = %s", (run_id,))
        pg.execute(f"ALTER TABLE eec_workflow_run VALIDATE CONSTRAINT {_FK}")
