"""Commands about the outbox rows the broker refused for good: outbox parked, outbox unpark."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import psycopg

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError
from processor.cli.grammar import emit, print_json_lines
from processor.io.config.settings import Settings
from processor.io.postgres.connections import connect
from processor.io.postgres.outbox import parked_outbox, unpark_outbox
from processor.io.telemetry.logs import first_line


def register(sub: Any) -> None:
    outbox = sub.add_parser(
        "outbox", help="the outbox rows parked because the broker refuses their records"
    )
    outbox_sub = outbox.add_subparsers(dest="outbox_command", required=True, metavar="ACTION")
    p = outbox_sub.add_parser(
        "parked",
        help="list the parked outbox rows, oldest first: run, transition, when, topics, why",
    )
    p.add_argument("--limit", type=int, default=100, help="at most this many (default: 100)")
    p.set_defaults(func=cmd_outbox_parked)
    p = outbox_sub.add_parser(
        "unpark",
        help="hand parked rows back to the relay (the next sweep sends them) once the cause"
        " is fixed",
    )
    p.add_argument("run_id", nargs="?", help="the run whose rows to unpark")
    p.add_argument("seq", nargs="?", type=int, help="only its row of this transition")
    p.add_argument("--all", action="store_true", help="every parked row")
    p.set_defaults(func=cmd_outbox_unpark)


def cmd_outbox_parked(settings: Settings, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError("--limit must be at least 1", EXIT_USAGE)
    try:
        with connect(settings.pg_dsn) as conn:
            rows = parked_outbox(conn, args.limit)
    except psycopg.Error as exc:
        raise CliError(f"cannot read the outbox: {first_line(exc)}") from None
    if args.output == "json":
        print_json_lines(
            [{**row._asdict(), "parked_at": row.parked_at.isoformat()} for row in rows]
        )
    for row in rows if args.output == "text" else ():
        print(row.describe())
    print(f"{len(rows)} parked outbox row(s)", file=sys.stderr)
    return EXIT_OK


def cmd_outbox_unpark(settings: Settings, args: argparse.Namespace) -> int:
    if not args.all and args.run_id is None:
        raise CliError("name a run (RUN_ID [SEQ]) or give --all", EXIT_USAGE)
    if args.all and args.run_id is not None:
        raise CliError("give a run or --all, not both", EXIT_USAGE)
    try:
        with connect(settings.pg_dsn) as conn:
            count = unpark_outbox(conn, args.run_id, args.seq)
    except psycopg.Error as exc:
        raise CliError(f"cannot write the outbox: {first_line(exc)}") from None
    emit(args, {"unparked": count}, f"unparked {count} outbox row(s): the next sweep relays them")
    return EXIT_OK
