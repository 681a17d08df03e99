"""A flood of malformed records from an outside client (kcat, in bulk) into a wakeup topic while
good runs commit: the processor never stops, every good run succeeds, and the dead-letter topic
holds exactly one letter for each bad record, none for a good one, keyed by the source offset,
each with the reason expected of it and the record's own key, value and headers.

Everything is written to one partition (wakeup.t0, partition 0) so that every record's offset is
known: the n-th record written is at the partition's end offset before the flood plus n (checked
by reading the partition back). The runs are of tier t1, so the worker's step results go to
wakeup.t1 and nothing but kcat writes to that partition."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import psycopg
import pytest

from processor.core.dead_letters import (
    DETAIL,
    DLQ_HEADER_PREFIX,
    REASON,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    TRUNCATED,
)
from processor.core.envelope import MAX_ATTEMPT, MAX_EPOCH_MS, MAX_REQUEUE_COUNT, MAX_SEQ
from processor.core.records import Headers
from processor.core.routing import TopicNames
from processor.core.workflow_def import MAX_BACKOFF_MS
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import DeadLetter, read_dead_letters
from processor.io.postgres.runs_admin import insert_runs

from .instances import ProcessorThread, WorkerThread
from .kcat import (
    KEY_DELIMITER,
    MESSAGE_DELIMITER,
    committed_offset,
    end_offset,
    envelope,
    kcat_produce_file,
    kcat_produce_many,
    read_partition,
    run_of_a_vanished_workflow,
)
from .runs import count_terminal, run_statuses
from .samples import now_ms, sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

MAX_BYTES = 4096  # the processor's max_record_bytes in this test
GOOD_RUNS = 100
ROUNDS = 4  # each kind of bad record is written this many times, in variants
HUGE_BYTES = 1_040_000  # above the producers' 1,000,000: its dead letter goes truncated
SEED = 20240611
# A wakeup due this much after the flood is built is read before it is due: it hops along the
# delay ladder (it is not dead-lettered) and its run still succeeds.
LATER_MS = 8_000

NOT_JSON, WRONG_SCHEMA, VERSION = "not_json", "wrong_schema", "unknown_envelope_version"
OVERSIZE, UNKNOWN_RUN, UNKNOWN_WORKFLOW = "oversize", "unknown_run", "unknown_workflow"
CHECKSUM, BOUNDS = "checksum_mismatch", "out_of_bounds"


@dataclass(frozen=True)
class Rec:
    """A record to write; ``reason`` is the dead-letter reason expected (None: a good one)."""

    kind: str
    key: bytes | None
    value: bytes | None
    reason: str | None


@dataclass(frozen=True)
class Batch:
    """The records of one kcat run and the headers that run puts on each of them."""

    records: list[Rec]
    headers: Headers
    nulls: bool = False  # kcat -Z: empty key or value sent as NULL
    from_file: bool = False  # one record, from a file (the huge ones)


def _with(run_id: str, /, **fields: Any) -> bytes:
    """A valid envelope for ``run_id`` but for ``fields`` (None: the field left out)."""
    body: dict[str, Any] = {"envelope_version": 1, "run_id": run_id, "reason": "start"}
    body.update(fields)
    return orjson.dumps({k: v for k, v in body.items() if v is not None})


def _raw(run_id: str, rest: bytes) -> bytes:
    """An envelope whose text after ``"run_id": "<run_id>`` is ``rest``, byte for byte."""
    return b'{"envelope_version": 1, "reason": "start", "run_id": "' + run_id.encode() + rest


def _garbage(rng: random.Random) -> bytes:
    """Random bytes that are never JSON: the first one cannot start a UTF-8 text."""
    while True:
        raw = bytes([rng.randrange(0x80, 0x100)]) + rng.randbytes(rng.randrange(0, 400))
        if MESSAGE_DELIMITER not in raw and KEY_DELIMITER not in raw:
            return raw


def _bad_records(round_: int, tag: str, good: list[str], rng: random.Random, now: int) -> list[Rec]:
    """One round of every kind of bad record for the bulk kcat runs. The ones that name an
    existing run (``run``) are bad for the one flaw they carry, nothing else."""
    run = good[round_ % len(good)]
    ghost = f"ghost-{tag}-{round_}"
    kinds: list[tuple[str, bytes, str]] = [
        ("random bytes", _garbage(rng), NOT_JSON),
        ("random bytes", b"\x00" + _garbage(rng), NOT_JSON),
        ("invalid UTF-8", _raw(run, b'\xff\xfe", "attempt": 0}'), NOT_JSON),
        ("invalid UTF-8 (overlong)", _raw(run, b'\xc0\xaf"}'), NOT_JSON),
        ("invalid UTF-8 (surrogate)", _raw(run, b'\xed\xa0\x80"}'), NOT_JSON),
        ("lone surrogate escape", _raw(run, b'\\ud800"}'), NOT_JSON),
        ("byte order mark", b"\xef\xbb\xbf" + envelope(run), NOT_JSON),
        ("truncated JSON", envelope(run)[: 1 + round_ * 7], NOT_JSON),
        ("truncated JSON", envelope(run)[:-1], NOT_JSON),
        ("truncated JSON", _raw(run, b""), NOT_JSON),
        ("empty value", b"", NOT_JSON),
        ("whitespace", b" \t\r\n ", NOT_JSON),
        ("plain text", f"hello, processor {round_}".encode(), NOT_JSON),
        ("trailing garbage", envelope(run) + b" ]", NOT_JSON),
        ("two objects", envelope(run) + envelope(run), NOT_JSON),
        ("single quotes", b"{'envelope_version': 1, 'run_id': 'r', 'reason': 'start'}", NOT_JSON),
        ("infinite number", _raw(run, b'", "attempt": 1e400}'), NOT_JSON),
        ("NaN", _raw(run, b'", "attempt": NaN}'), NOT_JSON),
        ("deep nesting", b"[" * 1500 + b"]" * 1500, NOT_JSON),
        ("not an object", b"null", WRONG_SCHEMA),
        ("not an object", b"true", WRONG_SCHEMA),
        ("not an object", str(round_).encode(), WRONG_SCHEMA),
        ("not an object", b'"start"', WRONG_SCHEMA),
        ("not an object", b"[1, 2, 3]", WRONG_SCHEMA),
        ("missing fields", b"{}", WRONG_SCHEMA),
        ("missing fields", _with(run, run_id=None), WRONG_SCHEMA),
        ("missing fields", _with(run, reason=None), WRONG_SCHEMA),
        ("missing fields", _with(run, envelope_version=None), WRONG_SCHEMA),
        ("wrong types", _with(run, run_id=123), WRONG_SCHEMA),
        ("wrong types", _raw(run, b'", "run_id": null}'), WRONG_SCHEMA),
        ("wrong types", _with(run, run_id=[run]), WRONG_SCHEMA),
        ("wrong types", _with(run, run_id={"id": run}), WRONG_SCHEMA),
        ("wrong types", _with(run, reason=5), WRONG_SCHEMA),
        ("wrong types", _with(run, reason="START"), WRONG_SCHEMA),
        ("wrong types", _with(run, reason=""), WRONG_SCHEMA),
        ("wrong types", _with(run, attempt="1"), WRONG_SCHEMA),
        ("wrong types", _with(run, attempt=1.5), WRONG_SCHEMA),
        ("wrong types", _with(run, attempt=True), WRONG_SCHEMA),
        ("wrong types", _with(run, requeue_count={}), WRONG_SCHEMA),
        ("wrong types", _with(run, due_at="soon"), WRONG_SCHEMA),
        ("wrong types", _with(run, produced_at=1.0), WRONG_SCHEMA),
        ("wrong types", _with(run, envelope_version="1"), WRONG_SCHEMA),
        ("wrong types", _with(run, envelope_version=True), WRONG_SCHEMA),
        ("wrong types", _raw(run, b'", "envelope_version": null}'), WRONG_SCHEMA),
        ("unknown fields", _with(run, colour="blue"), WRONG_SCHEMA),
        ("unknown fields", _with(run, Run_id=run), WRONG_SCHEMA),
        ("unknown fields", _raw(run, b'", "": 0}'), WRONG_SCHEMA),
        ("unknown fields", _with(run, __proto__={"attempt": 1}), WRONG_SCHEMA),
        ("empty run id", _with(""), WRONG_SCHEMA),
        ("run id too long", _with("g" * 201), WRONG_SCHEMA),
        ("negative integers", _with(run, attempt=-1), WRONG_SCHEMA),
        ("negative integers", _with(run, requeue_count=-(2**63)), WRONG_SCHEMA),
        ("negative integers", _with(run, target_at=-1), WRONG_SCHEMA),
        ("negative integers", _with(run, observed_seq=-5), WRONG_SCHEMA),
        # Past 64 bits, the JSON parser gives a float: not an integer.
        ("huge integers", _raw(run, b'", "attempt": 18446744073709551616}'), WRONG_SCHEMA),
        ("huge integers", _raw(run, b'", "due_at": -9223372036854775809}'), WRONG_SCHEMA),
        ("unknown envelope version", _with(run, envelope_version=2), VERSION),
        ("unknown envelope version", _with(run, envelope_version=0), VERSION),
        ("unknown envelope version", _with(run, envelope_version=-1), VERSION),
        ("unknown envelope version", _with(run, envelope_version=1.5), VERSION),
        ("unknown envelope version", _with(run, envelope_version=99 + round_), VERSION),
        ("unknown envelope version", _with(run, envelope_version=2**64 - 1), VERSION),
        ("unknown envelope version", _raw(run, b'", "envelope_version": 1e300}'), VERSION),
        ("huge integers", _with(run, attempt=2**64 - 1), BOUNDS),
        ("huge integers", _with(run, attempt=MAX_ATTEMPT + 1), BOUNDS),
        ("huge integers", _with(run, requeue_count=MAX_REQUEUE_COUNT + 1), BOUNDS),
        ("huge integers", _with(run, observed_seq=MAX_SEQ + 1), BOUNDS),
        ("huge integers", _with(run, due_at=2**64 - 1), BOUNDS),
        ("huge integers", _with(run, target_at=MAX_EPOCH_MS + 1), BOUNDS),
        ("huge integers", _with(run, produced_at=2**63), BOUNDS),
        ("NUL in the run id", _raw(run, b'\\u0000"}'), BOUNDS),
        ("NUL in the run id", _with("\x00"), BOUNDS),
        ("NUL in the run id", _with(f"{ghost}\x00'; DROP TABLE eec_workflow_run; --"), BOUNDS),
        # Past the wakeup tier's horizon (the longest rung plus the clock tolerance, 70 s).
        ("far-future due_at", _with(run, due_at=now + 600_000), BOUNDS),
        ("far-future due_at", _with(run, due_at=now + 365 * 86_400_000), BOUNDS),
        ("far-future target_at", _with(run, target_at=now + MAX_BACKOFF_MS + 86_400_000), BOUNDS),
        # A due time near enough to hop does not make a target past its horizon acceptable.
        (
            "far-future target_at behind a near due_at",
            _with(run, due_at=now + 2_000, target_at=now + MAX_BACKOFF_MS + 86_400_000),
            BOUNDS,
        ),
        ("oversize", _with(run, attempt=round_) + b" " * (MAX_BYTES - 50), OVERSIZE),
        ("oversize", rng.randbytes(MAX_BYTES * 3), OVERSIZE),
        ("unknown run", _with(ghost), UNKNOWN_RUN),
        ("unknown run", _with(ghost), UNKNOWN_RUN),  # twice: coalesced, still two letters
        ("unknown run", _with(ghost, reason="step_result", attempt=3), UNKNOWN_RUN),
        ("unknown run", _with(run.upper()), UNKNOWN_RUN),
        ("unknown run", _with(run + " "), UNKNOWN_RUN),
        ("unknown run", _with("é" * 200), UNKNOWN_RUN),  # 200 characters, 400 bytes
        ("unknown run", _with(f"{ghost}\n\u2028\U0001f4a5"), UNKNOWN_RUN),
        ("SQL in the run id", _with(f"{ghost}'; DROP TABLE eec_workflow_run; --"), UNKNOWN_RUN),
        ("SQL in the run id", _with("' OR '1'='1"), UNKNOWN_RUN),
        ("SQL in the run id", _with(f"{run[:-1]}%"), UNKNOWN_RUN),
        ("SQL in the run id", _with(f"{run[:-1]}_"), UNKNOWN_RUN),
        ("SQL in the run id", _with(f'{ghost}"; SELECT pg_sleep(10); --'), UNKNOWN_RUN),
        ("SQL in the run id", _with(f"{ghost}\\'); $1 $$ E'\\\\x00' ::text"), UNKNOWN_RUN),
        ("unknown workflow", _with(f"orphan-{tag}"), UNKNOWN_WORKFLOW),
        ("unknown workflow", _with(f"orphan-{tag}", reason="signal"), UNKNOWN_WORKFLOW),
        ("tampered row", _with(f"tampered-{tag}"), CHECKSUM),
        ("tampered row", _with(f"tampered-{tag}", reason="timer"), CHECKSUM),
    ]
    records = []
    for i, (kind, value, reason) in enumerate(kinds):
        key = f"bad-{round_}-{i}".encode()
        if i % 9 == 4:  # a key that is not text either
            key = b"\x00\xff\xfe" + key + rng.randbytes(4)
        records.append(Rec(kind, key, value, reason))
    return records


def _good_records(good: list[str], now: int) -> list[Rec]:
    """The wakeups of ``good`` (the last few are written by other runs of kcat): most plain,
    some with a due time a little ahead (they hop along the delay ladder and come back), some
    at the bounds a value may reach."""
    shapes: list[tuple[str, Callable[[str], bytes]]] = [
        ("due a little later", lambda r: _with(r, due_at=now + LATER_MS)),
        ("target a little later", lambda r: _with(r, target_at=now + LATER_MS)),
        ("at the bounds", lambda r: _with(r, attempt=MAX_ATTEMPT, observed_seq=MAX_SEQ)),
        ("at the bounds", lambda r: _with(r, produced_at=MAX_EPOCH_MS, due_at=0, target_at=0)),
        ("at the bounds", lambda r: _with(r, requeue_count=MAX_REQUEUE_COUNT, produced_at=0)),
        ("envelope_version 1.0", lambda r: _raw(r, b'", "envelope_version": 1.0}')),
        ("exactly the size limit", lambda r: envelope(r).ljust(MAX_BYTES, b" ")),
        ("reason replay", lambda r: _with(r, reason="replay")),
    ]
    records = []
    for i, run_id in enumerate(good):
        kind, shape = shapes[i % 10] if i % 10 < len(shapes) else ("plain", envelope)
        records.append(Rec(kind, f"{run_id}:0".encode(), shape(run_id), None))
    return records


def _batches(tag: str, good: list[str], now: int) -> list[Batch]:
    """Every kcat run of the flood, in the order they are written."""
    rng = random.Random(SEED)
    bulk = [r for n in range(ROUNDS) for r in _bad_records(n, tag, good, rng, now)]
    bulk += _good_records(good[:-4], now)
    rng.shuffle(bulk)  # good and bad interleaved
    half = len(bulk) // 2
    origin: Headers = [("x-origin", b"kcat"), ("x-flood", tag.encode())]
    ghost = f"ghost-{tag}-null"
    nulls = [
        Rec("tombstone", f"tomb-{tag}".encode(), None, WRONG_SCHEMA),
        Rec("tombstone with a null key", None, None, WRONG_SCHEMA),
        Rec("good wakeup with a null key", None, envelope(good[-4]), None),
        Rec("not JSON with a null key", None, b"\xff" + tag.encode(), NOT_JSON),
        Rec("tombstone", f"{good[-3]}:0".encode(), None, WRONG_SCHEMA),
        Rec("unknown run with a null key", None, envelope(ghost), UNKNOWN_RUN),
        Rec("good wakeup", f"{good[-3]}:0".encode(), envelope(good[-3]), None),
        Rec("tombstone", b"\x00", None, WRONG_SCHEMA),
    ]
    # Headers named like the processor's own, as if the record had been dead-lettered before
    # (a replay gone wrong, or a forgery): its dead letter carries the processor's verdict.
    forged: Headers = [
        (REASON, b"checksum_mismatch"),
        (DETAIL, b"forged"),
        (SOURCE_TOPIC, f"{tag}.steps".encode()),
        (SOURCE_PARTITION, b"7"),
        (SOURCE_OFFSET, b"0"),
        (TRUNCATED, b"12"),
        ("x-binary", b"\xff\xfe\x01"),
    ]
    with_forged = [
        Rec("forged reason header", b"forged-1", b"not json at all", NOT_JSON),
        Rec("forged reason header", b"forged-2", _with(good[-2], attempt=-3), WRONG_SCHEMA),
        Rec("good wakeup with forged headers", b"forged-3", envelope(good[-2]), None),
        Rec("forged reason header", b"forged-4", envelope(f"ghost-{tag}-forged"), UNKNOWN_RUN),
        Rec("forged reason header", b"forged-5", _with("\x00"), BOUNDS),
        Rec("forged reason header", b"forged-6", envelope(f"tampered-{tag}"), CHECKSUM),
        Rec("good wakeup with forged headers", b"forged-7", envelope(good[-1]), None),
    ]
    huge = [
        envelope(good[0]).ljust(HUGE_BYTES, b" "),
        b"\xfe" + random.Random(SEED).randbytes(HUGE_BYTES + 17),
    ]
    return [
        Batch(bulk[:half], origin),
        Batch([Rec("huge record", b"huge-1", huge[0], OVERSIZE)], origin, from_file=True),
        Batch(nulls, origin, nulls=True),
        Batch(with_forged, [*forged, ("x-origin", b"kcat")]),
        Batch(bulk[half:], origin),
        Batch([Rec("huge record", b"huge-2", huge[1], OVERSIZE)], origin, from_file=True),
    ]


def test_a_flood_of_malformed_records_is_dead_lettered_exactly_by_source_offset(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any, tmp_path: Path
) -> None:
    # Each bad record's dead letter is checked by its source offset: the overdue sweep's own
    # wakeup of the tampered run (not ticked within the grace on a slow machine) would be
    # another record on another topic, so the sweep waits past the test.
    settings = replace(settings, max_record_bytes=MAX_BYTES, sweep_grace_s=3600.0)
    tag = settings.topic_prefix
    good = [f"good-{tag}-{i}" for i in range(GOOD_RUNS)]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in [*good, f"tampered-{tag}"]], "t1")
    pg.execute(
        "UPDATE eec_workflow_run SET state_checksum = 'not-the-checksum' WHERE run_id = %s",
        (f"tampered-{tag}",),
    )
    topic = TopicNames(settings.topic_prefix).wakeup("t0")

    with run_of_a_vanished_workflow(pg, f"orphan-{tag}"):
        instance: ProcessorThread = processor_thread(settings)
        worker = WorkerThread(settings)
        try:
            # Built once the processor reads the partition, so that the records due a little
            # later are read before they are due (and hop) on a slow machine too.
            wait_for(lambda: (topic, 0) in instance.processor.assigned, 30, "the assignment")
            batches = _batches(tag, good, now_ms())
            written = [(r, b.headers) for b in batches for r in b.records]
            bad = [r for r, _ in written if r.reason is not None]
            assert len(bad) > 300 and len(written) - len(bad) == GOOD_RUNS
            assert {r.reason for r in bad} == {
                NOT_JSON,
                WRONG_SCHEMA,
                VERSION,
                OVERSIZE,
                UNKNOWN_RUN,
                UNKNOWN_WORKFLOW,
                CHECKSUM,
                BOUNDS,
            }
            start = end_offset(settings, topic, 0)
            for batch in batches:
                if batch.from_file:
                    (rec,) = batch.records
                    assert rec.key is not None and rec.value is not None
                    kcat_produce_file(
                        settings, topic, 0, rec.key, rec.value, batch.headers, tmp_path
                    )
                else:
                    records = [(r.key, r.value) for r in batch.records]
                    kcat_produce_many(settings, topic, 0, records, batch.headers, nulls=batch.nulls)
            end = start + len(written)
            _check_written(settings, topic, start, end, written)

            # Every record of the flood done (its dead letter acknowledged, its hop sent, its
            # run's tick committed): the processor's group has committed past the last one.
            wait_for(
                lambda: committed_offset(settings, topic, 0, settings.group_id) == end,
                60,
                f"the processor's committed offset on {topic}[0] to reach {end}",
                interval=0.5,
            )
            wait_for(lambda: count_terminal(pg, good) == len(good), 60, "the good runs to end")
            assert Counter(run_statuses(pg, good).values()) == {"succeeded": len(good)}
            letters = read_dead_letters(settings)
            assert instance.alive, "the processor instance stopped"
            assert worker.alive and worker.error is None
        finally:
            worker.stop()

    expected = {start + i: (rec, headers) for i, (rec, headers) in enumerate(written)}
    _check_letters(letters, expected, topic)
    assert len(letters) == len(bad)
    assert Counter({str(k): v for k, v in instance.stats.dead_letters.items()}) == Counter(
        r.reason for r in bad
    )
    later = [r for r, _ in written if r.kind.endswith("a little later")]
    assert instance.stats.ticks["hopped"] >= len(later) > 0
    # The tampered row is an error as well as a dead letter; nothing else failed.
    assert set(instance.stats.errors) == {CHECKSUM}
    assert instance.alive


def _check_written(
    settings: Settings, topic: str, start: int, end: int, written: list[tuple[Rec, Headers]]
) -> None:
    """The partition holds what kcat was given, in that order, from ``start``: the source
    offset of the n-th record is start + n."""
    assert end_offset(settings, topic, 0) == end
    found = read_partition(settings, topic, 0, start, end)
    assert [w.offset for w in found] == list(range(start, end))
    for w, (rec, headers) in zip(found, written, strict=True):
        assert (w.key, w.value, w.headers) == (rec.key, rec.value, headers), rec.kind


def _check_letters(
    letters: list[DeadLetter], expected: dict[int, tuple[Rec, Headers]], topic: str
) -> None:
    """One letter per bad offset, with its reason; none for a good one; each with the
    record's own key, value (or a prefix of it, marked, for a huge one) and headers."""
    by_offset: dict[int, list[DeadLetter]] = {}
    for letter in letters:
        assert (letter.source_topic, letter.source_partition) == (topic, 0), letter.describe()
        assert letter.source_offset is not None
        by_offset.setdefault(letter.source_offset, []).append(letter)
    got = {offset: [d.reason for d in found] for offset, found in by_offset.items()}
    want = {offset: [rec.reason] for offset, (rec, _) in expected.items() if rec.reason}
    wrong = {
        offset: (expected[offset][0].kind if offset in expected else "?", want.get(offset), seen)
        for offset, seen in sorted(got.items())
        if want.get(offset) != seen
    }
    missing = {o: (expected[o][0].kind, r) for o, r in sorted(want.items()) if o not in got}
    assert not wrong and not missing, f"wrong letters: {wrong}; missing letters: {missing}"
    assert got == want

    for offset, (letter,) in by_offset.items():
        rec, headers = expected[offset]
        names = Counter(name for name, _ in letter.headers if name.startswith(DLQ_HEADER_PREFIX))
        ours = {REASON: 1, DETAIL: 1, SOURCE_TOPIC: 1, SOURCE_PARTITION: 1, SOURCE_OFFSET: 1}
        assert letter.key == rec.key, rec.kind
        assert letter.original_headers() == [
            (k, v) for k, v in headers if not k.startswith(DLQ_HEADER_PREFIX)
        ], rec.kind
        assert letter.detail and letter.detail != "forged", rec.kind
        if rec.kind == "huge record":
            assert rec.value is not None and letter.value is not None
            assert names == {**ours, TRUNCATED: 1}
            assert letter.header(TRUNCATED) == str(len(rec.value))
            assert 0 < len(letter.value) < 1_000_000 and rec.value.startswith(letter.value)
        else:
            assert names == ours, rec.kind
            assert letter.value == rec.value, rec.kind  # a tombstone stays a tombstone
