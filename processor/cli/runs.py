"""Commands about workflows and runs: workflows register, start, inspect, signal, runs
release."""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path

import orjson

from processor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError
from processor.client import connect, start_runs, wake
from processor.core.model import SignalKind, ValidationError, parse_workflow, state_checksum
from processor.io.config import Settings
from processor.io.runs_admin import (
    insert_signal,
    register_workflow,
    release_quarantine,
    run_columns,
    run_tier,
)
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
        columns = run_columns(conn, args.run_id)
        run = load_runs(conn, Definitions(), [args.run_id]).get(args.run_id)
    if run is None or columns is None:
        raise CliError(f"no run with id {args.run_id!r}")
    print(f"run        {args.run_id}")
    print(f"workflow   {columns.workflow[0]} v{columns.workflow[1]}")
    if columns.quarantined_at is not None:
        print(f"QUARANTINED since {columns.quarantined_at}: {columns.quarantine_reason}")
        print("           the sweeps skip it; repair the row, then `ductor runs release RUN_ID`")
    if isinstance(run, Exception):  # the row cannot be loaded: what it says, as stored
        print(f"status     {columns.status} (as stored; the row cannot be loaded: {run})")
        print(f"version    {columns.version}   tier {columns.tier}")
        return EXIT_FAILED
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
    healthy = run.checksum_ok and columns.quarantined_at is None
    return EXIT_OK if healthy else EXIT_FAILED


def cmd_signal(settings: Settings, args: argparse.Namespace) -> int:
    kind = SignalKind(args.kind)
    signal_id = args.signal_id or f"{kind.value}-{uuid.uuid4().hex[:12]}"
    with connect(settings) as conn:
        tier = run_tier(conn, args.run_id)
        if tier is None:
            raise CliError(f"no run with id {args.run_id!r}")
        new = insert_signal(conn, args.run_id, signal_id, kind)
    wake(settings, [args.run_id], tier, "signal")
    print(f"signal {kind.value} {'sent' if new else 'was already recorded'} ({signal_id})")
    return EXIT_OK


def cmd_runs_release(settings: Settings, args: argparse.Namespace) -> int:
    """Clear a run's quarantine flag and wake it: a repaired row goes on; one still broken is
    dead-lettered and quarantined again."""
    with connect(settings) as conn:
        tier = run_tier(conn, args.run_id)
        if tier is None:
            raise CliError(f"no run with id {args.run_id!r}")
        if not release_quarantine(conn, args.run_id):
            raise CliError(f"run {args.run_id!r} is not quarantined")
    wake(settings, [args.run_id], tier, "replay")
    print(f"run {args.run_id} released and woken")
    return EXIT_OK
