"""The step the failover measurement runs (`ductor worker --app
processor.tools.failover_steps:registry`): each execution is written to a table of its own
before anything else (with the worker's pid and Postgres's time), so the measurement reads
when, and by which worker, each queued task ran after another worker was killed.

A worker started with ``FAILOVER_HOLD_S`` set holds each step that long (or until its attempt
no longer matters): with one slot it keeps the rest of its tasks queued, which is what the
measurement kills it with.
"""

from __future__ import annotations

import os
import threading
from typing import Any

from processor.tools.chaos_steps import ExecutionLog
from processor.worker import StepContext, StepRegistry

STEP_TYPE = "failover_work"
HOLD_VARIABLE = "FAILOVER_HOLD_S"
LOG = ExecutionLog("failover_step_execution")

registry = StepRegistry()


@registry.step(STEP_TYPE)
def work(ctx: StepContext) -> Any:
    LOG.record(ctx)
    hold_s = float(os.environ.get(HOLD_VARIABLE) or 0)
    waited = threading.Event()
    step_s = 0.2
    held = 0.0
    while held < hold_s and not ctx.cancelled:
        waited.wait(step_s)  # (a held step: its worker's one slot stays busy)
        held += step_s
    return {"pid": os.getpid()}
