"""Dead letters: read the dead-letter topic, and replay a record to the topic it came from.

The processor dead-letters a record it cannot process (see ``Effects.dead_letter``): it sends
the original key, value and headers to ``<prefix>.dlq`` with ``ductor.dlq.*`` headers saying
why and where from. Reading never joins a consumer group and never commits, so listing is
free of side effects and always starts from the beginning.

Replaying produces the record again with its original key and headers (the ``ductor.dlq.*``
ones removed) and either its original value or a fixed one. A wakeup is idempotent, so
replaying a record twice only wakes the run twice; the second tick is a no-op.

A bad record is one dead letter. A record's offset is committed after the broker has its
dead letter, so an instance killed in between leaves it to the next owner of its partition,
which dead-letters it again: the same source topic, partition and offset (the ``ductor.dlq.*``
headers every dead letter carries). That source position is the dead letter's identity:
reading folds the copies into the first one (``DeadLetter.copies`` counts them), so every
listing and count (``ductor dlq list``, the web page, the chaos run) has each bad record once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from confluent_kafka import Consumer, KafkaError, Producer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.dead_letters import (
    DETAIL,
    DLQ_HEADER_PREFIX,
    REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
)
from processor.core.envelope import Rejected, decode_wakeup
from processor.core.records import Headers, normalise_headers
from processor.core.requests import decode_request
from processor.core.routing import TopicNames, partition_for
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config, reader_config
from processor.io.kafka.errors import DlqError, DlqTopicMissing
from processor.io.kafka.logs import with_logger

_READ_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class DeadLetter:
    """One record of the dead-letter topic."""

    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    copies: int = 1  # times its record was dead-lettered (again after a crash: module doc)

    def header(self, name: str) -> str | None:
        """The last header of that name, as text (the processor writes them as UTF-8)."""
        found = [v for k, v in self.headers if k == name]
        return found[-1].decode("utf-8", "replace") if found else None

    @property
    def reason(self) -> str:
        return self.header(REASON) or "?"

    @property
    def detail(self) -> str:
        return self.header(DETAIL) or ""

    @property
    def source_topic(self) -> str | None:
        return self.header(SOURCE_TOPIC)

    @property
    def source_partition(self) -> int | None:
        return _int_or_none(self.header(SOURCE_PARTITION))

    @property
    def source_offset(self) -> int | None:
        return _int_or_none(self.header(SOURCE_OFFSET))

    @property
    def identity(self) -> tuple[str, int, int]:
        """Which bad record this is the dead letter of: its source topic, partition and
        offset; one whose headers do not say (not written by Ductor) is its own record."""
        topic, partition, offset = self.source_topic, self.source_partition, self.source_offset
        if topic is None or partition is None or offset is None:
            return ("", self.partition, self.offset)  # no topic is named "": never a source
        return (topic, partition, offset)

    def original_headers(self) -> Headers:
        """The headers the record had before it was dead-lettered."""
        return [(k, v) for k, v in self.headers if not k.startswith(DLQ_HEADER_PREFIX)]

    @property
    def source(self) -> str:
        """Where it came from: ``topic[partition]@offset`` (``?`` for what its headers lack)."""
        where = f"{self.source_topic or '?'}[{_show_int(self.source_partition)}]"
        return where + f"@{_show_int(self.source_offset)}"

    def key_excerpt(self, limit: int = 40) -> str:
        """Its key's first ``limit`` bytes as one line of text."""
        return _excerpt(self.key, limit)

    def value_excerpt(self, limit: int = 60) -> str:
        return _excerpt(self.value, limit)

    def detail_line(self) -> str:
        return _printable(self.detail)

    def describe(self) -> str:
        """One line for `ductor dlq list` (the web page shows the same parts)."""
        return (
            f"{self.partition}:{self.offset}  {self.reason}  {self.source}"
            f"  key={self.key_excerpt()}  value={self.value_excerpt()}  {self.detail_line()}"
        )


@dataclass(frozen=True)
class Replayed:
    """Where a replayed record went."""

    topic: str
    partition: int
    offset: int


def read_dead_letters(
    settings: Settings,
    *,
    reason: str | None = None,
    limit: int | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> list[DeadLetter]:
    """The dead letters from the beginning of the topic up to its end when called (records
    written meanwhile are not waited for), optionally only one reason, at most ``limit``: one
    per bad record, its copies folded into the first read (module doc). ``since_ms``/
    ``until_ms``: only those written from then (inclusive) until then (exclusive), epoch ms,
    found by the records' timestamps (the web page reads a window of time: it never reads the
    whole topic for the letters of one reason)."""
    folded = Folded(reason, limit)
    topic = TopicNames(settings.topic_prefix).dlq
    consumer = _reader(settings)
    try:
        spans = _partitions(consumer, topic)
        if since_ms is not None or until_ms is not None:
            spans = _between(consumer, topic, spans, since_ms, until_ms)
        _read_to_end(consumer, topic, spans, folded.add)
    finally:
        consumer.close()
    return folded.letters()


class Folded:
    """Dead letters as they are read, one per bad record: a copy (the same ``identity``) is
    folded into the first one read, counted in its ``copies``. Only ``reason``'s, if given,
    are kept, ``limit`` of them at most."""

    def __init__(self, reason: str | None = None, limit: int | None = None) -> None:
        self._reason = reason
        self._limit = limit
        self._first: dict[tuple[str, int, int], DeadLetter] = {}
        self._kept: list[tuple[str, int, int]] = []

    def add(self, letter: DeadLetter) -> bool:
        """Take the next letter read; False once ``limit`` letters are kept."""
        identity = letter.identity
        seen = self._first.get(identity)
        if seen is not None:
            self._first[identity] = replace(seen, copies=seen.copies + 1)
        else:
            self._first[identity] = letter
            if self._reason is None or letter.reason == self._reason:
                self._kept.append(identity)
        return self._limit is None or len(self._kept) < self._limit

    def letters(self) -> list[DeadLetter]:
        """The letters kept, in the topic's order (partition, offset)."""
        found = (self._first[identity] for identity in self._kept)
        return sorted(found, key=lambda d: (d.partition, d.offset))


def fetch_dead_letter(settings: Settings, partition: int, offset: int) -> DeadLetter:
    """The dead letter at ``offset`` of ``partition``, or DlqError if there is none."""
    topic = TopicNames(settings.topic_prefix).dlq
    consumer = _reader(settings)
    try:
        spans = _partitions(consumer, topic)
        if partition not in spans:
            raise DlqError(f"{topic} has no partition {partition}")
        low, high = spans[partition]
        if not low <= offset < high:
            held = f"offsets {low} to {high - 1}" if high > low else "no records"
            raise DlqError(
                f"{topic} partition {partition} has no offset {offset} (it holds {held})"
            )
        found: list[DeadLetter] = []

        def keep(letter: DeadLetter) -> bool:
            found.append(letter)
            return False  # the first record read is the one asked for, or the next one

        _read_to_end(consumer, topic, {partition: (offset, high)}, keep)
    finally:
        consumer.close()
    if not found or found[0].offset != offset:
        # Compaction or a transaction marker can leave a hole in the offsets.
        raise DlqError(f"{topic} partition {partition} has no record at offset {offset}")
    return found[0]


def replay(
    settings: Settings, letter: DeadLetter, value: bytes | None = None, *, force: bool = False
) -> Replayed:
    """Produce ``letter`` again to its source topic, with ``value`` instead of its own if
    given. Refuses (DlqError) a value the processor would dead-letter again, unless ``force``."""
    names = TopicNames(settings.topic_prefix)
    topic = letter.source_topic
    where = f"{names.dlq} partition {letter.partition} offset {letter.offset}"
    if topic is None:
        raise DlqError(f"the record at {where} has no ductor.dlq.topic header")
    # Only the processor's own input topics: a forged header must not inject step tasks.
    if topic not in names.coordinator_topics():
        raise DlqError(
            f"the record at {where} came from {topic}, not a wakeup, delay or requests topic"
        )
    body = letter.value if value is None else value
    decode = decode_request if topic == names.requests else decode_wakeup
    decoded = decode(body, settings.max_record_bytes)
    if isinstance(decoded, Rejected) and not force:
        raise DlqError(
            f"the value would be dead-lettered again ({decoded.reason}: {decoded.detail});"
            " give a fixed one with --value-file, or --force"
        )
    producer = Producer(with_logger(producer_config(settings, "ductor-dlq-replay")))
    count = _partition_count(producer, topic)
    if not isinstance(decoded, Rejected) and settings.partition_by_run:
        # Where every other producer of this run's wakeups writes (kafka_io.partition_for).
        partition: int | None = partition_for(decoded.run_id, count)
    elif letter.source_partition is not None and letter.source_partition < count:
        partition = letter.source_partition
    else:
        partition = None
    acked: list[tuple[KafkaError | None, Any]] = []
    produce(
        producer,
        topic,
        body,
        letter.key,
        partition,
        letter.original_headers(),
        lambda err, msg: acked.append((err, msg)),
    )
    if producer.flush(_READ_TIMEOUT_S) != 0 or not acked:
        raise DlqError(
            f"the broker did not acknowledge the replayed record within {_READ_TIMEOUT_S:.0f} s"
        )
    err, msg = acked[0]
    if err is not None:
        raise DlqError(f"the replayed record was refused: {err.str()}")
    return Replayed(topic=topic, partition=msg.partition(), offset=msg.offset())


# -- reading ---------------------------------------------------------------------------------


def _reader(settings: Settings) -> Consumer:
    # assign() and no commits: the group id only satisfies the client, nothing joins a group.
    return Consumer(
        with_logger(
            reader_config(
                settings, "ductor-dlq-reader", f"ductor-dlq-reader-{uuid.uuid4().hex[:8]}"
            )
        )
    )


def _partition_count(client: Consumer | Producer, topic: str) -> int:
    meta = client.list_topics(topic, timeout=10).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise DlqTopicMissing(f"topic {topic} does not exist; run `ductor topics create` first")
    return len(meta.partitions)


def _partitions(consumer: Consumer, topic: str) -> dict[int, tuple[int, int]]:
    """Each partition's (low, high) watermarks: where to start and where the end was."""
    spans: dict[int, tuple[int, int]] = {}
    for partition in range(_partition_count(consumer, topic)):
        spans[partition] = consumer.get_watermark_offsets(
            KafkaTopicPartition(topic, partition), timeout=10, cached=False
        )
    return spans


def _between(
    consumer: Consumer,
    topic: str,
    spans: dict[int, tuple[int, int]],
    since_ms: int | None,
    until_ms: int | None,
) -> dict[int, tuple[int, int]]:
    """``spans`` narrowed to the records written from ``since_ms`` until ``until_ms``: each
    partition's first offset whose timestamp is at or after each time (the broker's time
    index; -1, none: the partition's end)."""

    def offsets_at(at_ms: int | None) -> dict[int, int]:
        if at_ms is None:
            return {p: high for p, (_low, high) in spans.items()}
        asked = [KafkaTopicPartition(topic, p, at_ms) for p in spans]
        found = consumer.offsets_for_times(asked, timeout=10) if asked else []
        return {
            tp.partition: (tp.offset if tp.offset >= 0 else spans[tp.partition][1]) for tp in found
        }

    starts, ends = offsets_at(since_ms), offsets_at(until_ms)
    narrowed = {}
    for partition, (low, high) in spans.items():
        start = max(low, starts.get(partition, high))
        narrowed[partition] = (start, max(start, min(high, ends.get(partition, high))))
    return narrowed


def _read_to_end(
    consumer: Consumer,
    topic: str,
    spans: dict[int, tuple[int, int]],
    keep: Callable[[DeadLetter], bool],
) -> None:
    """Read each partition from its start offset to its end offset (exclusive), giving every
    record to ``keep`` until it returns False."""
    remaining = {p: high for p, (start, high) in spans.items() if high > start}
    if not remaining:
        return
    consumer.assign([KafkaTopicPartition(topic, p, spans[p][0]) for p in remaining])
    deadline = time.monotonic() + _READ_TIMEOUT_S
    ends = dict(remaining)
    while remaining:
        if time.monotonic() > deadline:
            raise DlqError(f"could not read {topic} to its end within {_READ_TIMEOUT_S:.0f} s")
        for message in consumer.consume(500, 0.5):
            error = message.error()
            partition, offset = message.partition(), message.offset()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF and partition is not None:
                    remaining.pop(partition, None)  # nothing more: done even if offsets skip
                    continue
                raise DlqError(f"reading {topic} failed: {error.str()}")
            assert partition is not None and offset is not None  # set on every data record
            if partition not in remaining or offset >= ends[partition]:
                continue  # written after the listing began
            if offset >= ends[partition] - 1:
                remaining.pop(partition)
            letter = DeadLetter(
                partition=partition,
                offset=offset,
                key=message.key(),
                value=message.value(),
                headers=normalise_headers(message),
            )
            if not keep(letter):
                return


# -- formatting ------------------------------------------------------------------------------


def _int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


def _show_int(value: int | None) -> str:
    return "?" if value is None else str(value)


def _printable(text: str) -> str:
    """Control characters escaped, so one record stays on one line."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _excerpt(raw: bytes | None, limit: int) -> str:
    if raw is None:
        return "(null)"
    shown = _printable(raw[:limit].decode("utf-8", "backslashreplace"))
    if len(raw) > limit:
        shown += f"...({len(raw)} bytes)"
    return shown
