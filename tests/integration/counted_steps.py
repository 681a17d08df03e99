"""A steps module of the tests' own, as a user's would be (`ductor worker --app
tests.integration.counted_steps:registry`): every execution of its step function is written
to a table of its own before the function does anything else, and its end when it returns or
raises, so a test counts what users feel (how many times their code ran for one attempt,
and which ran at the same time) and not only the transitions in the run table.

A compensation, ``counted_undo``, counted the same way (its output what it was given to
undo). One step type, ``counted``, whose behaviour the run's input sets, per attempt:

- ``sleep_ms``: how long it takes (default 0), ignoring its cancellation (a call that does
  not look at ``ctx.cancelled``); ``sleep_on``: the same for some attempts only
  (``{"1": 10000}``);
- ``beat_every_ms``: it heartbeats this often while it sleeps, with its progress as the
  details (``{"beats": n}``);
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


class TimedLog(ExecutionLog):
    """The execution log with each execution's end: ``ended_at`` once the function returned
    or raised (NULL: it never did, its process was killed)."""

    def install(self, conn: psycopg.Connection[Any]) -> None:
        super().install(conn)
        conn.execute(f"ALTER TABLE {self.table} ADD COLUMN IF NOT EXISTS ended_at timestamptz")

    def ended(self, ctx: StepContext) -> None:
        """The last execution of ``ctx``'s attempt in this process ended."""
        conn: psycopg.Connection[Any] = self._local.conn
        conn.execute(
            f"UPDATE {self.table} SET ended_at = now() WHERE id = (SELECT max(id)"
            f" FROM {self.table} WHERE run_id = %s AND node = %s AND attempt = %s AND pid = %s)",
            (ctx.run_id, ctx.node, ctx.attempt, os.getpid()),
        )


LOG = TimedLog("test_step_execution")
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
    try:
        return _run(ctx)
    finally:
        LOG.ended(ctx)


@registry.step("counted_undo")
def counted_undo(ctx: StepContext) -> Any:
    """A compensation (``undo(step)``), counted as ``counted`` is and set by the same keys
    (``by_node`` of ``undo(step)``): its output says what it was given to undo."""
    LOG.record(ctx)
    try:
        _run(ctx)
        return {"undid": dict(ctx.deps), "input": ctx.input}
    finally:
        LOG.ended(ctx)


def _run(ctx: StepContext) -> Any:
    spec = ctx.input if isinstance(ctx.input, dict) else {}
    spec = {**spec, **spec.get("by_node", {}).get(ctx.node, {})}
    if ctx.attempt in spec.get("crash_on", ()):
        os.kill(os.getpid(), signal.SIGKILL)
    if ctx.attempt in spec.get("hang_on", ()):
        threading.Event().wait()  # never returns
    if ctx.attempt in spec.get("fail_on", ()):
        raise StepFailed(f"attempt {ctx.attempt} fails, as its input says")
    sleep_ms = spec.get("sleep_on", {}).get(str(ctx.attempt), spec.get("sleep_ms", 0))
    every_ms = spec.get("beat_every_ms")
    if sleep_ms and every_ms:
        for beat in range(1, sleep_ms // every_ms + 1):
            work_for(every_ms / 1000)
            ctx.heartbeat({"beats": beat})
    elif sleep_ms:
        work_for(sleep_ms / 1000)
    if spec.get("meet"):
        with _meetings_lock:
            meeting = _meetings.setdefault(ctx.run_id, threading.Barrier(spec["meet"]))
        meeting.wait(timeout=30)
    # (getattr: the module runs on workers from before heartbeat details too)
    last = getattr(ctx, "last_heartbeat", None)
    return {"attempt": ctx.attempt, "pid": os.getpid(), "last_heartbeat": last}


# -- what the tests read ------------------------------------------------------------------


def install(conn: psycopg.Connection[Any]) -> None:
    """The table, emptied."""
    LOG.install(conn)
    conn.execute(f"TRUNCATE {LOG.table}")


executions = LOG.executions


def intervals(conn: psycopg.Connection[Any], prefix: str = "") -> list[tuple[str, int, Any, Any]]:
    """Every execution of the runs whose id starts with ``prefix``, in the order they began:
    (run, attempt, started_at, ended_at), ended_at None for one that never ended."""
    return [
        (r, a, s, e)
        for r, a, s, e in conn.execute(
            f"SELECT run_id, attempt, started_at, ended_at FROM {LOG.table}"
            " WHERE starts_with(run_id, %s) ORDER BY started_at, id",
            (prefix,),
        ).fetchall()
    ]


def overlapping(conn: psycopg.Connection[Any], prefix: str = "") -> list[tuple[Any, Any]]:
    """The pairs of executions (of the runs whose id starts with ``prefix``) that ran at the
    same time: each began before the one before it ended (or that one never ended)."""
    found = []
    running: list[tuple[str, int, Any, Any]] = []
    for execution in intervals(conn, prefix):
        started = execution[2]
        running = [e for e in running if e[3] is None or e[3] > started]
        found += [(e, execution) for e in running]
        running.append(execution)
    return found


__all__ = [
    "LOG",
    "counted",
    "counted_undo",
    "executions",
    "extra_executions",
    "install",
    "intervals",
    "overlapping",
    "registry",
    "work_for",
]
