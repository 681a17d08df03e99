"""A steps module of the tests' own, as a user's would be (`ductor worker --app
tests.integration.counted_steps:registry`): every execution of its step function is written
to a table of its own before the function does anything else, so a test counts what users
feel (how many times their code ran for one attempt) and not only the transitions in the run
table.

One step type, ``counted``, whose behaviour the run's input sets, per attempt:

- ``sleep_ms``: how long it takes (default 0);
- ``hang_on``: attempts that never return (a call that hangs);
- ``crash_on``: attempts that kill their process with SIGKILL (a native crash, the OOM killer);
- ``fail_on``: attempts that raise;
- ``meet``: how many of the run's steps wait for each other before they return (at once, the
  moment the last one arrives: steps that end together);
- ``by_node``: the same keys for one step of the run (``{"by_node": {"slow": {...}}}``).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import psycopg

from processor.tools.chaos_steps import ExecutionLog, extra_executions
from processor.worker import StepContext, StepFailed, StepRegistry

LOG = ExecutionLog("test_step_execution")
registry = StepRegistry()
_meetings: dict[str, threading.Barrier] = {}
_meetings_lock = threading.Lock()


def work_for(seconds: float) -> None:
    """A step's own work, as long as it takes (what a test's step simulates, not a test
    waiting for something: tests wait on conditions)."""
    threading.Event().wait(seconds)


@registry.step("counted")
def counted(ctx: StepContext) -> Any:
    LOG.record(ctx)  # first, committed: a crash below still counts
    spec = ctx.input if isinstance(ctx.input, dict) else {}
    spec = {**spec, **spec.get("by_node", {}).get(ctx.node, {})}
    if ctx.attempt in spec.get("crash_on", ()):
        os.kill(os.getpid(), signal.SIGKILL)
    if ctx.attempt in spec.get("hang_on", ()):
        threading.Event().wait()  # never returns
    if ctx.attempt in spec.get("fail_on", ()):
        raise StepFailed(f"attempt {ctx.attempt} fails, as its input says")
    sleep_ms = spec.get("sleep_ms", 0)
    if sleep_ms:
        work_for(sleep_ms / 1000)
    if spec.get("meet"):
        with _meetings_lock:
            meeting = _meetings.setdefault(ctx.run_id, threading.Barrier(spec["meet"]))
        meeting.wait(timeout=30)
    return {"attempt": ctx.attempt, "pid": os.getpid()}


# -- what the tests read ------------------------------------------------------------------


def install(conn: psycopg.Connection[Any]) -> None:
    """The table, emptied."""
    LOG.install(conn)
    conn.execute(f"TRUNCATE {LOG.table}")


executions = LOG.executions


__all__ = ["LOG", "counted", "executions", "extra_executions", "install", "registry", "work_for"]
