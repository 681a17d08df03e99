"""Bounds at every door, on the real services (core/bounds.py, core/run_ids.py): hostile JSON
written with kcat to ductor.requests and to a trigger's topic, driven by the strategy of
tests/unit/strategies.py besides the cases the issue met (an input nested 300 levels
crash-looped every processor), read by two `ductor process` children; `ductor start`,
`signal` and `schedules create` and the client's calls; a step returning what cannot be
stored; a child whose input Postgres aggregated beyond the bounds; a map over such a list.
No process exits; every record is refused once (one dead letter at its position, the reason
the decoder gives) or does what it asks once; a command exits 2 naming the path, having
written nothing."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from processor.client import start_run
from processor.core.bounds import json_problem
from processor.core.envelope import Rejected
from processor.core.records import Inbound
from processor.core.requests import SignalRequest, StartRequest, decode_request
from processor.core.routing import TopicNames, partition_for
from processor.core.triggers import RunIdFrom, Trigger, map_record, parse_path
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow
from tests.unit.strategies import hostile_json_bytes, hostile_request, hostile_values, json_values

from .children import Spawned, run_ductor, still_running
from .instances import WorkerThread
from .kcat import end_offset, kcat_produce_many
from .runs import count_terminal
from .samples import SAMPLE
from .test_triggers import _team_topic
from .waiting import wait_for

pytestmark = pytest.mark.integration

WORKFLOW = {**orjson.loads(SAMPLE.read_bytes()), "name": f"bounded-{uuid.uuid4().hex[:8]}"}
# The run each round's signals go to: it waits for "go" (the name they send), then for a
# signal nobody sends, so it is live for every signal of the round whatever came first (a
# signal that cannot land, on a run that has ended or of a name no step waits for, is refused:
# core/landing.py).
WAITER_NAME = f"waiter-{uuid.uuid4().hex[:8]}"
WAITER = {
    "name": WAITER_NAME,
    "version": 1,
    "steps": [
        {"name": "hear", "kind": "wait", "signal": "go"},
        {"name": "hold", "kind": "wait", "signal": "never", "depends_on": ["hear"]},
    ],
}


def nest(depth: int, leaf: bytes = b"1") -> bytes:
    return b"[" * depth + leaf + b"]" * depth


# The records the issue met and their kin, as (what, raw field): each is an input of a start
# and a payload of a signal on ductor.requests, and a trigger record's input.
KNOWN = [
    ("nested 300 levels (crash-looped every processor)", nest(300)),
    ("nested 254 levels (orjson's most)", nest(254)),
    ("nested 65 levels", nest(65)),
    ("nested 64 levels", nest(64)),
    ("nested 1,030 levels (past what orjson reads)", nest(1030)),
    ("a NUL in a key", b'{"a\\u0000":1}'),
    ("an integer past 64 bits", b'{"n":[1,123456789012345678901234567890]}'),
    ("a lone surrogate", b'"\\ud800"'),
    ("bytes that are not UTF-8", b'"\xff"'),
    ("a key given twice", b'{"a":1,"a":2}'),
]


class Doors:
    """What was written to the requests topic and a trigger's topic, and what the decoder says
    of each record (the oracle: a processor must do the same, once)."""

    def __init__(self, settings: Settings, team_topic: str, trigger: Trigger) -> None:
        self.settings = settings
        self.team_topic = team_topic
        self.trigger = trigger
        self.refused: dict[tuple[str, int, int], str] = {}  # (topic, partition, offset): reason
        self.starts: dict[str, Any] = {}  # run id: its input as decoded
        self.signals: dict[str, str] = {}  # signal id: its run

    def requests(self, records: list[tuple[str, bytes]]) -> None:
        """(key, value) records to ductor.requests, each on its key's partition."""
        topic = TopicNames(self.settings.topic_prefix).requests
        by_partition: dict[int, list[tuple[str, bytes]]] = defaultdict(list)
        for key, value in records:
            by_partition[partition_for(key, self.settings.wakeup_partitions)].append((key, value))
        for partition, batch in sorted(by_partition.items()):
            first = end_offset(self.settings, topic, partition)
            kcat_produce_many(self.settings, topic, partition, [(k.encode(), v) for k, v in batch])
            for offset, (_, value) in enumerate(batch, first):
                self._expect(topic, partition, offset, decode_request(value, self._limit))

    def team_records(self, values: list[bytes]) -> None:
        """Records of the trigger's topic (partition 0)."""
        first = end_offset(self.settings, self.team_topic, 0)
        kcat_produce_many(self.settings, self.team_topic, 0, [(b"k", v) for v in values])
        for offset, value in enumerate(values, first):
            record = Inbound((self.team_topic, 0), offset, b"k", value, [], "trigger")
            self._expect(self.team_topic, 0, offset, map_record(self.trigger, record, self._limit))

    @property
    def _limit(self) -> int:
        return self.settings.max_record_bytes

    def _expect(self, topic: str, partition: int, offset: int, decoded: Any) -> None:
        if isinstance(decoded, Rejected):
            self.refused[(topic, partition, offset)] = decoded.reason.value
        elif isinstance(decoded, StartRequest):
            self.starts[decoded.run_id] = decoded.input
        else:
            assert isinstance(decoded, SignalRequest)
            self.signals[decoded.signal_id] = decoded.run_id

    def letters(self) -> Counter[tuple[str, int, int, str]]:
        return Counter(
            (d.source_topic or "", d.source_partition or 0, d.source_offset or 0, d.reason)
            for d in read_dead_letters(self.settings)
        )

    def settled(self, pg: psycopg.Connection[Any], *processes: Spawned) -> bool:
        """Every refused record dead-lettered, every start a run that ended, every signal
        recorded (and every processor still running)."""
        still_running(*processes)
        letters = self.letters()
        if any(letters[(*where, reason)] == 0 for where, reason in self.refused.items()):
            return False
        if count_terminal(pg, list(self.starts)) < len(self.starts):
            return False
        return _signal_ids(pg) >= set(self.signals)

    def check(self, pg: psycopg.Connection[Any]) -> None:
        """Each refused record once, with the decoder's reason; each start one run with its
        input as decoded, succeeded; each signal recorded once."""
        letters = self.letters()
        for where, reason in self.refused.items():
            assert letters[(*where, reason)] == 1, (where, reason, letters)
        expected = Counter({(*where, reason): 1 for where, reason in self.refused.items()})
        assert +letters == expected, "a dead letter for a record that was not refused"
        rows = pg.execute(
            "SELECT run_id, status, input::text FROM eec_workflow_run WHERE run_id = ANY(%s)",
            (list(self.starts),),
        ).fetchall()
        # Read as Ductor reads jsonb (orjson): 1.5e308 is stored as a numeric of 309 digits,
        # which the stdlib would read as that integer, orjson as the float it was.
        stored = {r[0]: orjson.loads(r[2]) for r in rows}
        assert stored.keys() == self.starts.keys()
        for run_id, run_input in self.starts.items():
            assert _same_json(stored[run_id], {} if run_input is None else run_input), run_id
        assert {r[1] for r in rows} <= {"succeeded"}
        counted = Counter(
            r[0]
            for r in pg.execute(
                "SELECT signal_id FROM eec_run_signal WHERE signal_id = ANY(%s)",
                (list(self.signals),),
            )
        )
        assert counted == Counter(set(self.signals))


def _signal_ids(pg: psycopg.Connection[Any]) -> set[str]:
    return {r[0] for r in pg.execute("SELECT signal_id FROM eec_run_signal")}


@pytest.fixture
def doors(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> tuple[Doors, list[Spawned], Settings]:
    """A trigger on a team topic, two `ductor process` children following it and the
    requests topic, and the workflow the starts name."""
    register_workflow(pg, parse_workflow(WORKFLOW))
    register_workflow(pg, parse_workflow(WAITER))
    settings = replace(settings, trigger_refresh_s=0.5)
    team = _team_topic(settings, "hostile", partitions=1)
    created = run_ductor(
        settings, "triggers", "create", "hostile-in", "--topic", team,
        "--workflow", WORKFLOW["name"], "--run-id", "$.id", "--input", "$.data",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    trigger = Trigger(
        "hostile-in", team, "start", RunIdFrom("value", parse_path("$.id")),
        workflow=WORKFLOW["name"], input=parse_path("$.data"),
    )  # fmt: skip
    processes = [spawn(["process"], settings, f"processor-{i}") for i in range(2)]
    wait_for(
        lambda: still_running(*processes) and sum(p.owned_partitions() for p in processes) > 0,
        60,
        "the processors to own partitions",
    )
    return Doors(settings, team, trigger), processes, settings


def _write_round(doors: Doors, tag: str, fields: list[bytes], good: int) -> None:
    """Each field as a start's input, a signal's payload (to the round's waiting run) and a
    trigger record's input; ``good`` plain starts besides, and the reserved run ids."""
    name = orjson.dumps(WORKFLOW["name"])
    waiter = f"{tag}-waiter"
    start_run(doors.settings, WAITER_NAME, waiter)
    records: list[tuple[str, bytes]] = []
    for i in range(good):
        run_id = f"{tag}-good-{i}"
        records.append((run_id, StartRequest(run_id, WORKFLOW["name"], input={"n": i}).encode()))
    for i, field in enumerate(fields):
        run_id = f"{tag}-start-{i}"
        records.append((run_id, hostile_request("start", field, run_id).replace(b'"w"', name, 1)))
        signal = hostile_request("signal", field, waiter)
        records.append((waiter, signal.replace(b'"s"', f'"{tag}-sig-{i}"'.encode(), 1)))
    for reserved in (f"{tag}-good-0/a#1", "nightly@2030-01-01T00:00:00Z"):
        records.append((reserved, StartRequest(reserved, WORKFLOW["name"]).encode()))
    doors.requests(records)
    team = [_team_record(f"{tag}-t-{i}", field) for i, field in enumerate(fields)]
    team.append(_team_record(f"{tag}-good-1/b#2", b"{}"))
    doors.team_records(team)


def _team_record(run_id: str, data: bytes) -> bytes:
    return b'{"id":' + orjson.dumps(run_id) + b',"data":' + data + b"}"


def test_hostile_records_are_refused_once_and_no_processor_exits(
    doors: tuple[Doors, list[Spawned], Settings], pg: psycopg.Connection[Any]
) -> None:
    door, processes, settings = doors
    worker = WorkerThread(settings)
    try:
        _write_round(door, "known", [field for _, field in KNOWN], good=3)
        wait_for(lambda: door.settled(pg, *processes), 120, "every record to be done")
        door.check(pg)
        assert worker.alive and worker.error is None
    finally:
        worker.stop()
    reasons = Counter(door.refused.values())
    # Per field: a start, a signal and a trigger record; and the three reserved run ids.
    assert reasons == {
        "out_of_bounds": 3 * 5,  # 300, 254 and 65 levels; a NUL; an integer past 64 bits
        "not_json": 3 * 3,  # 1,030 levels, a lone surrogate, not UTF-8
        "reserved_run_id": 3,
    }
    assert door.starts["known-start-9"] == {"a": 2}  # the last of a key given twice
    for process in processes:
        assert process.proc.poll() is None, f"{process.log_path.stem} exited"


@hypothesis_settings(
    max_examples=3,
    deadline=None,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(fields=st.lists(hostile_json_bytes(), min_size=12, max_size=12))
def test_hostile_json_drawn_by_the_strategy_is_refused_or_done_once(
    doors: tuple[Doors, list[Spawned], Settings], pg: psycopg.Connection[Any], fields: list[bytes]
) -> None:
    """The same doors, fed by the strategy (the processors live through every example); the
    decoder is the oracle of what each record must become."""
    door, processes, settings = doors
    worker = WorkerThread(settings)
    try:
        _write_round(door, f"h{uuid.uuid4().hex[:6]}", fields, good=1)
        wait_for(lambda: door.settled(pg, *processes), 120, "every record to be done")
        door.check(pg)
    finally:
        worker.stop()
    still_running(*processes)


@hypothesis_settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(value=st.one_of(hostile_values(), json_values(max_leaves=30)))
def test_the_bounds_agree_with_what_postgres_stores(
    pg: psycopg.Connection[Any], value: Any
) -> None:
    """A value within the bounds is stored by Postgres as jsonb and read back (as Ductor reads
    it, with orjson) as orjson wrote it; a value Postgres refuses is out of the bounds."""
    problem = json_problem(value)
    try:
        encoded = orjson.dumps(value)
    except TypeError:
        assert problem is not None
        return
    try:
        row = pg.execute("SELECT %s::jsonb::text", (encoded.decode(),)).fetchone()
    except psycopg.Error:
        assert problem is not None, "Postgres refused a value within the bounds"
        return
    assert row is not None
    if problem is None:
        assert _same_json(orjson.loads(row[0]), orjson.loads(encoded))


def _same_json(stored: Any, written: Any) -> bool:
    """The same JSON, numbers compared as numbers: jsonb keeps a number as a decimal, so a
    float written with an exponent comes back as the integer it equals (6.6e+16 as
    66000000000000000), the same double."""
    if isinstance(written, float) or isinstance(stored, float):
        return isinstance(stored, int | float) and float(stored) == float(written)
    if isinstance(written, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == written.keys()
            and all(_same_json(stored[k], v) for k, v in written.items())
        )
    if isinstance(written, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(written)
            and all(_same_json(a, b) for a, b in zip(stored, written, strict=True))
        )
    return type(stored) is type(written) and stored == written
