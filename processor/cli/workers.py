"""`ductor workers`: the live workers and what each serves (the instance registry, migration
0032); and the warning `workflows register` and `start` print when no live worker serves a
step type of the workflow."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import psycopg

from processor.cli.common import EXIT_OK, print_table
from processor.cli.grammar import print_json_lines
from processor.client import ClientError, connect
from processor.core.model import UnknownWorkflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.postgres.store import Definitions
from processor.io.postgres.worker_registry import LiveWorker, live_workers, unserved


def register(sub: Any) -> None:
    p = sub.add_parser(
        "workers",
        help="the live step workers: their queues, step types, concurrency, version and the"
        " partitions they hold",
    )
    p.set_defaults(func=cmd_workers)


def cmd_workers(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        workers = live_workers(conn, settings.worker_group_id, settings.instance_timeout_s)
        now = _now(conn)
    if args.output == "json":
        print_json_lines([w.as_json() for w in workers])
        return EXIT_OK
    if not workers:
        print("no live worker (`ductor worker` starts one)")
        return EXIT_OK
    header = (
        "INSTANCE",
        "NAME",
        "HOST:PID",
        "QUEUES",
        "CONCURRENCY",
        "VERSION",
        "PARTITIONS",
        "UP",
        "STEP TYPES",
    )
    rows = [
        (
            w.instance_id,
            w.name or "-",
            f"{w.host}:{w.pid}",
            ",".join(w.queues) or "?",
            "?" if w.concurrency is None else str(w.concurrency),
            w.version or "?",
            str(w.partition_count),
            _duration(now, w.started_at),
            ", ".join(w.step_types) or "? (a worker from before this version)",
        )
        for w in workers
    ]
    print_table(header, rows)
    return EXIT_OK


def warn_unserved(settings: Settings, definitions: Sequence[WorkflowDef]) -> None:
    """On stderr, a line for each step type of ``definitions`` that no live worker serves on
    its queue (the exit code stays). Nothing is said when the registry cannot be read: the
    command itself did what it was asked."""
    try:
        with connect(settings) as conn:
            _warn(conn, settings, definitions)
    except (ClientError, psycopg.Error):
        return


def warn_unserved_workflow(settings: Settings, name: str) -> None:
    """``warn_unserved`` for the latest version of workflow ``name`` (what `start` runs)."""
    try:
        with connect(settings) as conn:
            _warn(conn, settings, [Definitions().latest(conn, name)])
    except (ClientError, psycopg.Error, UnknownWorkflow):
        return


def _warn(
    conn: psycopg.Connection[Any], settings: Settings, definitions: Sequence[WorkflowDef]
) -> None:
    workers = live_workers(conn, settings.worker_group_id, settings.instance_timeout_s)
    for line in unserved_lines(definitions, workers):
        print(line, file=sys.stderr)


def unserved_lines(definitions: Sequence[WorkflowDef], workers: Sequence[LiveWorker]) -> list[str]:
    """The warnings for ``definitions`` given the live ``workers``."""
    lines = []
    silent = sum(1 for w in workers if not w.queues)
    queues = {q for w in workers for q in w.queues}
    for wf in definitions:
        for queue, step_type in unserved(wf, workers):
            fate = (
                "its attempts fail on the queue's workers until one with it runs"
                if queue in queues
                else "its tasks wait until a worker of the queue runs"
            )
            older = (
                f"; {silent} live worker(s) of an older version do not say what they serve"
                if silent
                else ""
            )
            lines.append(
                f"warning: workflow {wf.name} v{wf.version}: no live worker has step type"
                f" {step_type!r} on queue {queue!r}: {fate} (`ductor workers` lists what the"
                f" live workers serve{older})"
            )
    return lines


def _now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def _duration(now: datetime, since: datetime) -> str:
    seconds = max(0, int((now - since).total_seconds()))
    if seconds < 120:
        return f"{seconds}s"
    if seconds < 7200:
        return f"{seconds // 60}m"
    if seconds < 172800:
        return f"{seconds // 3600}h"
    return f"{seconds // 86400}d"
