"""Commands about the outbox rows the broker refused for good: outbox parked, outbox unpark."""

from __future__ import annotations

import argparse
import sys

import psycopg

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError
from processor.io.config.settings import Settings
from processor.io.postgres.connections import connect
from processor.io.postgres.outbox import parked_outbox, unpark_outbox
from processor.io.telemetry.logs import first_line


def cmd_outbox_parked(settings: Settings, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise CliError("--limit must be at least 1", EXIT_USAGE)
    try:
        with connect(settings.pg_dsn) as conn:
            rows = parked_outbox(conn, args.limit)
    except psycopg.Error as exc:
        raise CliError(f"cannot read the outbox: {first_line(exc)}") from None
    for row in rows:
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
    print(f"unparked {count} outbox row(s): the next sweep relays them")
    return EXIT_OK
