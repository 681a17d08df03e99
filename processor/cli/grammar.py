"""What every command's line shares, so each family module says only what is its own: the
global ``-o/--output text|json`` (before the command or after it), how a command prints in
either, and the exit-code table ``ductor --help`` prints.

The output option is added here to every command but the services (``json_refused``): a
command cannot forget it, no command has one of its own, and ``-o`` before the command is not
undone by the command's (its default is SUPPRESS, so only a value given after the command
replaces one given before). ``-o json`` prints one JSON document, or for a list JSON lines,
one object per listed thing, for scripts.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from typing import Any

import orjson

from processor.cli.common import EXIT_USAGE, STOP_OVERRUN_S, CliError
from processor.io.runtime.exit_codes import EXIT_ABANDONED, EXIT_KAFKA_FATAL, EXIT_STOP_OVERRAN

OUTPUTS = ("text", "json")
_OUTPUT_HELP = "text (default) or json: one JSON document, or one JSON object a line for a list"

# What the codes mean, as `ductor --help` prints it. The services (process, worker, ui) exit
# by it too (0 stopped cleanly, 2 refused configuration); the two ways a service stops
# itself for its supervisor to start a fresh process have codes of their own, never 0-3.
EXIT_TABLE = f"""exit codes (every command):
  0  done (a run: it succeeded)
  1  the operation failed: a run failed or was cancelled, a run, schedule or trigger was
     not found, a service is unreachable, a change was refused
  2  refused input, usage or configuration: nothing was done (a bad flag or value, input
     a workflow's schema refuses, an unknown workflow, a missing topic)
  3  not finished: the run has not ended (within --wait)
  130  interrupted (Ctrl-C); 128+N: stopped by signal N while it loaded; 141: the reader
       of its output went away (| head), said nothing
a service stops itself for its supervisor to start a fresh one with
  {EXIT_KAFKA_FATAL}  a fatal Kafka client error (process, worker)
  {EXIT_ABANDONED}  too many abandoned steps still running (worker, --max-abandoned)
  {EXIT_STOP_OVERRAN}  its stop overran the shutdown timeout by {STOP_OVERRUN_S:.0f} s
       (process, worker; its threads' stacks are in its log)
docs/usage.md#exit-codes"""


def add_output(p: argparse.ArgumentParser, *, root: bool = False) -> None:
    p.add_argument(
        "-o",
        "--output",
        choices=OUTPUTS,
        default=None if root else argparse.SUPPRESS,
        help=_OUTPUT_HELP,
    )


def leaf_parsers(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every parser of a command that runs (one with a ``func``), each once."""
    seen: set[int] = set()
    pending = [parser]
    while pending:
        current = pending.pop()
        for action in current._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    if id(child) not in seen:
                        seen.add(id(child))
                        pending.append(child)
        if current.get_default("func") is not None:
            yield current


def add_output_everywhere(parser: argparse.ArgumentParser) -> None:
    """``-o/--output`` on every command that prints, unless it refuses JSON (a service: it
    logs, DUCTOR_LOG_FORMAT=json)."""
    for leaf in leaf_parsers(parser):
        if leaf.get_default("json_refused") is None:
            add_output(leaf)


def resolve_output(args: argparse.Namespace) -> None:
    """Settle ``args.output`` to text or json; JSON asked of a service is refused (exit 2)."""
    args.output = getattr(args, "output", None) or "text"
    refused = getattr(args, "json_refused", None)
    if args.output == "json" and refused is not None:
        command = " ".join(_command_words(args))
        raise CliError(f"`ductor {command}` takes no -o json: {refused}", EXIT_USAGE)


def _command_words(args: argparse.Namespace) -> list[str]:
    words = [args.command]
    for key, value in sorted(vars(args).items()):
        if key.endswith("_command") and isinstance(value, str):
            words.append(value)
    return words


def print_json(value: Any) -> None:
    """One JSON document on one line (a script reads a line)."""
    sys.stdout.write(orjson.dumps(value).decode() + "\n")


def print_json_lines(values: list[Any]) -> None:
    """A list as JSON lines: one object a line, nothing else (an empty list prints nothing)."""
    for value in values:
        print_json(value)


def emit(args: argparse.Namespace, document: Any, text: str | Callable[[], None]) -> None:
    """A command's report: ``document`` as JSON with ``-o json``, else ``text`` (a line, or a
    function that prints)."""
    if args.output == "json":
        print_json(document)
    elif callable(text):
        text()
    else:
        print(text)
