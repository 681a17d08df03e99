"""`ductor start`: start runs of a registered workflow, now, at a time or after a delay,
through the database or the requests topic; with ``--wait [S]``, wait for the run's end and
print its result as `ductor result` does (exit code by its outcome)."""

from __future__ import annotations

import argparse
import math
import sys
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from processor.authoring import duration_ms
from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError, json_argument
from processor.cli.grammar import print_json
from processor.cli.runs import print_result, via_argument, waited_result
from processor.cli.workers import warn_unserved_workflow
from processor.client import IfExists, RunExists, StartNotAnnounced, request_starts, start_runs
from processor.core.deadlines import timeout_problem
from processor.core.routing import TIERS, TopicNames
from processor.core.run_search import parse_tags
from processor.core.workflow_def import ValidationError
from processor.io.config.settings import Settings


def register(sub: Any) -> None:
    p = sub.add_parser("start", help="start runs of a registered workflow")
    p.add_argument("workflow", help="workflow name (its latest version is used)")
    p.add_argument(
        "--input",
        metavar="JSON|@FILE|-",
        help="run input as JSON, or @FILE to read it from a file, or - from stdin",
    )
    p.add_argument("--run-id", help="run id (idempotent: the same id starts once)")
    p.add_argument(
        "--tag",
        action="append",
        metavar="KEY=VALUE",
        help="a tag to find the runs by (`runs list --tag`); repeat for several",
    )
    p.add_argument("--count", type=int, default=1, help="how many runs to start")
    p.add_argument(
        "--tier", choices=TIERS, default="t1", help="wakeup tier (t0 interactive, t2 bulk)"
    )
    p.add_argument(
        "--if-exists",
        choices=[i.value for i in IfExists],
        help="a run id that exists already: ignore (keep that run, whatever its input) or fail"
        " (exit 1); default: an identical start is ignored, one with another input fails."
        " A run id of another workflow always fails",
    )
    later = p.add_mutually_exclusive_group()
    later.add_argument(
        "--at",
        metavar="TIME",
        help="start the runs then, not before: ISO 8601 with its offset (2026-12-24T18:00:00Z)",
    )
    later.add_argument(
        "--delay", metavar="DURATION", help="start the runs this long from now (90s, 10m, 2h)"
    )
    p.add_argument(
        "--timeout",
        metavar="MS",
        help="how long each run may take from its start, in ms (or 30s, 10m, 2h): past it the"
        " run fails, its steps and child runs cancelled (default: the workflow's timeout_ms)",
    )
    p.add_argument(
        "--wait",
        nargs="?",
        type=float,
        const=math.inf,
        metavar="S",
        help="wait for the run to end (at most S seconds; no S: however long it takes) and"
        " print its result as `ductor result` does: exit 0 succeeded, 1 failed or cancelled,"
        " 3 not finished within S",
    )
    via_argument(p)
    p.set_defaults(func=cmd_start)


def cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    run_input = json_argument("--input", args.input, {})
    if args.count < 1:
        raise CliError("--count must be at least 1", EXIT_USAGE)
    _check_wait(args)
    try:
        tags = parse_tags(args.tag)
    except ValueError as exc:
        raise CliError(f"--tag: {exc}", EXIT_USAGE) from None
    if args.run_id:
        ids = (
            [args.run_id] if args.count == 1 else [f"{args.run_id}-{i}" for i in range(args.count)]
        )
    else:
        ids = [f"{args.workflow}-{uuid.uuid4().hex[:12]}" for _ in range(args.count)]
    start_at = _start_at(args)
    timeout_ms = _timeout_ms(args)
    if args.via == "kafka":
        if start_at is not None or tags or timeout_ms is not None:
            raise CliError("--at, --delay, --tag and --timeout need --via database", EXIT_USAGE)
        return _request_starts(settings, args, ids, run_input)
    try:
        inserted = start_runs(
            settings,
            args.workflow,
            ids,
            run_input,
            args.tier,
            if_exists=args.if_exists,
            start_at=start_at,
            tags=tags or None,
            timeout_ms=timeout_ms,
        )
    except StartNotAnnounced as exc:
        # The runs exist and will start: what the command promises holds, later than usual.
        print(f"warning: {exc}", file=sys.stderr)
        inserted = exc.inserted
    except RunExists as exc:
        raise CliError(_start_refused(exc, args, len(ids))) from None
    warn_unserved_workflow(settings, args.workflow)
    if args.wait is not None:
        print(f"run {ids[0]} started; waiting for its end", file=sys.stderr)
        return print_result(args, waited_result(settings, args, ids[0], args.wait))
    _print_started(args, ids, inserted)
    return EXIT_OK


def _check_wait(args: argparse.Namespace) -> None:
    if args.wait is None:
        return
    if args.wait < 0:
        raise CliError("--wait must be 0 or more seconds", EXIT_USAGE)
    if args.count != 1 or args.via == "kafka":
        raise CliError(
            "--wait waits for one run started through the database: not with --count or"
            " --via kafka (`ductor result RUN_ID --wait S` waits for any run)",
            EXIT_USAGE,
        )


def _print_started(args: argparse.Namespace, ids: list[str], inserted: list[str]) -> None:
    if args.output == "json":
        new = set(inserted)
        for run_id in ids:
            print_json({"run_id": run_id, "created": run_id in new})
    elif args.count == 1:
        print(ids[0] if inserted else f"{ids[0]} (already started)")
    else:
        print(f"started {len(inserted)} run(s), {len(ids) - len(inserted)} already existed")


def _start_at(args: argparse.Namespace) -> datetime | None:
    """When ``--at`` or ``--delay`` says the runs start (exit 2 if it cannot be read)."""
    if args.at:
        try:
            at = datetime.fromisoformat(args.at)
        except ValueError:
            at = None
        if at is None or at.tzinfo is None:
            raise CliError(
                f"--at {args.at!r}: expected an ISO 8601 time with its offset, e.g."
                " 2026-12-24T18:00:00Z or 2026-12-24T19:00:00+01:00",
                EXIT_USAGE,
            )
        return at
    if args.delay:
        try:
            delay_ms = duration_ms(args.delay, "--delay")
        except ValidationError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        return datetime.now(UTC) + timedelta(milliseconds=delay_ms)
    return None


def _timeout_ms(args: argparse.Namespace) -> int | None:
    """The runs' own timeout ``--timeout`` gives (exit 2 if it is no duration in range)."""
    if args.timeout is None:
        return None
    text = args.timeout.strip()
    try:
        ms = int(text) if text.isdigit() else duration_ms(text, "--timeout")
    except ValidationError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    problem = timeout_problem(ms, "--timeout")
    if problem is not None:
        raise CliError(problem, EXIT_USAGE)
    return ms


def _request_starts(
    settings: Settings, args: argparse.Namespace, ids: list[str], run_input: object
) -> int:
    """`ductor start --via kafka`: the starts go to the requests topic; a processor creates
    the runs (what it cannot start is a dead letter, since nothing here hears back)."""
    if args.if_exists:
        raise CliError(
            "--if-exists needs --via database: through Kafka, a start for a run id that exists"
            " with another input is a conflicting_start dead letter",
            EXIT_USAGE,
        )
    request_starts(settings, args.workflow, ids, run_input, args.tier)
    topic = TopicNames(settings.topic_prefix).requests
    if args.output == "json":
        for run_id in ids:
            print_json({"run_id": run_id, "requested_on": topic})
    elif args.count == 1:
        print(f"{ids[0]} (start requested on {topic})")
    else:
        print(f"requested the start of {len(ids)} run(s) on {topic}")
    return EXIT_OK


def _start_refused(exc: RunExists, args: argparse.Namespace, count: int) -> str:
    """Why `ductor start` refused, with the flag that changes it (the client's message names
    the client's parameter)."""
    run = exc.existing[0]
    more = f" (and {len(exc.existing) - 1} more)" if len(exc.existing) > 1 else ""
    started = f"; {len(exc.inserted)} of the {count} run(s) were started" if count > 1 else ""
    if run.workflow[0] != args.workflow:
        why = (
            f"run {run.run_id!r}{more} exists already, of workflow {run.workflow[0]!r}: a run"
            f" id belongs to one workflow; start {args.workflow!r} under another --run-id"
        )
    elif args.if_exists == IfExists.FAIL:
        why = f"run {run.run_id!r}{more} exists already (--if-exists fail)"
    else:
        why = (
            f"run {run.run_id!r}{more} exists already with another input; --if-exists ignore"
            " keeps the existing run, or start this one under another --run-id"
        )
    return why + started
