"""`ductor gc`: delete finished runs older than a duration (processor/io/postgres/retention.py), and
the cancels kept as long for runs that never started (processor/io/postgres/kept_signals.py)."""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError
from processor.cli.grammar import emit
from processor.client import connect
from processor.io.config.settings import Settings
from processor.io.postgres.kept_signals import count_old_kept_cancels, delete_old_kept_cancels
from processor.io.postgres.retention import Removed, count_finished, cutoff, delete_finished

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"(\d{1,9})([smhd])")
_PROGRESS_EVERY_S = 5.0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "gc",
        help="delete finished runs (succeeded, failed, cancelled) last moved before a time,"
        " with their step results, signals and outbox rows, in batches",
    )
    p.add_argument(
        "--finished-before",
        required=True,
        metavar="DURATION",
        help="how long ago: 90s, 30m, 12h or 7d (runs whose last transition is older go)",
    )
    p.add_argument(
        "--batch-size", type=int, default=1000, help="runs per statement and transaction (1000)"
    )
    p.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    p.set_defaults(func=cmd_gc)


def parse_duration(text: str) -> int:
    """Seconds in a duration such as ``90s``, ``30m``, ``12h`` or ``7d`` (more than zero)."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or int(match[1]) == 0:
        raise ValueError(f"{text!r} is not a duration such as 90s, 30m, 12h or 7d")
    return int(match[1]) * _UNITS[match[2]]


def _describe(removed: Removed, kept_cancels: int) -> str:
    return (
        f"{removed.runs} run(s), {removed.results} step result(s), {removed.signals} signal(s),"
        f" {removed.outbox} outbox row(s), {kept_cancels} kept cancel(s)"
    )


def _counts(removed: Removed, kept_cancels: int) -> dict[str, int]:
    return {
        "runs": removed.runs,
        "results": removed.results,
        "signals": removed.signals,
        "outbox": removed.outbox,
        "kept_cancels": kept_cancels,
    }


def cmd_gc(settings: Settings, args: argparse.Namespace) -> int:
    try:
        older_than_s = parse_duration(args.finished_before)
    except ValueError as exc:
        raise CliError(f"--finished-before: {exc}", EXIT_USAGE) from None
    if not 1 <= args.batch_size <= 100_000:
        raise CliError("--batch-size must be between 1 and 100000", EXIT_USAGE)
    with connect(settings) as conn:
        before = cutoff(conn, older_than_s)
        when = f"finished before {before.isoformat(timespec='seconds')}"
        if args.dry_run:
            counted, kept = count_finished(conn, before), count_old_kept_cancels(conn, before)
            document = {**_counts(counted, kept), "before": before.isoformat(), "dry_run": True}
            emit(args, document, f"would delete {_describe(counted, kept)} ({when}; dry run)")
            return EXIT_OK
        next_note = time.monotonic() + _PROGRESS_EVERY_S

        def progress(total: Removed) -> None:
            nonlocal next_note
            if time.monotonic() >= next_note:
                next_note = time.monotonic() + _PROGRESS_EVERY_S
                print(f"deleted {total.runs} run(s) so far", file=sys.stderr, flush=True)

        total, batches = delete_finished(conn, before, args.batch_size, progress)
        cancels = delete_old_kept_cancels(conn, before)
    document = {**_counts(total, cancels), "before": before.isoformat(), "dry_run": False}
    emit(args, document, f"deleted {_describe(total, cancels)} ({when}; {batches} batch(es))")
    return EXIT_OK
