"""What every command shares: exit codes, the error to report, signal handling, tables."""

from __future__ import annotations

import faulthandler
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from processor.cli import early_stop
from processor.core.bounds import literal_problem

# The exit codes of every command (grammar.EXIT_TABLE says what each means; docs/usage.md).
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# `ductor result`, `ductor start --wait`: the run has not ended (yet, or within --wait).
EXIT_NOT_FINISHED = 3
# The reader of its output went away (`| head`): 128 + SIGPIPE, as a shell tool killed by it.
EXIT_READER_GONE = 141


class CliError(Exception):
    """A failure to report as one sentence, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def json_argument(flag: str, given: str | None, absent: Any) -> Any:
    """The JSON value a flag gives (``absent`` without one): the flag's value, the content of
    the file ``@PATH`` names, or stdin for ``-`` (JSON never starts with ``@`` and is never
    ``-`` alone, so neither is ambiguous); exit 2 when it cannot be read, is not JSON or holds
    an integer literal beyond 64 bits, which orjson would read as another number (the other
    bounds of stored JSON are the client's to check: core/bounds.py)."""
    text = json_text(flag, given)
    if text is None:
        return absent
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{flag} is not valid JSON: {exc}", EXIT_USAGE) from None
    problem = literal_problem(text.encode(), lambda document: document)
    if problem is not None:
        raise CliError(problem.describe(flag), EXIT_USAGE)
    return value


def json_text(flag: str, given: str | None) -> str | None:
    """The text ``given`` stands for: itself, ``@PATH``'s content or stdin's (``-``)."""
    if not given:
        return None
    if given == "-":
        return sys.stdin.read()
    if not given.startswith("@"):
        return given
    path = Path(given[1:])
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CliError(f"{flag} {given}: cannot read {path}: {exc.strerror}", EXIT_USAGE) from None
    except UnicodeDecodeError as exc:
        raise CliError(f"{flag} {given}: {path} is not UTF-8 ({exc.reason})", EXIT_USAGE) from None


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Rows under a header, every column as wide as its widest cell but the last (which may
    be long: a failure reason), two spaces apart."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        print("  ".join([*cells, row[-1]]).rstrip())


# How long past its shutdown bound a stopping service may take before it is ended: the
# bound's own overruns (the group's last commit and the leave, up to 2 s past it; the
# instance's presence row) fit well inside. Its stacks are written then, and a second later
# SIGALRM ends it (exit 142, 128 + SIGALRM: the services' code for a stop that overran).
STOP_OVERRUN_S = 8.0
_STACKS_TO_END_S = 1.0


def stop_on_signals(stop: Callable[[], None], shutdown_bound_s: float | None = None) -> None:
    """Call ``stop`` on SIGTERM and SIGINT (a graceful shutdown); at once if one came while
    the modules loaded (processor/cli/early_stop.py). SIGUSR1 writes every thread's stack to
    stderr, and the service goes on: what a process that does not stop is doing, without a
    debugger (docs/operations/running.md#logs).

    With ``shutdown_bound_s`` (a service's shutdown timeout), a stop is also a promise: a
    process still alive ``STOP_OVERRUN_S`` past the bound writes every thread's stack to
    stderr (faulthandler's watchdog, a thread of C: it works while a teardown is stuck in a
    client's destructor), and the kernel ends it with SIGALRM a second later (its default
    action, which no Python code has to run for), so a stop that hangs is ended and says
    where."""
    armed = False

    def handler(_signum: int, _frame: Any) -> None:
        nonlocal armed
        if shutdown_bound_s is not None and not armed:  # a second signal keeps the first's
            armed = True
            overrun_s = shutdown_bound_s + STOP_OVERRUN_S
            faulthandler.dump_traceback_later(overrun_s)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            signal.setitimer(signal.ITIMER_REAL, overrun_s + _STACKS_TO_END_S)
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if early_stop.asked():
        handler(signal.SIGTERM, None)
