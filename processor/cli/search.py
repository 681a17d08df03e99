"""Finding runs and acting on many: `ductor runs list`, `runs count`, `runs cancel`, `runs retry`
and `runs upgrade` with the filters of core/run_search.RunFilter (every filter is index-backed:
io/postgres/run_search.py)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Mapping
from typing import Any

from processor.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, CliError, print_table
from processor.cli.grammar import emit, print_json, print_json_lines
from processor.cli.run_text import tags_shown
from processor.client import (
    MAX_BULK_RUNS,
    MAX_LIST_LIMIT,
    BulkAction,
    Cursor,
    RunFilter,
    RunSummary,
    cancel_runs,
    count_runs,
    parse_filter,
    retry_run,
    retry_runs,
    search_runs,
    send_signal,
    summary_document,
    upgrade_run,
    upgrade_runs,
)
from processor.core.run_state import RunStatus
from processor.io.config.settings import Settings

# How many matched run ids a bulk action prints before "... and N more".
_SHOWN = 20


def add_filter_arguments(p: argparse.ArgumentParser) -> None:
    """The filters every search command takes (each narrows the set; all of them together)."""
    p.add_argument("--workflow", help="only runs of this workflow (any version)")
    p.add_argument(
        "--status",
        action="append",
        choices=[s.value for s in RunStatus],
        help="only runs in this status (repeat for several)",
    )
    p.add_argument(
        "--since",
        metavar="TIME",
        help="only runs created at or after TIME: ISO 8601 with its offset, or a duration ago"
        " (90s, 15m, 2h, 7d)",
    )
    p.add_argument("--until", metavar="TIME", help="only runs created before TIME (as --since)")
    p.add_argument("--id-prefix", metavar="PREFIX", help="only runs whose id starts so")
    p.add_argument(
        "--tag",
        action="append",
        metavar="KEY=VALUE",
        help="only runs with this tag, given at their start or set by a step (repeat: all of them)",
    )
    p.add_argument(
        "--step-failed",
        metavar="STEP",
        help="only runs in which an attempt of STEP failed (a map step's items too)",
    )


def filter_from_args(args: argparse.Namespace) -> RunFilter:
    """The RunFilter the arguments describe; exit 2 saying what is wrong."""
    try:
        return parse_filter(
            now_ms=int(time.time() * 1000),
            workflow=args.workflow,
            statuses=args.status or (),
            since=args.since,
            until=args.until,
            id_prefix=args.id_prefix,
            tags=args.tag or (),
            step_failed=args.step_failed,
            names={"since": "--since", "until": "--until"},
        )
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def cmd_runs_list(settings: Settings, args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= MAX_LIST_LIMIT:
        raise CliError(f"--limit must be between 1 and {MAX_LIST_LIMIT}", EXIT_USAGE)
    wanted = filter_from_args(args)
    try:
        after = None if args.cursor is None else Cursor.decode(args.cursor)
    except ValueError as exc:
        raise CliError(f"--cursor: {exc}", EXIT_USAGE) from None
    page = search_runs(settings, wanted, args.limit, after)
    following = None if page.next_cursor is None else page.next_cursor.encode()
    if args.output == "json":
        print_json_lines([summary_document(run) for run in page.runs])
    else:
        _print_table(page.runs)
    more = "" if following is None else f"; more with --cursor {following}"
    print(f"{len(page.runs)} run(s), newest first{more}", file=sys.stderr)
    return EXIT_OK


def _print_table(runs: list[RunSummary]) -> None:
    rows = [
        (
            run.run_id,
            f"{run.workflow[0]} v{run.workflow[1]}",
            run.status.value + (" (quarantined)" if run.quarantine_reason else ""),
            run.last_transition_at.isoformat(timespec="seconds"),
            tags_cell(run.tags),
            run.failure_reason or "",
        )
        for run in runs
    ]
    header = ("RUN", "WORKFLOW", "STATUS", "LAST TRANSITION", "TAGS", "FAILURE REASON")
    print_table(header, rows)


# A run's tags in its row, cut past this many characters (`-o json` has them whole).
_TAGS_CELL_CHARS = 48


def tags_cell(tags: Mapping[str, str]) -> str:
    """A run's tags as a table cell: ``key=value`` by key, comma-separated, every control
    character (a line break too: the row stays one line) as an escape; ``-`` for none (so
    the column is never blank), cut with ``...`` past ``_TAGS_CELL_CHARS``."""
    cell = tags_shown(tags, ",", keep="")
    if len(cell) > _TAGS_CELL_CHARS:
        return cell[: _TAGS_CELL_CHARS - 3] + "..."
    return cell


def cmd_runs_count(settings: Settings, args: argparse.Namespace) -> int:
    count = count_runs(settings, filter_from_args(args))
    emit(args, {"count": count}, str(count))
    return EXIT_OK


def cmd_runs_cancel(settings: Settings, args: argparse.Namespace) -> int:
    """Cancel one run (RUN_ID) or every live run the filters match (--dry-run: show them)."""
    if args.run_id is not None:
        _single(args)
        sent = send_signal(settings, args.run_id)
        document = {"run_id": args.run_id, "signal_id": sent.signal_id, "new": sent.new}
        emit(args, document, f"run {args.run_id} cancel sent ({sent.signal_id})")
        return EXIT_OK
    done = cancel_runs(settings, _bulk_filter(args), args.dry_run, args.max)
    return _report(args, done, "cancel", "pending or running")


def cmd_runs_retry(settings: Settings, args: argparse.Namespace) -> int:
    """Resume one failed run (RUN_ID) or every failed run the filters match."""
    if args.run_id is not None:
        _single(args)
        retried = retry_run(settings, args.run_id)
        document = {"run_id": retried.run_id, "steps": list(retried.steps)}
        text = f"run {retried.run_id} resumed; running again: {', '.join(retried.steps)}"
        emit(args, document, text)
        return EXIT_OK
    done = retry_runs(settings, _bulk_filter(args), args.dry_run, args.max)
    return _report(args, done, "retry", "failed")


def cmd_runs_upgrade(settings: Settings, args: argparse.Namespace) -> int:
    """Move one run's (RUN_ID) or every matching run's pinned step versions."""
    if args.latest == (args.to_version is not None):
        raise CliError("give --to-version N (with --step TYPE) or --latest", EXIT_USAGE)
    if args.to_version is not None and args.step is None:
        raise CliError(
            "--to-version needs --step TYPE: the step type it is a version of", EXIT_USAGE
        )
    if args.run_id is None:
        done = upgrade_runs(
            settings, _bulk_filter(args), args.step, args.to_version, args.dry_run, args.max
        )
        return _report(args, done, "upgrade", "running or failed")
    given = [
        f for f in ("workflow", "status", "since", "until", "id_prefix", "tag") if getattr(args, f)
    ]
    if given or args.step_failed:
        raise CliError("give a RUN_ID or filters, not both", EXIT_USAGE)
    moved = upgrade_run(settings, args.run_id, args.step, args.to_version, args.dry_run)
    moves = [{"step": m.step, "type": m.step_type, "from": m.old, "to": m.new} for m in moved.moves]
    document = {"run_id": moved.run_id, "moves": moves, "dry_run": args.dry_run}
    lines = [f"  {m.step} ({m.step_type}): version {m.old} -> {m.new}" for m in moved.moves]
    head = f"run {moved.run_id}: " + (
        "nothing to move" if not moves else "would move" if args.dry_run else "moved"
    )
    emit(args, document, "\n".join([head, *lines]))
    return EXIT_OK


def _bulk_filter(args: argparse.Namespace) -> RunFilter:
    wanted = filter_from_args(args)
    if wanted.empty:
        raise CliError(
            f"runs {args.runs_command} needs a RUN_ID or a filter (--workflow, --status,"
            " --since, --until, --id-prefix, --tag, --step-failed): none would mean every run",
            EXIT_USAGE,
        )
    return wanted


def _single(args: argparse.Namespace) -> None:
    given = [
        f for f in ("workflow", "status", "since", "until", "id_prefix", "tag") if getattr(args, f)
    ]
    if given or args.step_failed or args.dry_run:
        raise CliError("give a RUN_ID or filters (with --dry-run), not both", EXIT_USAGE)


def _report(args: argparse.Namespace, done: BulkAction, verb: str, which: str) -> int:
    """The matched runs on stdout (JSON: one object with every list), the count on stderr;
    exit 1 when one was refused."""
    if args.output == "json":
        print_json(
            {
                "matched": list(done.matched),
                "acted": list(done.acted),
                "refused": [{"run_id": r, "why": why} for r, why in done.refused],
                "dry_run": args.dry_run,
            }
        )
    else:
        _print_matched(done.matched)
    if args.dry_run:
        print(f"{len(done.matched)} {which} run(s) match; --dry-run: nothing done", file=sys.stderr)
        return EXIT_OK
    for run_id, why in done.refused:
        print(f"refused {run_id}: {why}", file=sys.stderr)
    print(
        f"{verb}: {len(done.acted)} of {len(done.matched)} matching {which} run(s)"
        + (f", {len(done.refused)} refused" if done.refused else ""),
        file=sys.stderr,
    )
    return EXIT_FAILED if done.refused else EXIT_OK


def _print_matched(matched: tuple[str, ...]) -> None:
    shown = matched[:_SHOWN]
    for run_id in shown:
        print(run_id)
    if len(matched) > len(shown):
        print(f"... and {len(matched) - len(shown)} more")


def add_search_commands(runs_sub: Any) -> None:
    """`runs list`, `runs count`, `runs cancel`, `runs retry` under `ductor runs`."""
    p = runs_sub.add_parser(
        "list",
        help="list runs, newest first: run id, workflow, status, last transition, failure reason",
    )
    add_filter_arguments(p)
    p.add_argument("--limit", type=int, default=50, help="at most N runs (50)")
    p.add_argument("--cursor", help="the page after the one that printed this cursor")
    p.set_defaults(func=cmd_runs_list)
    p = runs_sub.add_parser("count", help="how many runs the filters match")
    add_filter_arguments(p)
    p.set_defaults(func=cmd_runs_count)
    for name, func, what in (
        ("cancel", cmd_runs_cancel, "cancel a run, or every pending or running run the filters"),
        (
            "retry",
            cmd_runs_retry,
            "resume a failed run from its failed steps (succeeded steps are kept), or every"
            " failed run the filters",
        ),
    ):
        p = runs_sub.add_parser(name, help=f"{what} match")
        _add_bulk_arguments(p, "show what matches; do nothing")
        p.set_defaults(func=func)
    p = runs_sub.add_parser(
        "upgrade",
        help="move a running or failed run's steps to another version of their function (from"
        " their next attempt), or every such run the filters match",
    )
    p.add_argument("--step", metavar="TYPE", help="only the steps of this step type")
    p.add_argument("--to-version", type=int, metavar="N", help="to version N (needs --step)")
    p.add_argument(
        "--latest",
        action="store_true",
        help="to the newest version the live workers of each step's queue serve",
    )
    _add_bulk_arguments(p, "show what would move; do nothing")
    p.set_defaults(func=cmd_runs_upgrade)


def _add_bulk_arguments(p: Any, dry_run: str) -> None:
    """What every command acting on one run or on the runs the filters match takes."""
    p.add_argument("run_id", nargs="?", metavar="RUN_ID", help="one run (else: filters)")
    add_filter_arguments(p)
    p.add_argument("--dry-run", action="store_true", help=dry_run)
    p.add_argument(
        "--max",
        type=int,
        default=MAX_BULK_RUNS,
        help=f"refuse when more runs match ({MAX_BULK_RUNS})",
    )
