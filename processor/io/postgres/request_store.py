"""The request statement: a batch of start and signal requests from ``ductor.requests``
(core/requests.py) applied in one transaction, each answered (core/request_plans.py).

Starts first, then signals, so that a signal read after its run's start in the same batch
finds the run. A start inserts its run as ``ductor start`` does (io/postgres/runs_admin.py's
``insert_runs``: an existing run id is left alone and compared; the run created takes the
signals kept for it that can land there). A signal is recorded for its run if it can land
there (core/landing.py: the run has not ended, a wait step waits for its name) and refused if
not, or kept (the run does not exist yet: it may race its start) with the record's bytes, for
its dead letter should the start never come or the run turn out not to take it
(io/postgres/kept_signals.py). Every write is idempotent by its key, so a batch redelivered after a
crash answers as before: a created run is then found started before, a signal recorded before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import groupby
from typing import Any

import orjson
import psycopg

from processor.core.landing import landing_problem
from processor.core.model import UnknownWorkflow
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Inbound
from processor.core.request_plans import (
    Created,
    Kept,
    Refused,
    RequestAnswer,
    Signalled,
    StartedBefore,
)
from processor.core.requests import Request, SignalRequest, StartRequest
from processor.core.routing import run_shard
from processor.core.run_input import input_problem
from processor.core.workflow_def import WorkflowDef
from processor.io.postgres.kept_signals import encode_headers
from processor.io.postgres.run_signals import (
    Signal,
    SignalKey,
    SignalTarget,
    record_live_signals,
    signal_targets,
)
from processor.io.postgres.runs_admin import ExistingRun, insert_runs
from processor.io.postgres.store import Definitions
from processor.io.runtime.faults import NO_FAULTS, Faults, Point

# One request and the record it came in (its bytes and position, kept with an early signal).
Item = tuple[Request, Inbound]

_KEEP_SIGNALS = """
INSERT INTO eec_kept_signal (run_id, signal_id, kind, payload, shard, record_key, record_value,
                             record_headers, source_topic, source_partition, source_offset)
SELECT * FROM unnest(%(runs)s::text[], %(ids)s::text[], %(kinds)s::text[],
                     %(payloads)s::jsonb[], %(shards)s::bigint[], %(keys)s::bytea[],
                     %(values)s::bytea[], %(headers)s::jsonb[], %(topics)s::text[],
                     %(partitions)s::integer[], %(offsets)s::bigint[])
ON CONFLICT DO NOTHING
RETURNING run_id, signal_id
"""


def apply_requests(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    items: Sequence[Item],
    faults: Faults = NO_FAULTS,
) -> list[RequestAnswer]:
    """Apply the requests in one transaction; the answer of each, in order."""
    answers: list[RequestAnswer | None] = [None] * len(items)
    with conn.transaction():
        _starts(conn, definitions, items, answers)
        _signals(conn, definitions, items, answers, faults)
    assert all(a is not None for a in answers)
    return [a for a in answers if a is not None]


def _starts(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    items: Sequence[Item],
    answers: list[RequestAnswer | None],
) -> None:
    """Each start, in rounds: a round holds the first start left of each run id, so a run id
    started twice in one batch is answered as if the second came after the first."""
    left = [i for i, (request, _) in enumerate(items) if isinstance(request, StartRequest)]
    latest: dict[str, WorkflowDef | Refused] = {}
    while left:
        seen: set[str] = set()
        round_: list[int] = []
        later: list[int] = []
        for i in left:
            (round_ if items[i][0].run_id not in seen else later).append(i)
            seen.add(items[i][0].run_id)
        _start_round(conn, definitions, latest, items, round_, answers)
        left = later


def _start_round(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    latest: dict[str, WorkflowDef | Refused],
    items: Sequence[Item],
    indexes: list[int],
    answers: list[RequestAnswer | None],
) -> None:
    starts = {i: _start(items[i][0]) for i in indexes}

    def group(i: int) -> tuple[str, int, str]:
        return (starts[i].workflow, starts[i].workflow_version or 0, starts[i].tier)

    for (name, version, tier), members in groupby(sorted(indexes, key=group), key=group):
        wf = _definition(conn, definitions, latest, name, version)
        chosen = list(members)
        if isinstance(wf, Refused):
            for i in chosen:
                answers[i] = wf
            continue
        valid = []
        for i in chosen:
            problem = input_problem(wf, _input(starts[i]))
            if problem is None:
                valid.append(i)
            else:
                answers[i] = Refused(DeadLetterReason.INVALID_INPUT, problem)
        chosen = valid
        if not chosen:
            continue
        runs = [(starts[i].run_id, _input(starts[i])) for i in chosen]
        done = insert_runs(conn, wf, runs, tier)
        created = set(done.created)
        existing = {e.run_id: e for e in done.existing}
        for i in chosen:
            run_id = starts[i].run_id
            if run_id in created:
                answers[i] = Created(tier)
            else:
                answers[i] = _compared(existing[run_id], name, starts[i].workflow_version)


def _input(start: StartRequest) -> Any:
    return {} if start.input is None else start.input


def _start(request: Request) -> StartRequest:
    assert isinstance(request, StartRequest)
    return request


def _definition(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    latest: dict[str, WorkflowDef | Refused],
    name: str,
    version: int,
) -> WorkflowDef | Refused:
    """The workflow a start names (its latest version when ``version`` is 0), or why not."""
    try:
        if version:
            return definitions.get(conn, (name, version))
        if name not in latest:
            latest[name] = definitions.latest(conn, name)
        return latest[name]
    except UnknownWorkflow as exc:
        refused = Refused(DeadLetterReason.UNKNOWN_WORKFLOW, str(exc))
        if not version:
            latest[name] = refused
        return refused


def _compared(run: ExistingRun, workflow: str, version: int | None) -> RequestAnswer:
    """A start whose run id exists: the same start again, or a conflicting one (another
    workflow, another version named, another input). A start naming no version is the same
    as one that made the run on an older one: the latest moves, the run does not."""
    if run.workflow[0] != workflow or version not in (None, run.workflow[1]):
        return Refused(
            DeadLetterReason.CONFLICTING_START,
            f"run {run.run_id!r} exists already, of workflow {run.workflow[0]!r}"
            f" version {run.workflow[1]}",
        )
    if not run.same_input:
        return Refused(
            DeadLetterReason.CONFLICTING_START,
            f"run {run.run_id!r} exists already with another input",
        )
    return StartedBefore(run.tier)


def _signals(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    items: Sequence[Item],
    answers: list[RequestAnswer | None],
    faults: Faults,
) -> None:
    """Each signal recorded for its run if it can land there (core/landing.py), refused if
    not, kept if its run does not exist yet; one recorded before (a redelivery, a producer's
    retry) is answered as recorded before."""
    indexes = [i for i, (request, _) in enumerate(items) if isinstance(request, SignalRequest)]
    if not indexes:
        return
    signals = {i: _as_signal(items[i][0]) for i in indexes}
    targets = signal_targets(conn, [s.key for s in signals.values()])
    kept: list[int] = []
    landing: list[int] = []
    for i in indexes:
        target = targets[signals[i].key]
        if target.workflow is None or target.status is None or target.tier is None:
            kept.append(i)
        elif target.recorded:
            answers[i] = Signalled(target.tier, False)
        else:
            refusal = _refusal(conn, definitions, signals[i], target)
            if refusal is None:
                landing.append(i)
            else:
                answers[i] = refusal
    if landing:
        faults.hit(Point.SIGNALS_READ, [signals[i].run_id for i in landing])
    _land(conn, definitions, [(i, signals[i]) for i in landing], targets, answers)
    if kept:
        _keep(conn, items, kept, answers)


def _land(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    landing: Sequence[tuple[int, Signal]],
    targets: Mapping[SignalKey, SignalTarget],
    answers: list[RequestAnswer | None],
) -> None:
    """Record the signals that can land (their index in the batch, the signal) for their
    live runs, and answer each: recorded, recorded before, or refused by a run that ended
    since it was read."""
    recorded = record_live_signals(conn, [signal for _, signal in landing])
    missed = [signal.key for _, signal in landing if signal.key not in recorded]
    again = signal_targets(conn, missed) if missed else {}
    answered: set[SignalKey] = set()  # a signal given twice in the batch is new once
    for i, signal in landing:
        key = signal.key
        if key in recorded:
            answers[i] = Signalled(_tier(targets[key]), key not in answered)
            answered.add(key)
            continue
        # The run ended since it was read (or, in a race, the signal was recorded meanwhile).
        now = again[key]
        if now.recorded:
            answers[i] = Signalled(_tier(now), False)
            continue
        refusal = _refusal(conn, definitions, signal, now)
        if refusal is None:  # neither: tried again alone by the desk (unexpected_error)
            raise RuntimeError(f"signal {key[1]!r} of run {key[0]!r}: neither refused nor recorded")
        answers[i] = refusal


def _refusal(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    signal: Signal,
    target: SignalTarget,
) -> Refused | None:
    """Why the signal cannot land on its run as it stands (core/landing.py), or None."""
    assert target.workflow is not None and target.status is not None
    try:
        wf = definitions.get(conn, target.workflow)
    except UnknownWorkflow as exc:
        return Refused(DeadLetterReason.UNKNOWN_WORKFLOW, f"run {signal.run_id!r}: {exc}")
    refusal = landing_problem(signal.run_id, wf, target.status, signal.name)
    return None if refusal is None else Refused(refusal.reason, refusal.detail)


def _tier(target: SignalTarget) -> str:
    assert target.tier is not None
    return target.tier


def _as_signal(request: Request) -> Signal:
    assert isinstance(request, SignalRequest)
    return Signal(request.run_id, request.signal_id, request.name, request.payload)


def _signal(request: Request) -> SignalRequest:
    assert isinstance(request, SignalRequest)
    return request


def _keep(
    conn: psycopg.Connection[Any],
    items: Sequence[Item],
    indexes: list[int],
    answers: list[RequestAnswer | None],
) -> None:
    """Keep the signals whose run does not exist yet, with their records."""
    signals = [_signal(items[i][0]) for i in indexes]
    records = [items[i][1] for i in indexes]
    rows = conn.execute(
        _KEEP_SIGNALS,
        {
            "runs": [s.run_id for s in signals],
            "ids": [s.signal_id for s in signals],
            "kinds": [s.name for s in signals],
            "payloads": [_json(s.payload) for s in signals],
            "shards": [run_shard(s.run_id) for s in signals],
            "keys": [r.key for r in records],
            "values": [r.value or b"" for r in records],
            "headers": [orjson.dumps(encode_headers(r.headers)).decode() for r in records],
            "topics": [r.tp[0] for r in records],
            "partitions": [r.tp[1] for r in records],
            "offsets": [r.offset for r in records],
        },
    ).fetchall()
    new = {(r[0], r[1]) for r in rows}
    for i, signal in zip(indexes, signals, strict=True):
        key = (signal.run_id, signal.signal_id)
        answers[i] = Kept(key in new)
        new.discard(key)  # (the same signal twice in the batch: kept once)


def _json(value: Any) -> str:
    return orjson.dumps({} if value is None else value).decode()
