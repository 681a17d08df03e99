"""Durable sleep: a step no worker runs that ends at a time, kept as its node's due time in
the run's state (``due_ms``, so ``next_wakeup_at`` on the row), never in a process's memory.
The rules are core/tick.py's (rule 6 starts a sleep, rule 4b ends it); here are the parts:

- ``sleep_due``: when a sleep that starts now ends: ``duration_ms`` from now, or the time its
  ``until`` selector finds (an ISO-8601 time with a zone, or epoch milliseconds), read by the
  load (``Selected``, io/postgres/selected.py). A value that is no time fails the step with
  the reason (the run fails as for any failed step; the processor never does). A value its
  load did not find recorded (its source step ended in this very tick, its output written by
  this tick's commit) starts nothing yet: the tick sets a timer for now, and the next tick,
  whose load reads it, starts the sleep.
- ``wake_sleeps``: each sleep in flight whose time came succeeds, its output
  ``{"slept_until_ms": <its time>}``; one whose time had passed when it started (an ``until``
  in the past) ends in the tick that starts it. No sleep ever ends before its time: the tick
  judges it by the ``now`` it is given (Postgres's clock), whatever woke the run.
- ``sleep_timers``: a sleep started gets a wakeup at its time on the delay ladder (one at most
  a week ahead: the ladder's horizon); a longer one is woken by the watchdog's sweep of
  overdue runs, like a step deadline.

Pure: no clock (datetime is the shell's), the ISO-8601 reading is arithmetic.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import orjson

from processor.core.run_state import NodeState, NodeStatus, RunState, node_state
from processor.core.selectors import Selected
from processor.core.workflow_def import MAX_BACKOFF_MS, StepDef, WorkflowDef

_DISPATCHED, _SUCCEEDED = NodeStatus.DISPATCHED, NodeStatus.SUCCEEDED
_FAILED = NodeStatus.FAILED

# The largest time a sleep may end at: the end of the year 9999 (every door's epoch bound).
MAX_UNTIL_MS = 253_402_300_799_999


# (node, output as JSON text): a step the tick ended succeeded with an output it made itself
# (a sleep's, a wait's default), which the commit records as the step's result.
Settled = tuple[str, int, str]


def sleep_due(
    step: StepDef, now_ms: int, selected: Mapping[str, Selected] | None
) -> int | str | None:
    """When sleep step ``step``, starting now, ends (epoch ms); a string: why it cannot sleep
    (the step fails with it); None: its ``until`` value is not recorded yet (see above)."""
    if step.until is None:
        return now_ms + (step.sleep_ms or 0)
    found = None if selected is None else selected.get(step.until.text)
    if found is None:
        return None
    if not found.found:
        return f"until {step.until.text} found nothing in the run"
    return instant_ms(found.value, f"until {step.until.text}")


def start_sleep(
    node: NodeState, step: StepDef, now_ms: int, selected: Mapping[str, Selected] | None
) -> NodeState | None:
    """``node`` of sleep step ``step`` started now: in flight until its time, or failed when
    its ``until`` is no time; None: not started yet (its ``until`` value is not recorded)."""
    due = sleep_due(step, now_ms, selected)
    if due is None:
        return None
    attempt = node.attempt + 1
    if isinstance(due, str):
        return node_state(_FAILED, attempt, None, due, node.attempts_before)
    return node_state(_DISPATCHED, attempt, due, None, node.attempts_before)


def wake_sleeps(nodes: dict[str, NodeState], wf: WorkflowDef, now_ms: int) -> list[Settled]:
    """End each sleep in flight whose time came (succeeded, with its output)."""
    woke: list[Settled] = []
    for step in wf.sleeps:
        node = nodes[step.name]
        if node.status is not _DISPATCHED or node.due_ms is None or now_ms < node.due_ms:
            continue
        nodes[step.name] = node_state(_SUCCEEDED, node.attempt, None, None, node.attempts_before)
        output = orjson.dumps({"slept_until_ms": node.due_ms}).decode()
        woke.append((step.name, node.attempt, output))
    return woke


def sleep_timers(
    old: RunState, nodes: Mapping[str, NodeState], wf: WorkflowDef, now_ms: int
) -> set[int]:
    """The wakeups of the sleeps this tick started (those within the ladder's horizon)."""
    timers = set()
    before = old.node_map() if wf.sleeps else {}
    for step in wf.sleeps:
        node = nodes[step.name]
        if node.status is not _DISPATCHED or node.due_ms is None:
            continue
        was = before.get(step.name)
        if was is not None and was.status is _DISPATCHED and was.attempt == node.attempt:
            continue  # started earlier: its timer was set then
        if node.due_ms - now_ms <= MAX_BACKOFF_MS:
            timers.add(node.due_ms)
    return timers


# ISO-8601 as a time to sleep until: a date, a time to the minute or finer, and a zone (a
# time without one names no instant).
_ISO = re.compile(
    r"(\d{4})-(\d{2})-(\d{2})[Tt ](\d{2}):(\d{2})(?::(\d{2})(?:[.,](\d{1,9}))?)?"
    r"(?:([Zz])|([+-])(\d{2}):?(\d{2}))"
)


def instant_ms(value: Any, what: str) -> int | str:
    """``value`` as epoch milliseconds: an integer (epoch ms, from 0 to the year 9999) or an
    ISO-8601 time with a zone (``2030-01-31T09:00:00Z``, ``...+02:00``); otherwise a string
    saying why it is no time (``what`` names where it came from)."""
    if isinstance(value, bool):
        return f"{what} is {value!r}: not a time"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if 0 <= value <= MAX_UNTIL_MS:
            return value
        return f"{what} is {value}: epoch milliseconds must be between 0 and {MAX_UNTIL_MS}"
    if isinstance(value, str):
        parsed = _iso_ms(value)
        if parsed is not None and 0 <= parsed <= MAX_UNTIL_MS:
            return parsed
        shown = value if len(value) <= 64 else value[:64] + "..."
        return (
            f"{what} is {shown!r}: not an ISO-8601 time with a zone"
            " (2030-01-31T09:00:00Z) nor epoch milliseconds"
        )
    return f"{what} is {_kind(value)}: not a time (an ISO-8601 string or epoch milliseconds)"


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value!r}"
    return "a list" if isinstance(value, list) else "an object"


def _iso_ms(text: str) -> int | None:
    found = _ISO.fullmatch(text)
    if found is None:
        return None
    year, month, day, hour, minute = (int(found[i]) for i in range(1, 6))
    second = int(found[6] or 0)
    millis = int((found[7] or "0").ljust(3, "0")[:3])
    if not (1 <= month <= 12 and 1 <= day <= _days_in(year, month)):
        return None
    if hour > 23 or minute > 59 or second > 59:
        return None
    offset = 0
    if found[8] is None:
        off_h, off_m = int(found[10]), int(found[11])
        if off_h > 23 or off_m > 59:
            return None
        offset = (off_h * 60 + off_m) * (1 if found[9] == "+" else -1)
    days = _days_from_civil(year, month, day)
    minutes = (days * 24 + hour) * 60 + minute - offset
    return (minutes * 60 + second) * 1000 + millis


def _days_in(year: int, month: int) -> int:
    if month == 2:
        leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
        return 29 if leap else 28
    return 30 if month in (4, 6, 9, 11) else 31


def _days_from_civil(year: int, month: int, day: int) -> int:
    """Days from 1970-01-01 to the date (proleptic Gregorian; H. Hinnant's algorithm)."""
    if month <= 2:
        year -= 1
    era = year // 400
    yoe = year - era * 400
    doy = (153 * (month + (-3 if month > 2 else 9)) + 2) // 5 + day - 1
    doe = yoe * 365 + yoe // 4 - yoe // 100 + doy
    return era * 146097 + doe - 719468


__all__ = [
    "MAX_UNTIL_MS",
    "Selected",
    "Settled",
    "instant_ms",
    "sleep_due",
    "sleep_timers",
    "start_sleep",
    "wake_sleeps",
]
