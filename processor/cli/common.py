"""What every command shares: exit codes, the error to report, signal handling."""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

from processor import early_stop

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# `ductor result`: the run has not ended (yet, or within --wait).
EXIT_NOT_FINISHED = 3


class CliError(Exception):
    """A failure to report as one sentence, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def stop_on_signals(stop: Callable[[], None]) -> None:
    """Call ``stop`` on SIGTERM and SIGINT (a graceful shutdown); at once if one came while
    the modules loaded (processor/early_stop.py)."""

    def handler(_signum: int, _frame: Any) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    if early_stop.asked():
        stop()
