"""The request statement: a batch of start and signal requests from ``ductor.requests``
(core/requests.py) applied in one transaction, each answered (core/request_plans.py).

Starts first, then signals, so that a signal read after its run's start in the same batch
finds the run. A start inserts its run as ``ductor start`` does (io/runs_admin.py's
``insert_runs``: an existing run id is left alone and compared; the run created takes the
signals kept for it). A signal is recorded for its run, or kept (the run does
not exist yet: it may race its start) with the record's bytes, for its dead letter should the
start never come (io/kept_signals.py). Every write is idempotent by its key, so a batch redelivered
after a crash answers as before: a created run is then found started before.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import groupby
from typing import Any

import orjson
import psycopg

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
from processor.core.workflow import WorkflowDef
from processor.io.kept_signals import encode_headers
from processor.io.runs_admin import ExistingRun, insert_runs
from processor.io.store import Definitions

# One request and the record it came in (its bytes and position, kept with an early signal).
Item = tuple[Request, Inbound]

# Each signal is recorded if its run exists (the LEFT JOIN reads the run table as it is
# after this transaction's starts); the rows say which were new and each run's tier.
_RECORD_SIGNALS = """
WITH given AS (
    SELECT * FROM unnest(%(runs)s::text[], %(ids)s::text[], %(kinds)s::text[],
                         %(payloads)s::jsonb[]) AS g(run_id, signal_id, kind, payload)
), recorded AS (
    INSERT INTO eec_run_signal (run_id, signal_id, kind, payload)
    SELECT g.run_id, g.signal_id, g.kind, g.payload FROM given g
     WHERE EXISTS (SELECT 1 FROM eec_workflow_run r WHERE r.run_id = g.run_id)
    ON CONFLICT DO NOTHING
    RETURNING run_id, signal_id
)
SELECT g.run_id, g.signal_id, r.tier, c.run_id IS NOT NULL
  FROM given g
  LEFT JOIN eec_workflow_run r ON r.run_id = g.run_id
  LEFT JOIN recorded c ON c.run_id = g.run_id AND c.signal_id = g.signal_id
"""

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
    conn: psycopg.Connection[Any], definitions: Definitions, items: Sequence[Item]
) -> list[RequestAnswer]:
    """Apply the requests in one transaction; the answer of each, in order."""
    answers: list[RequestAnswer | None] = [None] * len(items)
    with conn.transaction():
        _starts(conn, definitions, items, answers)
        _signals(conn, items, answers)
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
    conn: psycopg.Connection[Any], items: Sequence[Item], answers: list[RequestAnswer | None]
) -> None:
    indexes = [i for i, (request, _) in enumerate(items) if isinstance(request, SignalRequest)]
    if not indexes:
        return
    signals = [_signal(items[i][0]) for i in indexes]
    rows = conn.execute(
        _RECORD_SIGNALS,
        {
            "runs": [s.run_id for s in signals],
            "ids": [s.signal_id for s in signals],
            "kinds": [s.name for s in signals],
            "payloads": [_json(s.payload) for s in signals],
        },
    ).fetchall()
    found = {(r[0], r[1]): (r[2], bool(r[3])) for r in rows}
    answered: set[tuple[str, str]] = set()  # a signal given twice in the batch is new once
    kept: list[int] = []
    for i, signal in zip(indexes, signals, strict=True):
        key = (signal.run_id, signal.signal_id)
        tier, new = found[key]
        if tier is None:
            kept.append(i)
            continue
        answers[i] = Signalled(tier, new and key not in answered)
        answered.add(key)
    if kept:
        _keep(conn, items, kept, answers)


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
