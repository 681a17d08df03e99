"""Commands about runs: inspect, signal, result, runs release (`start` is start.py; `runs list`,
`count`, `cancel` and `retry` search.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

import orjson

from processor.cli.common import (
    EXIT_FAILED,
    EXIT_NOT_FINISHED,
    EXIT_OK,
    EXIT_USAGE,
    CliError,
    json_argument,
)
from processor.cli.grammar import emit, print_json
from processor.cli.run_text import (
    input_line,
    output_lines,
    print_attempts_and_signals,
    printable,
    tags_line,
)
from processor.cli.search import add_search_commands
from processor.client import (
    RunNotFinished,
    RunNotFound,
    RunResult,
    connect,
    get_run,
    release_run,
    request_signal,
    result_document,
    send_signal,
    wait_for_run,
)
from processor.core.children import child_run_id
from processor.core.model import LoadedRun
from processor.core.routing import TopicNames
from processor.core.run_state import NodeState, NodeStatus, RunStatus, state_checksum
from processor.core.sagas import compensation_of
from processor.core.skips import why_skipped
from processor.core.versions import step_versions
from processor.core.workflow_def import SIGNAL_NAME
from processor.io.config.settings import Settings
from processor.io.postgres.run_document import RunRecord, inspect_document, read_run
from processor.io.postgres.runs_admin import RunColumns
from processor.io.postgres.store import Definitions


def register(sub: Any) -> None:
    """`ductor inspect`, `result`, `signal` and `runs ...` (search.py adds its own there)."""
    p = sub.add_parser("inspect", help="show a run: status, nodes, version, seq, checksum check")
    p.add_argument("run_id")
    p.set_defaults(func=cmd_inspect)
    p = sub.add_parser(
        "result",
        help="print a run's output as JSON (exit 0 succeeded, 1 failed, cancelled or unknown"
        " run, 3 not finished)",
    )
    p.add_argument("run_id")
    p.add_argument(
        "--wait", type=float, metavar="SECONDS", help="wait this long for the run to end"
    )
    p.set_defaults(func=cmd_result)
    runs = sub.add_parser("runs", help="act on runs")
    runs_sub = runs.add_subparsers(dest="runs_command", required=True, metavar="ACTION")
    p = runs_sub.add_parser(
        "release",
        help="clear a quarantined run's flag (once its row is repaired) and wake it",
    )
    p.add_argument("run_id")
    p.set_defaults(func=cmd_runs_release)
    add_search_commands(runs_sub)
    p = sub.add_parser(
        "signal", help="send a signal to a run: cancel, or one a wait step waits for"
    )
    p.add_argument("run_id")
    p.add_argument("kind", metavar="NAME", help="cancel, or the signal's name")
    p.add_argument(
        "--payload",
        metavar="JSON|@FILE|-",
        help="the signal's data (a wait step's output): JSON, @FILE to read it from a file,"
        " or - from stdin",
    )
    p.add_argument("--signal-id", help="idempotency key (default: a new one)")
    via_argument(p)
    p.set_defaults(func=cmd_signal)


def via_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--via",
        choices=("database", "kafka"),
        default="database",
        help="database (default): write the run or signal row, then wake the run; kafka: write"
        " a request to the requests topic and let a processor do it (no Postgres access"
        " needed, docs/requests.md)",
    )


def _node_line(run: LoadedRun, name: str, node: NodeState) -> str:
    """A node as `ductor inspect` lists it: status, attempt, and what else it has to say."""
    extra = f"  (retried after attempt {node.attempts_before})" if node.attempts_before else ""
    extra += f"  error: {node.error}" if node.error else ""
    if node.status is NodeStatus.SKIPPED:
        extra += f"  skipped: {why_skipped(run.wf.step_for(name), run.state.node_map())}"
    if run.wf.step_for(name).starts_child and node.attempt:
        extra += f"  child: {child_run_id(run.run_id, name, node.attempt)}"
    return f"  {name:20} {node.status.value:11} attempt {node.attempt}{printable(extra)}"


def _print_times(columns: RunColumns) -> None:
    """When the run starts (if later), must have ended (if it has a deadline), wakes next."""
    if columns.start_at is not None:
        print(f"starts at  {columns.start_at}")
    if columns.deadline_at is not None:
        print(f"deadline   {columns.deadline_at} ({columns.timeout_ms} ms from its start)")
    print(f"next wake  {columns.next_wakeup_at or '-'}")


def _print_status(run: LoadedRun) -> None:
    """The run's status and reason, and what became of its compensations (core/sagas.py)."""
    reason = f" ({printable(run.state.reason)})" if run.state.reason else ""
    print(f"status     {run.state.status.value}{reason}")
    if run.wf.compensations:
        print(f"compensation {printable(str(compensation_of(run.state, run.wf)))}")


def cmd_inspect(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        record = read_run(conn, Definitions(), args.run_id, settings.instance_timeout_s)
    if record is None:
        raise RunNotFound(f"no run with id {args.run_id!r}")
    if args.output == "json":
        print_json(inspect_document(record))
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
    _print_status(run)
    print(f"version    {columns.version}   seq {run.state.seq}   tier {run.tier}")
    if run.parent is not None:
        parent = run.parent
        print(f"parent     {parent.run_id} (step {parent.node}, attempt {parent.attempt})")
    check = "ok" if run.checksum_ok else f"MISMATCH (row says {run.stored_checksum})"
    print(f"checksum   {state_checksum(run.state)} {check}")
    _print_times(columns)
    if record.key is not None:
        print(f"key        {printable(record.key.line())}")
    print(tags_line(record))
    print(input_line(record))
    print(f"output     {output_text(result)}")
    if run.state.versions:  # its steps' versions, once any is not 1 (core/versions.py)
        pins = step_versions(run.wf, run.state.versions)
        print("versions   " + ", ".join(f"{step} v{v}" for step, v in pins.items()))
    print("nodes:")
    for name, node in record.nodes:
        print(_node_line(run, name, node))
        for line in output_lines(record, name, node):
            print(line)
    print_attempts_and_signals(record)
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
        document = {"run_id": args.run_id, "signal_id": signal_id, "requested_on": topic}
        emit(args, document, f"signal {args.kind} requested on {topic} ({signal_id})")
        return EXIT_OK
    sent = send_signal(settings, args.run_id, args.kind, args.signal_id, payload)
    done = "sent" if sent.new else "was already recorded"
    document = {"run_id": args.run_id, "signal_id": sent.signal_id, "new": sent.new}
    emit(args, document, f"signal {args.kind} {done} ({sent.signal_id})")
    return EXIT_OK


def cmd_result(settings: Settings, args: argparse.Namespace) -> int:
    """Print a run's output as JSON once it succeeded (exit codes: grammar.EXIT_TABLE)."""
    if args.wait is not None and args.wait < 0:
        raise CliError("--wait must be 0 or more seconds", EXIT_USAGE)
    if args.wait is None:
        result = get_run(settings, args.run_id)
        if not result.finished:
            _not_finished(args, result, f"run {args.run_id!r} is still {result.status}")
    else:
        result = waited_result(settings, args, args.run_id, args.wait)
    return print_result(args, result)


def waited_result(
    settings: Settings, args: argparse.Namespace, run_id: str, wait_s: float
) -> RunResult:
    """The run's result once it ended; exit 3 (not finished) when it did not within
    ``wait_s`` (RunNotFound, exit 1, when there is no such run)."""
    try:
        return wait_for_run(settings, run_id, wait_s)
    except RunNotFinished as exc:
        _not_finished(args, exc.result, str(exc))


def _not_finished(args: argparse.Namespace, result: RunResult, why: str) -> NoReturn:
    """Exit 3; with ``-o json``, where the run stands first (its status, finished false)."""
    if args.output == "json":
        print_json(result_document(result))
    hint = "" if args.wait else " (--wait SECONDS waits)"
    raise CliError(f"{why}; not finished{hint}", EXIT_NOT_FINISHED)


def print_result(args: argparse.Namespace, result: RunResult) -> int:
    """An ended run's result: its output alone (text), or its whole result (``-o json``);
    exit 0 when it succeeded, 1 when it failed or was cancelled (why, on stderr)."""
    succeeded = result.status is RunStatus.SUCCEEDED
    if args.output == "json":
        print_json(result_document(result))
    elif succeeded:
        print(orjson.dumps(result.output).decode())
    if succeeded:
        return EXIT_OK
    print(f"run {result.run_id} {result.status}: {result.failure_reason or '-'}", file=sys.stderr)
    return EXIT_FAILED


def cmd_runs_release(settings: Settings, args: argparse.Namespace) -> int:
    """Clear a run's quarantine flag and wake it (client.release_run)."""
    release_run(settings, args.run_id)
    emit(args, {"run_id": args.run_id, "released": True}, f"run {args.run_id} released and woken")
    return EXIT_OK
