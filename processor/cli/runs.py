"""Commands about runs: start, inspect, signal, result, runs list, runs retry, runs release."""

from __future__ import annotations

import argparse
import sys
import uuid
from datetime import UTC, datetime, timedelta

import orjson

from processor.authoring import duration_ms
from processor.cli.common import (
    EXIT_FAILED,
    EXIT_NOT_FINISHED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    json_argument,
)
from processor.cli.workers import warn_unserved_workflow
from processor.client import (
    IfExists,
    RunExists,
    RunNotFinished,
    RunNotFound,
    RunResult,
    StartNotAnnounced,
    connect,
    get_run,
    release_run,
    request_signal,
    request_starts,
    send_signal,
    start_runs,
    wait_for_run,
)
from processor.core.children import child_run_id
from processor.core.model import RunStatus, state_checksum
from processor.core.routing import TopicNames
from processor.core.run_search import parse_tags
from processor.core.workflow import SIGNAL_NAME, ValidationError
from processor.io.config.settings import Settings
from processor.io.postgres.run_document import RunRecord, inspect_document, read_run
from processor.io.postgres.store import Definitions


def cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    run_input = json_argument("--input", args.input or None, {})
    if args.count < 1:
        raise CliError("--count must be at least 1", EXIT_USAGE)
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
    if args.via == "kafka":
        if start_at is not None or tags:
            raise CliError("--at, --delay and --tag need --via database", EXIT_USAGE)
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
        )
    except StartNotAnnounced as exc:
        # The runs exist and will start: what the command promises holds, later than usual.
        print(f"warning: {exc}", file=sys.stderr)
        inserted = exc.inserted
    except RunExists as exc:
        raise CliError(_start_refused(exc, args, len(ids))) from None
    if args.count == 1:
        print(ids[0] if inserted else f"{ids[0]} (already started)")
    else:
        print(f"started {len(inserted)} run(s), {len(ids) - len(inserted)} already existed")
    warn_unserved_workflow(settings, args.workflow)
    return EXIT_OK


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
    if args.count == 1:
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


def cmd_inspect(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        record = read_run(conn, Definitions(), args.run_id, settings.instance_timeout_s)
    if record is None:
        raise CliError(f"no run with id {args.run_id!r}")
    if args.output == "json":
        document = inspect_document(record)
        sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")
        return EXIT_OK if record.healthy else EXIT_FAILED
    columns, run, result = record.columns, record.run, record.result
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
    if run.parent is not None:
        parent = run.parent
        print(f"parent     {parent.run_id} (step {parent.node}, attempt {parent.attempt})")
    check = "ok" if run.checksum_ok else f"MISMATCH (row says {run.stored_checksum})"
    print(f"checksum   {state_checksum(run.state)} {check}")
    if columns.start_at is not None:
        print(f"starts at  {columns.start_at}")
    print(f"next wake  {columns.next_wakeup_at or '-'}")
    print(f"output     {output_text(result)}")
    print("nodes:")
    for name, node in record.nodes:
        extra = f"  (retried after attempt {node.attempts_before})" if node.attempts_before else ""
        extra += f"  error: {node.error}" if node.error else ""
        if run.wf.step_for(name).starts_child and node.attempt:
            extra += f"  child: {child_run_id(args.run_id, name, node.attempt)}"
        print(f"  {name:20} {node.status.value:11} attempt {node.attempt}{extra}")
    _print_executions(record)
    return EXIT_OK if record.healthy else EXIT_FAILED


def _print_executions(record: RunRecord) -> None:
    """What the workers report of the executions: each attempt's last heartbeat (and the
    details the step gave), and the executions that outlived their attempts, keeping their
    concurrency slots (a step in a thread cannot be stopped: core/limits.py, rule 4)."""
    lines = []
    for (node, attempt), execution in sorted(record.executions.items()):
        if execution.beat_at is not None or execution.details is not None:
            at = "-" if execution.beat_at is None else execution.beat_at.isoformat()
            details = "" if execution.details is None else f": {_short(execution.details)}"
            lines.append(f"  {node} #{attempt}  last heartbeat {at}{details}")
        if execution.lingering:
            lines.append(
                f"  {node} #{attempt}  still running after its attempt ended (its worker cannot"
                f" stop a step in a thread): keeps its slot of {', '.join(execution.lingering)}"
                " until it ends or its worker is gone"
            )
    if lines:
        print("executions:")
        for line in lines:
            print(line)


def _short(value: object) -> str:
    """A heartbeat's details as `ductor inspect` shows them: compact JSON, cut short."""
    text = orjson.dumps(value).decode()
    return text if len(text) <= INSPECT_OUTPUT_CHARS else text[:INSPECT_OUTPUT_CHARS] + " ..."


# Enough of a run's output to recognise it; `ductor result` prints it whole.
INSPECT_OUTPUT_CHARS = 400


def output_text(result: RunResult) -> str:
    """A run's output as `ductor inspect` shows it: compact JSON, cut after
    INSPECT_OUTPUT_CHARS characters; "-" until the run succeeded."""
    if result.status is not RunStatus.SUCCEEDED:
        return "-"
    text = orjson.dumps(result.output).decode()
    if len(text) <= INSPECT_OUTPUT_CHARS:
        return text
    return (
        f"{text[:INSPECT_OUTPUT_CHARS]} ... ({len(text)} characters;"
        f" `ductor result {result.run_id}` prints it whole)"
    )


def cmd_signal(settings: Settings, args: argparse.Namespace) -> int:
    payload = json_argument("--payload", args.payload, None)
    if not SIGNAL_NAME.fullmatch(args.kind):
        raise CliError(
            f"signal name {args.kind!r}: cancel, or 1 to 100 letters, digits, '_', '.', ':'"
            " or '-', starting with a letter or digit",
            EXIT_USAGE,
        )
    if args.via == "kafka":
        signal_id = request_signal(settings, args.run_id, args.kind, args.signal_id, payload)
        topic = TopicNames(settings.topic_prefix).requests
        print(f"signal {args.kind} requested on {topic} ({signal_id})")
        return EXIT_OK
    sent = send_signal(settings, args.run_id, args.kind, args.signal_id, payload)
    print(f"signal {args.kind} {'sent' if sent.new else 'was already recorded'} ({sent.signal_id})")
    return EXIT_OK


def cmd_result(settings: Settings, args: argparse.Namespace) -> int:
    """Print a run's output as JSON once it succeeded; see the exit codes in ``main``."""
    if args.wait is not None and args.wait < 0:
        raise CliError("--wait must be 0 or more seconds", EXIT_USAGE)
    try:
        if args.wait is None:
            result = get_run(settings, args.run_id)
        else:
            result = wait_for_run(settings, args.run_id, args.wait)
    except RunNotFound as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    except RunNotFinished as exc:
        raise CliError(f"{exc}; not finished", EXIT_NOT_FINISHED) from None
    if not result.finished:
        raise CliError(
            f"run {args.run_id!r} is still {result.status}; not finished (--wait SECONDS waits)",
            EXIT_NOT_FINISHED,
        )
    return _print_result(result)


def _print_result(result: RunResult) -> int:
    if result.status is RunStatus.SUCCEEDED:
        print(orjson.dumps(result.output).decode())
        return EXIT_OK
    print(f"run {result.run_id} {result.status}: {result.failure_reason or '-'}", file=sys.stderr)
    return EXIT_FAILED


def cmd_runs_release(settings: Settings, args: argparse.Namespace) -> int:
    """Clear a run's quarantine flag and wake it (client.release_run)."""
    release_run(settings, args.run_id)
    print(f"run {args.run_id} released and woken")
    return EXIT_OK
