"""The chaos run's hostile producer: what a careless or hostile writer of ``ductor.requests``
sends while the fleet is killed and its services go away, and the checks that nothing it sent
did more than one dead letter each.

The processors of the run read the requests topic under a scope (``DUCTOR_REQUESTS_*``,
core/scopes.py) that the run's own traffic on it fits: starts of the map workflow under the
run's prefixes, and the ``approved`` signal that its wait step waits for. That own traffic is
one run of a map over ``map_items`` items of its input (10,000: the most a map may have),
started and approved through the topic, beside the ordinary runs.

The hostile records come in turn from ``KINDS``, spread over the run like its starts, each
with the dead-letter reason it must get: documents nested 300 levels (starts and signals)
and other JSON no door may store, starts of run ids only Ductor gives (a schedule's
``NAME@TIME``, a child's ``PARENT/STEP#1`` of a live chaos run) or of a chaos run's own id
(colliding), and forged signals: a cancel of a chaos run or of the map run, an approval of a
run outside the scope's prefixes, and an approval the scope lets through to a run that waits
for none (core/landing.py). Each carries a header (``chaos.hostile``) naming it, which its
dead letter keeps, so the check reads the dead letters by source position (copies sent again
after a kill folded: io/kafka/dlq.py) and finds each record refused once, with its reason.

A record whose delivery failed is written again as a new one (the failed one may still have
reached the topic: it may then have one dead letter, or none).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import orjson
import psycopg
from confluent_kafka import KafkaError, Producer

from processor.core.outcomes import DeadLetterReason
from processor.core.requests import SignalRequest, StartRequest
from processor.core.routing import TopicNames, partition_for
from processor.core.workflow import MAP_ITEMS_LIMIT, WorkflowDef, parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce, topic_partitions
from processor.io.kafka.configs import producer_config
from processor.io.kafka.dlq import DeadLetter
from processor.io.kafka.logs import with_logger
from processor.tools import audit, chaos_steps

log = logging.getLogger("ductor.chaos")

MAP_WORKFLOW = "chaos-map"
APPROVAL = "approved"  # the one signal the scope lets through: the map run's wait step's
HEADER = "chaos.hostile"  # names a hostile record: "<n> <kind>"
OWN_HEADER = "chaos.own"  # the run's own traffic on the topic
_BATCH_EVERY_S = 0.5
_DEPTH = 300  # what crash-looped every processor once (issue 40)
_PAST_READERS = 1030  # deeper than orjson reads (1,024 levels)
_OVERSIZE = 70_000  # characters: past DUCTOR_MAX_RECORD_BYTES' default (64 KiB)


# The map run's items in flight: a few per worker slot (the run's 2 workers of 4 slots), so
# that a slot never waits for the coordinator, without a queue that outlasts a step's deadline.
MAP_PARALLELISM = 32


@dataclass(frozen=True)
class HostilePlan:
    records: int = 850  # hostile records, the kinds in turn
    map_items: int = 10_000  # items of the map run (0: no map run), at most MAP_ITEMS_LIMIT
    map_at: float = 0.15  # when the map run is started, as a share of the run's duration


@dataclass(frozen=True)
class Target:
    """What a hostile record is written about: its number, a chaos run that exists (started
    by the feeder: it may have ended), and the run's prefixes."""

    n: int
    live: str
    topic_prefix: str
    map_id: str

    @property
    def prefix(self) -> str:
        return f"{self.topic_prefix}-"


@dataclass(frozen=True)
class Kind:
    name: str
    reason: DeadLetterReason
    build: Callable[[Target], tuple[str, bytes]]  # (key, value)


def nest(depth: int, leaf: bytes = b"1") -> bytes:
    return b"[" * depth + leaf + b"]" * depth


def _start(run_id: str, workflow: str, run_input: bytes = b"{}") -> bytes:
    """A start request written by hand (``run_input``: raw JSON, however hostile)."""
    return (
        b'{"request_version":1,"kind":"start","run_id":'
        + orjson.dumps(run_id)
        + b',"workflow":'
        + orjson.dumps(workflow)
        + b',"input":'
        + run_input
        + b"}"
    )


def _signal(run_id: str, name: str, signal_id: str, payload: bytes = b"{}") -> bytes:
    return (
        b'{"request_version":1,"kind":"signal","run_id":'
        + orjson.dumps(run_id)
        + b',"name":'
        + orjson.dumps(name)
        + b',"signal_id":'
        + orjson.dumps(signal_id)
        + b',"payload":'
        + payload
        + b"}"
    )


def _own(t: Target, what: str) -> str:
    """A run id under the map run's prefix (in the scope) that no start creates."""
    return f"{t.map_id}-{what}-{t.n}"


_OOB, _NOT_JSON = DeadLetterReason.OUT_OF_BOUNDS, DeadLetterReason.NOT_JSON
_NOT_ALLOWED = DeadLetterReason.NOT_ALLOWED


def _deep_start(t: Target) -> tuple[str, bytes]:
    key = _own(t, "deep")
    return key, _start(key, MAP_WORKFLOW, nest(_DEPTH))


def _deep_signal(t: Target) -> tuple[str, bytes]:
    return t.live, _signal(t.live, APPROVAL, f"deep-{t.n}", nest(_DEPTH))


def _deeper_start(t: Target) -> tuple[str, bytes]:
    key = _own(t, "deeper")
    return key, _start(key, MAP_WORKFLOW, nest(_PAST_READERS))


def _nul_run_id(t: Target) -> tuple[str, bytes]:
    return t.live, _start(t.live, MAP_WORKFLOW).replace(b'"run_id":"', b'"run_id":"\\u0000', 1)


def _huge_integer(t: Target) -> tuple[str, bytes]:
    return t.live, _signal(t.live, APPROVAL, f"big-{t.n}", b'{"n":123456789012345678901234567890}')


def _lone_surrogate(t: Target) -> tuple[str, bytes]:
    key = _own(t, "surrogate")
    return key, _start(key, MAP_WORKFLOW, b'"\\ud800"')


def _not_json(t: Target) -> tuple[str, bytes]:
    return t.live, b"\xff\xfe{" + str(t.n).encode()


def _wrong_schema(t: Target) -> tuple[str, bytes]:
    return t.live, b'{"request_version":1,"kind":"stop","run_id":' + orjson.dumps(t.live) + b"}"


def _oversize(t: Target) -> tuple[str, bytes]:
    key = _own(t, "big")
    return key, _start(key, MAP_WORKFLOW, orjson.dumps("x" * _OVERSIZE))


def _schedule_id(t: Target) -> tuple[str, bytes]:
    key = f"{t.prefix}nightly@2030-01-01T00:00:00Z"
    return key, _start(key, MAP_WORKFLOW)


def _child_id(t: Target) -> tuple[str, bytes]:
    key = f"{t.live}/fetch#1"
    return key, _start(key, MAP_WORKFLOW)


def _colliding(t: Target) -> tuple[str, bytes]:
    return t.live, _start(t.live, MAP_WORKFLOW, orjson.dumps({"collide": t.n}))


def _forged_cancel(t: Target) -> tuple[str, bytes]:
    return t.live, _signal(t.live, "cancel", f"forged-{t.n}")


def _forged_map_cancel(t: Target) -> tuple[str, bytes]:
    return t.map_id, _signal(t.map_id, "cancel", f"forged-{t.n}")


def _forged_approval(t: Target) -> tuple[str, bytes]:
    key = f"other-team-{t.n}"
    return key, _signal(key, APPROVAL, f"forged-{t.n}")


def _forged_start(t: Target) -> tuple[str, bytes]:
    key = f"{t.prefix}forged-{t.n}"
    return key, _start(key, "chaos-sample")


def _stray_approval(t: Target) -> tuple[str, bytes]:
    return t.live, _signal(t.live, APPROVAL, f"stray-{t.n}", b'{"by":"mallory"}')


_OOB, _NOT_JSON = DeadLetterReason.OUT_OF_BOUNDS, DeadLetterReason.NOT_JSON
_NOT_ALLOWED, _RESERVED = DeadLetterReason.NOT_ALLOWED, DeadLetterReason.RESERVED_RUN_ID

# Each kind with the reason it must be refused for, written in this order, in turn.
KINDS: tuple[Kind, ...] = (
    Kind("start nested 300 levels", _OOB, _deep_start),
    Kind("signal nested 300 levels", _OOB, _deep_signal),
    Kind("start nested past what orjson reads", _NOT_JSON, _deeper_start),
    Kind("run id with a NUL", _OOB, _nul_run_id),
    Kind("integer past 64 bits", _OOB, _huge_integer),
    Kind("lone surrogate", _NOT_JSON, _lone_surrogate),
    Kind("not JSON", _NOT_JSON, _not_json),
    Kind("wrong schema", DeadLetterReason.WRONG_SCHEMA, _wrong_schema),
    Kind("oversize", DeadLetterReason.OVERSIZE, _oversize),
    Kind("a schedule's run id", _RESERVED, _schedule_id),
    Kind("a child's run id of a chaos run", _RESERVED, _child_id),
    Kind("a chaos run's own id", DeadLetterReason.CONFLICTING_START, _colliding),
    Kind("forged cancel of a chaos run", _NOT_ALLOWED, _forged_cancel),
    Kind("forged cancel of the map run", _NOT_ALLOWED, _forged_map_cancel),
    Kind("forged approval outside the prefixes", _NOT_ALLOWED, _forged_approval),
    Kind("forged start of another workflow", _NOT_ALLOWED, _forged_start),
    Kind("approval of a run that waits for none", DeadLetterReason.UNKNOWN_SIGNAL, _stray_approval),
)


def map_workflow(step_timeout_s: float) -> WorkflowDef:
    """A map of the sample ``fast`` step over the run's input (as many items as a map may
    have: the short run and the long one register the same definition), then a wait for its
    approval (which comes through the requests topic, early: it counts when the wait is
    reached)."""
    return parse_workflow(
        {
            "name": MAP_WORKFLOW,
            "version": 1,
            "steps": [
                {
                    "name": "items",
                    "kind": "map",
                    "type": "fast",
                    "max_items": MAP_ITEMS_LIMIT,
                    "parallelism": MAP_PARALLELISM,
                    "timeout_ms": int(step_timeout_s * 1000),
                    "retry": {"max_attempts": 3, "backoff_ms": 100},
                },
                {"name": "release", "kind": "wait", "signal": APPROVAL, "depends_on": ["items"]},
            ],
            "output": "items",
        }
    )


def map_run_id(topic_prefix: str) -> str:
    """Outside the ordinary runs' prefix (``<topic prefix>-``), whose checks it would join."""
    return f"{topic_prefix}.map"


def scoped(settings: Settings, topic_prefix: str) -> Settings:
    """The processors' settings with the requests topic's scope: the run's own traffic fits
    it, the forged records do not."""
    return replace(
        settings,
        requests_workflows=(MAP_WORKFLOW,),
        requests_run_id_prefixes=(f"{topic_prefix}-", map_run_id(topic_prefix)),
        requests_signals=(APPROVAL,),
    )


class HostileProducer:
    """Writes the run's own traffic and the hostile records on a thread of its own over
    ``over_s`` seconds, riding through the broker's outages; ``started()`` says how many of
    ``run_ids`` exist so far (a record names only a chaos run that exists)."""

    def __init__(
        self,
        settings: Settings,
        plan: HostilePlan,
        run_ids: Sequence[str],
        started: Callable[[], int],
        over_s: float,
        map_after_s: float,
        rng: random.Random,
    ) -> None:
        self._settings = settings
        self.plan = plan
        self._run_ids = list(run_ids)
        self._started = started
        self._over_s = over_s
        self._map_after_s = map_after_s
        self._rng = rng
        self.topic_prefix = settings.topic_prefix
        self.topic = TopicNames(settings.topic_prefix).requests
        self.map_id = map_run_id(settings.topic_prefix)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.sent: dict[str, Kind] = {}  # hostile id: its kind
        self.acknowledged: dict[str, Kind] = {}
        self.failed: dict[str, Kind] = {}  # delivery failed: written again as a new record
        self.own_acknowledged = 0
        self.own_failed = 0
        self.error: BaseException | None = None
        # Records whose delivery failed, to write again: (key, value, kind; None: our own).
        self._again: list[tuple[str, bytes, Kind | None]] = []
        self._thread = threading.Thread(target=self._run, name="chaos-hostile", daemon=True)

    @property
    def own_expected(self) -> int:
        return 2 if self.plan.map_items else 0  # the map run's start and its approval

    def start(self) -> None:
        self._thread.start()

    def join(self, timeout_s: float) -> bool:
        """Wait until every record is acknowledged (or failed and written again); False if
        not."""
        self._thread.join(timeout_s)
        return not self._thread.is_alive() and self.error is None

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            config = {**producer_config(self._settings, "ductor-chaos-hostile"), "log_level": 0}
            producer = Producer(with_logger(config))
            partitions = topic_partitions(producer, [self.topic])[self.topic]
            began = time.monotonic()
            map_due = self.plan.map_items > 0
            batches = max(1, round(self._over_s / _BATCH_EVERY_S))
            size = -(-self.plan.records // batches)
            n = turn = 0
            while n < self.plan.records or map_due:
                if self._stop.wait(max(0.0, began + turn * _BATCH_EVERY_S - time.monotonic())):
                    return
                turn += 1
                if map_due and time.monotonic() - began >= self._map_after_s:
                    self._own_traffic(producer, partitions)
                    map_due = False
                live = self._started()
                for _ in range(min(size, self.plan.records - n) if live else 0):
                    kind = KINDS[n % len(KINDS)]
                    chosen = self._run_ids[self._rng.randrange(live)]
                    target = Target(n, chosen, self._settings.topic_prefix, self.map_id)
                    key, value = kind.build(target)
                    self._send(producer, partitions, key, value, kind)
                    n += 1
                self._send_again(producer, partitions)
            while not self._stop.is_set() and not self._all_answered():
                producer.poll(0.1)
                self._send_again(producer, partitions)
        except BaseException as exc:  # reported by the run, which then fails
            self.error = exc
            log.exception("the chaos run's hostile producer failed")

    def _own_traffic(self, producer: Producer, partitions: int) -> None:
        """The map run's start (its items as its input) and its approval, in that order on
        the map run's partition."""
        items = list(range(self.plan.map_items))
        start = StartRequest(self.map_id, MAP_WORKFLOW, input=items).encode()
        approval = SignalRequest(self.map_id, APPROVAL, f"{self.map_id}:approval", {"by": "chaos"})
        for value in (start, approval.encode()):
            self._send(producer, partitions, self.map_id, value, None)

    def _send(
        self, producer: Producer, partitions: int, key: str, value: bytes, kind: Kind | None
    ) -> None:
        """One record; ``kind`` None: the run's own (written again as it was if its delivery
        fails: a start and a signal are idempotent by their ids)."""
        if kind is None:
            headers = [(OWN_HEADER, b"map")]
        else:
            with self._lock:
                hostile_id = f"{len(self.sent)} {kind.name}"
                self.sent[hostile_id] = kind
            headers = [(HEADER, hostile_id.encode())]

        def delivered(err: KafkaError | None, _msg: Any) -> None:
            with self._lock:
                if kind is None:
                    self.own_acknowledged += err is None
                    self.own_failed += err is not None
                elif err is None:
                    self.acknowledged[hostile_id] = kind
                else:
                    self.failed[hostile_id] = kind
                if err is not None:
                    self._again.append((key, value, kind))

        partition = partition_for(key, partitions)
        produce(producer, self.topic, value, key.encode(), partition, headers, delivered)

    def _send_again(self, producer: Producer, partitions: int) -> None:
        producer.poll(0)
        with self._lock:
            again, self._again = self._again, []
        for key, value, kind in again:
            self._send(producer, partitions, key, value, kind)

    def _all_answered(self) -> bool:
        with self._lock:
            hostile = len(self.acknowledged) + len(self.failed) == len(self.sent)
            return hostile and not self._again and self.own_acknowledged >= self.own_expected


@dataclass
class MapFigures:
    """The map run as it ended."""

    items: int
    status: str | None = None
    outputs: int | None = None
    writes: int | None = None  # audited committed writes (None: the audit failed)
    unversioned: int = 0
    timeouts: int = 0
    attempts_run: int = 0
    extra_executions: int = 0

    def row(self) -> str:
        if not self.items:
            return "none"
        outputs = "no" if self.outputs is None else str(self.outputs)
        return (
            f"{self.items} items: {self.status or 'NOT FOUND'} with {outputs} outputs;"
            f" {self.writes} committed writes checked, {self.unversioned} unversioned;"
            f" {self.attempts_run} attempts ran, {self.extra_executions} executions beyond one"
            f" per attempt; {self.timeouts} attempts timed out"
        )


@dataclass
class HostileVerdict:
    """What became of the hostile records and the map run; ``problems`` says what failed."""

    written: Counter[str]  # acknowledged hostile records, by the reason each must get
    refused: Counter[str]  # their dead letters (one per source position), by reason
    kinds: int
    failed_deliveries: int
    copies: int  # dead letters of hostile records sent again after a kill (folded)
    signals_on_chaos_runs: int
    map_run: MapFigures
    exits: int
    problems: list[str] = field(default_factory=list)
    # The dead letters accounted for, by their place in the dead-letter topic.
    letters: set[tuple[int, int]] = field(default_factory=set)

    def rows(self) -> list[tuple[str, str]]:
        written, refused = sum(self.written.values()), sum(self.refused.values())
        return [
            (
                "hostile",
                f"{written} records of {self.kinds} kinds written to the requests topic through"
                f" the faults ({_counts(self.written)}); {refused} dead letters by source"
                f" position, by reason as written ({self.copies} copies sent again after a"
                f" kill, folded); {self.failed_deliveries} deliveries failed and written again;"
                f" {self.exits} process exits",
            ),
            (
                "forged",
                f"{self.signals_on_chaos_runs} signals recorded on the chaos runs, none kept;"
                " the map run took only its own approval",
            ),
            ("map run", self.map_run.row()),
        ]


def check_hostile(
    conn: psycopg.Connection[Any],
    producer: HostileProducer,
    letters: Sequence[DeadLetter],
    run_ids: Sequence[str],
    exits: int,
) -> HostileVerdict:
    """Each hostile record refused once, with its reason; nothing a hostile record asked for
    done; the map run succeeded with every item's output."""
    topic_prefix = producer.topic_prefix
    by_id: dict[str, list[DeadLetter]] = defaultdict(list)
    for letter in letters:
        hostile_id = letter.header(HEADER)
        if hostile_id is not None and letter.source_topic == producer.topic:
            by_id[hostile_id].append(letter)
    verdict = HostileVerdict(
        written=Counter(k.reason.value for k in producer.acknowledged.values()),
        refused=Counter(),
        kinds=len({k.name for k in producer.acknowledged.values()}),
        failed_deliveries=len(producer.failed),
        copies=sum(letter.copies - 1 for found in by_id.values() for letter in found),
        signals_on_chaos_runs=0,
        map_run=MapFigures(producer.plan.map_items),
        exits=exits,
    )
    problems = verdict.problems
    for hostile_id, kind in sorted(producer.sent.items()):
        found = by_id.get(hostile_id, [])
        verdict.letters.update((letter.partition, letter.offset) for letter in found)
        if hostile_id in producer.acknowledged:
            verdict.refused.update(letter.reason for letter in found)
            if len(found) != 1:
                problems.append(f"hostile record {hostile_id!r}: {len(found)} dead letters")
        elif len(found) > 1:  # delivery failed: it may have reached the topic, once
            problems.append(f"hostile record {hostile_id!r} (not delivered): {len(found)}")
        for letter in found:
            if letter.reason != kind.reason.value:
                problems.append(
                    f"hostile record {hostile_id!r} refused as {letter.reason}, not as"
                    f" {kind.reason.value}: {letter.detail}"
                )
    unknown = sorted(set(by_id) - set(producer.sent))
    if unknown:
        problems.append(f"dead letters naming hostile records never written: {unknown[:5]}")
    if producer.error is not None:
        problems.append(f"the hostile producer failed: {producer.error!r}")
    prefix = f"{topic_prefix}-"
    verdict.signals_on_chaos_runs = _count(conn, _SIGNALLED, prefix)
    if verdict.signals_on_chaos_runs:
        problems.append(f"{verdict.signals_on_chaos_runs} signals recorded on chaos runs")
    kept = _count(conn, _KEPT, topic_prefix)
    if kept:
        problems.append(f"{kept} signals kept for run ids of the chaos run")
    made = _count(conn, _MADE, topic_prefix, list(run_ids), producer.map_id)
    taken = _count(conn, _TAKEN, list(run_ids))
    if made or taken:
        problems.append(
            f"runs a hostile start made: {made}; chaos runs of another workflow: {taken}"
        )
    if producer.plan.map_items:
        _check_map(conn, producer.map_id, verdict.map_run, problems)
    return verdict


_SIGNALLED = "SELECT count(*) FROM eec_run_signal WHERE starts_with(run_id, %s)"
_KEPT = "SELECT count(*) FROM eec_kept_signal WHERE starts_with(run_id, %s)"
# Runs of the chaos run's topic prefix that neither the feeder nor the map's start made.
_MADE = (
    "SELECT count(*) FROM eec_workflow_run WHERE starts_with(run_id, %s)"
    " AND NOT run_id = ANY(%s) AND run_id <> %s"
)
_TAKEN = (
    "SELECT count(*) FROM eec_workflow_run"
    " WHERE run_id = ANY(%s) AND workflow_name <> 'chaos-sample'"
)


def _check_map(
    conn: psycopg.Connection[Any], map_id: str, figures: MapFigures, problems: list[str]
) -> None:
    row = conn.execute(
        "SELECT status, CASE WHEN jsonb_typeof(output) = 'array'"
        " THEN jsonb_array_length(output) END FROM eec_workflow_run WHERE run_id = %s",
        (map_id,),
    ).fetchone()
    if row is not None:
        figures.status, figures.outputs = row[0], row[1]
    if figures.status != "succeeded" or figures.outputs != figures.items:
        problems.append(
            f"the map run {map_id} is {figures.status or 'missing'} with {figures.outputs}"
            f" outputs, not succeeded with {figures.items}"
        )
    try:
        figures.writes = audit.assert_transitions_applied_once(conn, map_id)
    except audit.AuditFailure as exc:
        problems.append(f"audit of the map run: {exc}")
    unversioned = audit.unversioned_writes(conn, map_id)
    figures.unversioned = sum(unversioned.values())
    if unversioned:
        problems.append(f"writes to the map run that did not move its version: {unversioned}")
    timeouts = audit.timed_out_attempts(conn, map_id)
    figures.timeouts = len(timeouts)
    reached = chaos_steps.reached_a_worker(conn, map_id)
    lost = [
        t
        for t in timeouts
        if chaos_steps.never_ran((t.run_id, t.node, t.attempt), t.result_at is not None, reached)
    ]
    if lost:
        problems.append(
            f"{len(lost)} map items timed out and never reached a worker:"
            f" {lost[0].node} #{lost[0].attempt}"
        )
    signals = conn.execute("SELECT signal_id FROM eec_run_signal WHERE run_id = %s", (map_id,))
    found = [r[0] for r in signals]
    if found != [f"{map_id}:approval"]:
        problems.append(f"the map run's signals are {found}, not its own approval alone")
    executions = chaos_steps.executions(conn, map_id)
    figures.attempts_run = len(executions)
    figures.extra_executions = chaos_steps.extra_executions(executions)


def _count(conn: psycopg.Connection[Any], sql: str, *params: Any) -> int:
    row = conn.execute(sql, params).fetchone()
    return int(row[0]) if row else 0


def _counts(counter: Counter[str]) -> str:
    return ", ".join(f"{k} {n}" for k, n in counter.most_common()) or "none"
