"""Commands about workflows and runs: workflows register, start, inspect, signal."""

from __future__ import annotations

import argparse
import time
import uuid
from pathlib import Path

import orjson
from confluent_kafka import Producer

from processor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from processor.client import connect, start_runs
from processor.core.envelope import Wakeup
from processor.core.model import SignalKind, ValidationError, parse_workflow, state_checksum
from processor.core.routing import TopicNames, partition_for
from processor.io.config import Settings
from processor.io.kafka import produce, producer_config, topic_partitions
from processor.io.runs_admin import insert_signal, register_workflow, run_columns, run_tier
from processor.io.store import Definitions, load_runs
from processor.io.workflow_schema import WorkflowSchemaError, check_workflow_document


def cmd_workflows_register(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        raw = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}", EXIT_USAGE) from None
    try:
        check_workflow_document(raw)
        wf = parse_workflow(raw)
    except (WorkflowSchemaError, ValidationError) as exc:
        raise CliError(f"{path}: {exc}", EXIT_USAGE) from None
    with connect(settings) as conn:
        try:
            new = register_workflow(conn, wf)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    print(f"workflow {wf.name} v{wf.version} {'registered' if new else 'already registered'}")
    return EXIT_OK


def cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    try:
        run_input = orjson.loads(args.input) if args.input else {}
    except orjson.JSONDecodeError as exc:
        raise CliError(f"--input is not valid JSON: {exc}", EXIT_USAGE) from None
    if args.count < 1:
        raise CliError("--count must be at least 1", EXIT_USAGE)
    if args.run_id:
        ids = (
            [args.run_id] if args.count == 1 else [f"{args.run_id}-{i}" for i in range(args.count)]
        )
    else:
        ids = [f"{args.workflow}-{uuid.uuid4().hex[:12]}" for _ in range(args.count)]
    inserted = start_runs(settings, args.workflow, ids, run_input, args.tier)
    if args.count == 1:
        print(ids[0] if inserted else f"{ids[0]} (already started)")
    else:
        print(f"started {len(inserted)} run(s), {len(ids) - len(inserted)} already existed")
    return EXIT_OK


def cmd_inspect(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        run = load_runs(conn, Definitions(), [args.run_id]).get(args.run_id)
        columns = run_columns(conn, args.run_id)
    if run is None or columns is None:
        raise CliError(f"no run with id {args.run_id!r}")
    if isinstance(run, Exception):
        raise CliError(str(run))
    print(f"run        {run.run_id}")
    print(f"workflow   {run.workflow[0]} v{run.workflow[1]}")
    print(
        f"status     {run.state.status.value}"
        + (f" ({run.state.reason})" if run.state.reason else "")
    )
    print(f"version    {columns.version}   seq {run.state.seq}   tier {run.tier}")
    check = "ok" if run.checksum_ok else f"MISMATCH (row says {run.stored_checksum})"
    print(f"checksum   {state_checksum(run.state)} {check}")
    print(f"next wake  {columns.next_wakeup_at or '-'}")
    print("nodes:")
    for name, node in run.state.nodes:
        extra = f"  error: {node.error}" if node.error else ""
        print(f"  {name:20} {node.status.value:11} attempt {node.attempt}{extra}")
    return EXIT_OK if run.checksum_ok else EXIT_FAILED


def cmd_signal(settings: Settings, args: argparse.Namespace) -> int:
    kind = SignalKind(args.kind)
    signal_id = args.signal_id or f"{kind.value}-{uuid.uuid4().hex[:12]}"
    with connect(settings) as conn:
        tier = run_tier(conn, args.run_id)
        if tier is None:
            raise CliError(f"no run with id {args.run_id!r}")
        new = insert_signal(conn, args.run_id, signal_id, kind)
    producer = Producer(producer_config(settings, "ductor-cli"))
    topic = TopicNames(settings.topic_prefix).wakeup(tier)
    partitions = topic_partitions(producer, [topic])[topic]
    wakeup = Wakeup(run_id=args.run_id, reason="signal", produced_at=int(time.time() * 1000))
    produce(producer, topic, wakeup.encode(), wakeup.key(), partition_for(args.run_id, partitions))
    if producer.flush(30) != 0:
        raise CliError("the broker did not acknowledge the signal's wakeup within 30 s")
    print(f"signal {kind.value} {'sent' if new else 'was already recorded'} ({signal_id})")
    return EXIT_OK
