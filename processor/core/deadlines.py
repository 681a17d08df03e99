"""Run deadlines: a run of a workflow that declares ``timeout_ms`` (or started with a timeout
of its own) must end by a time fixed when it was created: the time it may start (its
creation, or its delayed start) plus the timeout. The rules are core/tick.py's (rule 2b):

- The deadline is kept on the run's row (``deadline_at``, with the ``timeout_ms`` it came
  from), written with the run (io/postgres/runs_admin.py; a child run's by the commit that
  starts it) and read by the load for a live run that has one (``RunDeadline``): a run
  without a deadline costs its load nothing but a null.
- Past it, by the ``now`` the tick is given (never earlier, whatever woke the run), the run
  fails with ``run deadline of N ms passed``. What is in flight is cancelled as a cancel
  signal cancels it (core/run_ends.py ``end_run``): a task no worker claimed yet is never
  started (its claim finds its attempt no longer dispatched), a running attempt's worker is
  told to stop (its check that the attempt is current fails: ``ctx.cancelled``) and its
  result, should it come, is applied to nothing; a child run in flight is cancelled
  (core/children.py, rule 3).
- The tick that starts the run (its first commit) sets a wakeup at the deadline on the delay
  ladder when the deadline is within the ladder's horizon; every commit keeps the row's
  ``next_wakeup_at`` no later than the deadline (io/postgres/commit_sql.py), so a deadline
  further ahead, or a run resumed by ``ductor runs retry`` (which gives the run its whole
  timeout again from the retry), is woken by the watchdog's sweep of overdue runs, as step
  deadlines are.

A run that ends before its deadline is untouched by it. Pure: no clock; ``now_ms`` is given.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from processor.core.tick_decision import Decision
from processor.core.workflow_def import MAX_BACKOFF_MS, MAX_TIMEOUT_MS

__all__ = [
    "RunDeadline",
    "deadline_reason",
    "timeout_problem",
    "with_deadline_timer",
]


class RunDeadline(NamedTuple):
    """When a run must have ended (epoch ms, Postgres's clock), and the timeout it came from
    (what its failure says)."""

    at_ms: int
    timeout_ms: int


def deadline_reason(timeout_ms: int) -> str:
    """Why a run past its deadline failed."""
    return f"run deadline of {timeout_ms} ms passed"


def with_deadline_timer(decision: Decision, deadline: RunDeadline, now_ms: int) -> Decision:
    """``decision`` of the tick that starts a run, with a wakeup at the run's deadline when
    the run goes on and the deadline is within the delay ladder's horizon."""
    new = decision.new_state
    if new is None or new.status.terminal or deadline.at_ms - now_ms > MAX_BACKOFF_MS:
        return decision
    if deadline.at_ms in decision.timers:
        return decision
    return decision._replace(timers=tuple(sorted((*decision.timers, deadline.at_ms))))


def timeout_problem(value: Any, what: str) -> str | None:
    """What is wrong with ``value`` as a run's timeout in ms (None: nothing): every door
    checks it before anything is written, as the definition's parser checks the workflow's."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{what}: expected a whole number of milliseconds, got {value!r}"
    if not 1 <= value <= MAX_TIMEOUT_MS:
        return f"{what}: must be between 1 and {MAX_TIMEOUT_MS} ms (ten years), not {value}"
    return None
