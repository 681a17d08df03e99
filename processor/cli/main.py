"""The ``ductor`` command line: the root parser, ``ductor help`` and ``main``; each command
family registers its own subcommands (``FAMILIES``), and grammar.py adds what they share.

Exit codes are one table for every command (grammar.EXIT_TABLE, printed by ``ductor
--help``); errors are printed as one sentence on stderr, never as a traceback (errors.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module, metadata
from typing import Any

from processor.cli import early_stop
from processor.cli.common import EXIT_OK, EXIT_READER_GONE, EXIT_USAGE
from processor.cli.grammar import EXIT_TABLE, add_output, add_output_everywhere, resolve_output
from processor.cli.tool_commands import parse_bench_arguments
from processor.io.config.settings import load_settings
from processor.io.config.variables import secret_file_warnings
from processor.io.telemetry.logs import setup_logging

DISTRIBUTION = "ductor-processor"


@dataclass(frozen=True)
class Family:
    """A family of commands: the module (in processor.cli) whose function registers them
    under the root's subparsers, and the top-level commands it registers."""

    module: str
    register: str
    commands: tuple[str, ...]

    def add_to(self, sub: Any) -> None:
        getattr(import_module(f"processor.cli.{self.module}"), self.register)(sub)


# In the order `ductor --help` lists them (tests/unit/test_cli_families.py checks that each
# registers the commands said). A command line that names one loads its family alone: a
# family's module loads what its commands use (the processor, the worker, the web server),
# and a `ductor runs list` need not pay for the others.
FAMILIES: tuple[Family, ...] = (
    Family("config", "register", ("config",)),
    Family("services", "register_setup", ("migrate", "topics")),
    Family("workflows", "register", ("workflows",)),
    Family("start", "register", ("start",)),
    Family("services", "register_services", ("process", "worker")),
    Family("workers", "register", ("workers",)),
    Family("runs", "register", ("inspect", "result", "runs", "signal")),
    Family("tool_commands", "register", ("bench", "demo")),
    Family("gc", "register", ("gc",)),
    Family("outbox", "register", ("outbox",)),
    Family("triggers", "register", ("triggers",)),
    Family("schedules", "register", ("schedules",)),
    Family("ui", "register", ("ui",)),
    Family("dlq", "register", ("dlq",)),
    # Completion is drawn from the whole parser: named, every family loads.
    Family("completion", "register", ()),
)


def families_for(words: Sequence[str]) -> tuple[Family, ...]:
    """The families a command line's ``words`` need: the one whose command it names (its
    first word that is a command), or all of them (help, completion, a bare or unknown
    command)."""
    named = next((w for w in words if any(w in f.commands for f in FAMILIES)), None)
    if named is None:
        return FAMILIES
    return tuple(f for f in FAMILIES if named in f.commands)


def installed_version() -> str:
    """The version of the installed distribution (its metadata), as `ductor --version` says."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"unknown ({DISTRIBUTION} is not installed: run from a source tree)"


def build_parser(words: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The root parser, with the families a command line's ``words`` need (``families_for``;
    all without them)."""
    parser = argparse.ArgumentParser(
        prog="ductor",
        description="Ductor coordinator: advances durable workflow runs from Kafka wakeups, "
        "committing each tick to Postgres with optimistic concurrency.",
        epilog=EXIT_TABLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"ductor {installed_version()}")
    add_output(parser, root=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for family in FAMILIES if words is None else families_for(words):
        family.add_to(sub)
    p = sub.add_parser("help", help="this help, or a command's: ductor help runs list")
    p.add_argument("topic", nargs="*", metavar="COMMAND", help="the command")
    p.set_defaults(early=cmd_help, json_refused="it prints the help")
    add_output_everywhere(parser)
    return parser


def cmd_help(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """`ductor help [COMMAND...]`: the help of the command named, as `--help` prints it."""
    current = parser
    for word in args.topic:
        children = next(
            (a.choices for a in current._actions if isinstance(a, argparse._SubParsersAction)),
            None,
        )
        if children is None or word not in children:
            current.print_usage(sys.stderr)
            print(f"ductor: no command {' '.join(args.topic)!r}", file=sys.stderr)
            return EXIT_USAGE
        current = children[word]
    current.print_help()
    return EXIT_OK


def parse_args(
    argv: Sequence[str] | None = None, parser: argparse.ArgumentParser | None = None
) -> argparse.Namespace:
    """The command line parsed; exits 2 with a usage message on bad usage (argparse)."""
    parser = parser or build_parser(_words(argv))
    args, rest = parser.parse_known_args(argv)
    if args.command == "bench":
        return parse_bench_arguments(rest, args)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(_words(argv))
    args = parse_args(argv, parser)
    if not getattr(args, "handles_signals", False) and args.command is not None:
        kept = early_stop.hand_over()
        if kept is not None:
            return 128 + kept  # stopped while it loaded, before it did anything
    try:
        code = _run(parser, args)
        sys.stdout.flush()  # a reader gone shows here, not as the interpreter exits
        return code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError as exc:
        if not _reader_gone():
            return _failed(exc)
        # What is left in the buffer goes nowhere, not into an error as the interpreter exits.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_READER_GONE
    except Exception as exc:  # every failure is one sentence and an exit code: cli/errors.py
        return _failed(exc)


def _run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.command is None:  # a bare `ductor`: what it can do
        parser.print_help()
        return EXIT_OK
    resolve_output(args)
    early = getattr(args, "early", None)
    if early is not None:  # needs no settings: help, completion
        code: int = early(parser, args)
        return code
    settings = load_settings()
    setup_logging(settings.log_format, settings.log_level)
    for warning in secret_file_warnings():
        logging.getLogger("ductor.config").warning(warning)
    code = args.func(settings, args)
    return code


def _words(argv: Sequence[str] | None) -> Sequence[str]:
    """The command line's words: ``argv``, or the process's own."""
    return sys.argv[1:] if argv is None else argv


def _failed(exc: Exception) -> int:
    from processor.cli.errors import explain  # noqa: PLC0415 (its imports: only on a failure)

    failure = explain(exc)
    print(f"ductor: {failure.message}", file=sys.stderr)
    return failure.code


def _reader_gone() -> bool:
    """Whether standard output's reader went away (``ductor runs list | head``): then the
    command ends without a word, as a shell tool killed by SIGPIPE does. A pipe or socket
    whose reader closed polls as an error (a BrokenPipeError of another connection, should
    one reach here, is a failure like any other)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        events = poller.poll(0)
    except (OSError, ValueError):
        return False
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in events)


if __name__ == "__main__":
    sys.exit(main())
