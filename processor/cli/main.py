"""The ``ductor`` command line: the parser and ``main``; the commands are in the modules
beside this one.

Exit codes scripts can rely on: 0 success, 1 the operation failed (a service is unreachable,
a run did not end as expected, a run cannot be retried, a start refused), 2 bad usage or bad
configuration (a health or metrics port in use included);
`ductor result` also exits 1 for a failed or cancelled run, 2 for an unknown run and 3 for a
run that has not ended (within --wait). Errors are printed as one sentence on stderr, never as
a traceback.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib import metadata

from processor.cli import early_stop
from processor.cli.config import add_config_output, cmd_config_check, cmd_config_show
from processor.cli.dlq import cmd_dlq_list, cmd_dlq_replay
from processor.cli.errors import explain
from processor.cli.gc import cmd_gc
from processor.cli.outbox import cmd_outbox_parked, cmd_outbox_unpark
from processor.cli.runs import (
    cmd_inspect,
    cmd_result,
    cmd_runs_release,
    cmd_signal,
    cmd_start,
)
from processor.cli.schedules import add_schedule_commands
from processor.cli.search import add_search_commands
from processor.cli.services import cmd_migrate, cmd_process, cmd_topics_create, cmd_worker
from processor.cli.tool_commands import cmd_bench, cmd_demo, parse_bench_arguments
from processor.cli.triggers import add_trigger_commands
from processor.cli.ui import add_ui_command
from processor.cli.workers import add_workers_command
from processor.cli.workflows import add_workflow_commands
from processor.client import IfExists
from processor.core.outcomes import DLQ_REASONS
from processor.core.routing import TIERS
from processor.io.config.settings import load_settings
from processor.io.config.variables import secret_file_warnings
from processor.io.telemetry.logs import setup_logging

DISTRIBUTION = "ductor-processor"


def installed_version() -> str:
    """The version of the installed distribution (its metadata), as `ductor --version` says."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"unknown ({DISTRIBUTION} is not installed: run from a source tree)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ductor",
        description="Ductor coordinator: advances durable workflow runs from Kafka wakeups, "
        "committing each tick to Postgres with optimistic concurrency.",
    )
    parser.add_argument("--version", action="version", version=f"ductor {installed_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    config = sub.add_parser("config", help="the settings in effect, and whether they work")
    config_sub = config.add_subparsers(dest="config_command", required=True, metavar="ACTION")
    p = config_sub.add_parser(
        "show",
        help="every setting in effect (secrets hidden) and where it came from (default, env,"
        " file), the Kafka clients' properties, what the telemetry exports",
    )
    add_config_output(p)
    p.set_defaults(func=cmd_config_show)
    p = config_sub.add_parser(
        "check",
        help="reach Postgres and Kafka (short timeouts), check the schema version, the Kafka"
        " client settings and the topics' partition counts; one line per check, exit 1 if one"
        " fails",
    )
    p.set_defaults(func=cmd_config_check)

    p = sub.add_parser(
        "migrate", help="apply the SQL migrations the package ships (schemas/migrations)"
    )
    p.set_defaults(func=cmd_migrate)

    topics = sub.add_parser("topics", help="manage the Kafka topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    p = topics_sub.add_parser(
        "create",
        help="create every topic idempotently (partitions from config), with a steps topic"
        " for each queue the registered workflows name",
    )
    p.add_argument(
        "--queue", metavar="Q[,Q...]", help="steps topics of these queues too (not registered yet)"
    )
    p.set_defaults(func=cmd_topics_create)

    add_workflow_commands(sub)

    p = sub.add_parser("start", help="start runs of a registered workflow")
    p.add_argument("workflow", help="workflow name (its latest version is used)")
    p.add_argument("--input", help="run input as JSON")
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
    _via_argument(p)
    p.set_defaults(func=cmd_start)

    p = sub.add_parser("process", help="run one coordinator instance until SIGTERM/SIGINT")
    p.set_defaults(func=cmd_process, handles_signals=True)

    p = sub.add_parser(
        "worker", help="run a step worker with your step functions (--app) or the sample ones"
    )
    p.add_argument(
        "--concurrency",
        "--threads",
        type=int,
        default=8,
        help="most step functions running at once (plain ones each on a thread of its own)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=None,
        metavar="N",
        help="most tasks held waiting to run (read, claimed, waiting for a slot)"
        " (default: 16 per slot, at least 512)",
    )
    p.add_argument(
        "--queue",
        default="default",
        metavar="Q[,Q...]",
        help="the queues to serve (a step names its queue; default: default)",
    )
    p.add_argument(
        "--isolation",
        choices=("thread", "process"),
        default="thread",
        help="run steps in the worker's threads, or each slot in a child process that a hung"
        " or crashing step takes down alone (default: thread)",
    )
    p.add_argument(
        "--abandon-after",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a step still running this long past its deadline is abandoned (default: 5)",
    )
    p.add_argument(
        "--max-abandoned",
        type=int,
        default=None,
        metavar="N",
        help="abandoned steps still running past which the worker stops with exit code 3"
        " (default: the concurrency)",
    )
    p.add_argument(
        "--crash-reruns",
        type=int,
        default=1,
        metavar="N",
        help="how many more times an attempt runs (in a child process of its own) after the"
        " worker running it died, before it fails (default: 1)",
    )
    p.add_argument(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        help="the StepRegistry to run, e.g. my_package.steps:registry (the current directory"
        " is importable); default: the sample step functions",
    )
    p.set_defaults(func=cmd_worker, handles_signals=True)
    add_workers_command(sub)

    p = sub.add_parser("inspect", help="show a run: status, nodes, version, seq, checksum check")
    p.add_argument("run_id")
    p.add_argument(
        "--output",
        choices=("text", "json"),
        default="text",
        help="json: the run, its nodes and a timeline of every attempt",
    )
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser(
        "result",
        help="print a run's output as JSON (exit 0 succeeded, 1 failed or cancelled, 2 unknown"
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
    p.add_argument("--payload", help="the signal's data, as JSON (a wait step's output)")
    p.add_argument("--signal-id", help="idempotency key (default: a new one)")
    _via_argument(p)
    p.set_defaults(func=cmd_signal)

    p = sub.add_parser(
        "demo", help="the whole system live: infra, 2 processors, a worker, thousands of runs"
    )
    p.add_argument(
        "--runs", type=int, default=3000, help="sample runs to start (plus hot, failing, cancelled)"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    p.set_defaults(func=cmd_demo)

    # The benchmark's options are its own (see parse_args): `ductor bench --help` lists them.
    p = sub.add_parser(
        "bench", help="the benchmark (same as `make bench`); prints figures", add_help=False
    )
    p.set_defaults(func=cmd_bench)

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

    add_trigger_commands(sub)
    add_schedule_commands(sub)
    add_ui_command(sub)

    dlq = sub.add_parser("dlq", help="list and replay dead-lettered records")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dlq_sub.add_parser(
        "list",
        help="print the dead letters from the beginning, one line each: dlq partition:offset,"
        " reason, source topic[partition]@offset, key, value excerpt, detail",
    )
    p.add_argument("--limit", type=int, help="print at most N records (the first N read)")
    p.add_argument("--reason", choices=DLQ_REASONS, help="only records dead-lettered for R")
    p.set_defaults(func=cmd_dlq_list)
    p = dlq_sub.add_parser(
        "replay",
        help="produce a dead letter again to its source topic, with its key and headers"
        " (without the ductor.dlq.* ones)",
    )
    p.add_argument("dlq_offset", type=int, help="the record's offset in the dead-letter topic")
    p.add_argument("--partition", type=int, default=0, help="its dead-letter partition (0)")
    p.add_argument("--value-file", help="send this file's bytes as the value instead")
    p.add_argument(
        "--force",
        action="store_true",
        help="replay even a value the processor would dead-letter again",
    )
    p.set_defaults(func=cmd_dlq_replay)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line parsed; exits 2 with a usage message on bad usage (argparse)."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return parse_bench_arguments(rest, args)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if not getattr(args, "handles_signals", False):
        kept = early_stop.hand_over()
        if kept is not None:
            return 128 + kept  # stopped while it loaded, before it did anything
    try:
        settings = load_settings()
        setup_logging(settings.log_format, settings.log_level)
        for warning in secret_file_warnings():
            logging.getLogger("ductor.config").warning(warning)
        code: int = args.func(settings, args)
        return code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # every failure is one sentence and an exit code: cli/errors.py
        failure = explain(exc)
        print(f"ductor: {failure.message}", file=sys.stderr)
        return failure.code


if __name__ == "__main__":
    sys.exit(main())


def _via_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--via",
        choices=("database", "kafka"),
        default="database",
        help="database (default): write the run or signal row, then wake the run; kafka: write"
        " a request to the requests topic and let a processor do it (no Postgres access"
        " needed, docs/requests.md)",
    )
