"""What every command shares: exit codes, the error to report, signal handling, tables."""

from __future__ import annotations

import faulthandler
import signal
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from processor.cli import early_stop
from processor.core.bounds import literal_problem

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# `ductor result`: the run has not ended (yet, or within --wait).
EXIT_NOT_FINISHED = 3


class CliError(Exception):
    """A failure to report as one sentence, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def json_argument(flag: str, text: str | None, absent: Any) -> Any:
    """The JSON value a flag gives (``absent`` without one); exit 2 when it is not JSON or
    holds an integer literal beyond 64 bits, which orjson would read as another number (the
    other bounds of stored JSON are the client's to check: core/bounds.py)."""
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


def print_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Rows under a header, every column as wide as its widest cell but the last (which may
    be long: a failure reason), two spaces apart."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    for row in [header, *rows]:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=True)]
        print("  ".join([*cells, row[-1]]).rstrip())


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM and SIGINT (a graceful shutdown); at once if one came while
    the modules loaded (processor/cli/early_stop.py). SIGUSR1 writes every thread's stack to
    stderr, and the service goes on: what a process that does not stop is doing, without a
    debugger (docs/operations/running.md#logs)."""

    def handler(_signum: int, _frame: Any) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if early_stop.asked():
        stop()
