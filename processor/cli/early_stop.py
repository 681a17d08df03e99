"""A stop asked for before a command could handle it. `ductor process` and `ductor worker`
take a second or so to load their modules; a supervisor's SIGTERM (or a Ctrl-C) in that time
used to kill the process by the signal (exit -15, as if it crashed). ``keep`` is the first
thing ``python -m processor`` does: the signal is kept, and the service stops cleanly as soon
as it handles signals itself (cli/common.stop_on_signals); any other command gets the default
handlers back (``hand_over``) and ends as the signal asked. Only the standard library here:
this module loads before anything else."""

from __future__ import annotations

import os
import signal
from typing import Any

_asked: list[int] = []


def keep() -> None:
    """From now on SIGTERM and SIGINT are kept, not acted on."""

    def handler(signum: int, _frame: Any) -> None:
        _asked.append(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def loading_fault() -> None:
    """The ``loading`` fault point (io/runtime/faults.py): ``DUCTOR_TEST_FAULTS=loading=term``
    sends this process a SIGTERM now, as a supervisor might while the modules load."""
    for item in os.environ.get("DUCTOR_TEST_FAULTS", "").split(","):
        if item.strip() == "loading=term":
            os.kill(os.getpid(), signal.SIGTERM)


def asked() -> bool:
    return bool(_asked)


def hand_over() -> int | None:
    """The default handlers again (for a command that does not handle signals itself); the
    signal kept meanwhile, if one came."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    return _asked[0] if _asked else None
