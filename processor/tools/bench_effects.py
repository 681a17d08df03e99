"""What it costs Postgres to make a committed transition's effects durable, by design.

`python -m processor.tools.bench_effects [--runs N] [--rounds R]` measures, on scratch tables of
the real database (dropped afterwards), ticks per second of the batched conditional UPDATE:

- ``update only``: today's commit (effects are produced after it and can be lost in between);
- ``outbox``: the same statement also inserts each committed transition's effects into an
  outbox table (a CTE, one round trip), and a second batched statement deletes them once
  the broker acknowledged them (a relay re-sends what stays);
- ``ack marker``: the same UPDATE, then a second batched UPDATE of the run rows marking the
  transition's effects acknowledged (a sweep re-derives effects for rows left unmarked, found
  through a partial index).

The batches are computed first; only the statements are timed. Best of ``rounds``, variants
interleaved so that the machine's drift hits all of them alike.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg

from processor.core.routing import run_shard
from processor.core.run_state import initial_state, state_checksum
from processor.core.tick import tick
from processor.core.workflow import parse_workflow
from processor.io.config.settings import load_settings

_WF = parse_workflow({"name": "effects", "version": 1, "steps": [{"name": "only", "type": "fast"}]})

_SETUP = """
CREATE SCHEMA {s};
CREATE TABLE {s}.run (LIKE public.eec_workflow_run INCLUDING ALL);
ALTER TABLE {s}.run ADD COLUMN effects_acked_seq bigint NOT NULL DEFAULT 0;
CREATE INDEX ON {s}.run (last_transition_at)
    WHERE effects_acked_seq < last_transition_seq AND status IN ('pending', 'running');
CREATE TABLE {s}.outbox (
    run_id text NOT NULL, seq bigint NOT NULL, shard bigint NOT NULL, effects jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (run_id, seq));
CREATE INDEX ON {s}.outbox (created_at);
"""

_UPDATE = """
WITH ordered AS MATERIALIZED (
    SELECT run_id FROM {s}.run
     WHERE run_id IN (SELECT jsonb_array_elements_text(%(ids)s::jsonb))
     ORDER BY run_id FOR UPDATE
), updated AS (
UPDATE {s}.run AS r
   SET db_record_version = r.db_record_version + 1, status = c.status,
       node_states = c.node_states, last_transition_seq = c.seq, state_checksum = c.checksum,
       failure_reason = c.reason, next_wakeup_at = to_timestamp(c.next_wakeup_ms / 1000.0),
       updated_at = now(), last_transition_at = now()
  FROM jsonb_to_recordset(%(batch)s::jsonb)
       AS c(run_id text, expected_version bigint, status text, node_states jsonb, seq bigint,
            checksum text, reason text, next_wakeup_ms bigint, shard bigint, effects jsonb)
 WHERE r.run_id = c.run_id AND r.db_record_version = c.expected_version
   AND r.run_id IN (SELECT run_id FROM ordered)
RETURNING r.run_id, c.seq, c.shard, c.effects
){outbox}
SELECT run_id FROM updated
"""

_OUTBOX_INSERT = """, outboxed AS (
    INSERT INTO {s}.outbox (run_id, seq, shard, effects)
    SELECT run_id, seq, shard, effects FROM updated
)"""

# The acknowledgements of the previous batch, deleted by the next commit statement.
_OUTBOX_DELETE_CTE = """, acked AS (
    DELETE FROM {s}.outbox o
     USING jsonb_to_recordset(%(acked)s::jsonb) AS a(run_id text, seq bigint)
     WHERE o.run_id = a.run_id AND o.seq = a.seq
)"""

_OUTBOX_DELETE = """
DELETE FROM {s}.outbox o USING jsonb_to_recordset(%s::jsonb) AS a(run_id text, seq bigint)
 WHERE o.run_id = a.run_id AND o.seq = a.seq
"""

_MARK = """
UPDATE {s}.run AS r SET effects_acked_seq = a.seq
  FROM jsonb_to_recordset(%s::jsonb) AS a(run_id text, seq bigint)
 WHERE r.run_id = a.run_id AND r.effects_acked_seq < a.seq
"""

VARIANTS = ("update only", "outbox", "outbox, deletes ride on the next commit", "ack marker")


def _batches(run_ids: Sequence[str], size: int) -> list[tuple[str, str, str]]:
    """(ids, commit batch, acknowledgements) documents per batch, as the engine would send."""
    state = initial_state(_WF)
    decision = tick(state, _WF, (), (), int(time.time() * 1000))
    assert decision.new_state is not None
    new = decision.new_state
    out = []
    for start in range(0, len(run_ids), size):
        ids = list(run_ids[start : start + size])
        rows = [
            {
                "run_id": r,
                "expected_version": 1,
                "status": new.status.value,
                "node_states": new.nodes_json(),
                "seq": new.seq,
                "checksum": state_checksum(new),
                "reason": None,
                "next_wakeup_ms": new.next_due_ms(),
                "shard": run_shard(r),
                # One step task: about the size the engine produces.
                "effects": [["ductor.steps", r, f'{{"task_version":1,"run_id":"{r}"}}' * 3]],
            }
            for r in ids
        ]
        acks = [{"run_id": r, "seq": new.seq} for r in ids]
        out.append(
            (orjson.dumps(ids).decode(), orjson.dumps(rows).decode(), orjson.dumps(acks).decode())
        )
    return out


def _round(conn: psycopg.Connection[Any], schema: str, variant: str, runs: int, size: int) -> float:
    conn.execute(f"TRUNCATE {schema}.run, {schema}.outbox")
    ids = [f"e-{i}" for i in range(runs)]
    state = initial_state(_WF)
    conn.execute(
        f"INSERT INTO {schema}.run (run_id, workflow_name, workflow_version, status, node_states,"
        " last_transition_seq, state_checksum, shard)"
        " SELECT i, %s, %s, %s, %s::jsonb, 0, %s, 0 FROM unnest(%s::text[]) AS i",
        (_WF.name, _WF.version, state.status.value, orjson.dumps(state.nodes_json()).decode(),
         state_checksum(state), ids),
    )  # fmt: skip
    conn.execute(f"VACUUM ANALYZE {schema}.run")
    batches = _batches(ids, size)
    riding = variant.startswith("outbox, deletes")
    outbox = _OUTBOX_INSERT.format(s=schema) if variant.startswith("outbox") else ""
    if riding:
        outbox += _OUTBOX_DELETE_CTE.format(s=schema)
    update = _UPDATE.format(s=schema, outbox=outbox)
    ack = {"outbox": _OUTBOX_DELETE, "ack marker": _MARK}.get(variant, "").format(s=schema)
    started = time.perf_counter()
    committed = 0
    previous_acks = "[]"
    for ids_doc, batch_doc, acks_doc in batches:
        params = {"ids": ids_doc, "batch": batch_doc, "acked": previous_acks}
        committed += len(conn.execute(update, params).fetchall())
        if ack:
            conn.execute(ack, (acks_doc,))
        previous_acks = acks_doc
    if riding:
        conn.execute(_OUTBOX_DELETE.format(s=schema), (previous_acks,))
    elapsed = time.perf_counter() - started
    assert committed == runs, f"{variant}: {committed} of {runs} committed"
    return runs / elapsed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_effects", description=__doc__)
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args(argv)
    settings = load_settings()
    schema = f"bench_effects_{uuid.uuid4().hex[:6]}"
    best = dict.fromkeys(VARIANTS, 0.0)
    with psycopg.connect(settings.pg_dsn, autocommit=True) as conn:
        conn.execute(_SETUP.format(s=schema))
        try:
            for _ in range(args.rounds):
                for variant in VARIANTS:
                    rate = _round(conn, schema, variant, args.runs, args.batch)
                    best[variant] = max(best[variant], rate)
        finally:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")
    base = best["update only"]
    shape = f"{args.runs} runs, batches of {args.batch}, best of {args.rounds}"
    print(f"durable effects, Postgres cost ({shape})")
    for variant in VARIANTS:
        rate = best[variant]
        print(f"  {variant:40} {rate:8.0f} ticks/s   {rate / base:5.2f} x update only")
    return 0


if __name__ == "__main__":
    sys.exit(main())
