"""Schedules: a workflow started at each fire time of a cron expression (core/cron.py). Which
fires a processor's sweep starts runs for, and under which run ids; pure, the clock comes in.

Rules:

1. A fire's run id is the schedule's name and the fire time in UTC
   (``nightly@2026-12-04T02:00:00Z``): however many instances fire a schedule at once, and
   however often one fires it again after a crash, a fire is one run (its insert is
   idempotent).
2. A fire at most ``ON_TIME_MS`` late is on time and starts its run, however many there are
   (a processor busy for 30 s starts the 30 fires of an every-second schedule it owed).
3. Older fires were missed (every processor was down, or the schedule's shard had no owner):
   ``catch_up`` of them, the latest, still start their runs; the others are counted as missed
   and skipped. ``catch_up`` 0 skips them all.
4. The schedule's next fire is the first after the sweep's time: a fire is never planned twice.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from processor.core.cron import Cron, iso_utc
from processor.core.envelope import MAX_RUN_ID_LENGTH
from processor.core.workflow_def import ValidationError

# A fire this late (or less) is on time; an older one was missed (rule 3).
ON_TIME_MS = 60_000
# Missed fires are counted up to this many (an every-second schedule down a week has missed
# 604,800: "at least 10,000" says enough).
MISSED_COUNT_LIMIT = 10_000
# How many runs one schedule may start in one sweep (catch-up included).
MAX_CATCH_UP = 1_000

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def check_schedule_name(name: str) -> str:
    """``name`` if it can name a schedule (and prefix its runs' ids), else ValidationError."""
    if not _NAME.fullmatch(name):
        raise ValidationError(
            f"schedule name {name!r}: 1 to 100 letters, digits, '_', '.' or '-', starting with"
            " a letter or digit"
        )
    return name


def check_catch_up(catch_up: int) -> int:
    if not 0 <= catch_up <= MAX_CATCH_UP:
        raise ValidationError(f"catch_up must be between 0 and {MAX_CATCH_UP}, not {catch_up}")
    return catch_up


def fire_run_id(schedule: str, fire_ms: int) -> str:
    """The run id of a schedule's fire (rule 1)."""
    run_id = f"{schedule}@{iso_utc(fire_ms)}"
    assert len(run_id) <= MAX_RUN_ID_LENGTH
    return run_id


def manual_run_id(schedule: str, at_ms: int) -> str:
    """The run id of a fire asked for by hand (``ductor schedules trigger``) at ``at_ms``."""
    return f"{schedule}@manual-{iso_utc(at_ms)}"


class FirePlan(NamedTuple):
    """What a sweep does with a due schedule."""

    fires: tuple[int, ...]  # fire times to start a run for (epoch ms), oldest first
    missed: int  # fires skipped as missed (at most MISSED_COUNT_LIMIT counted)
    next_fire_ms: int  # the schedule's next fire, after the sweep's time


def plan_fires(cron: Cron, next_fire_ms: int, now_ms: int, catch_up: int) -> FirePlan:
    """The fires of a schedule whose next fire was ``next_fire_ms``, at ``now_ms``."""
    if next_fire_ms > now_ms:
        return FirePlan((), 0, next_fire_ms)
    on_time_from = now_ms - ON_TIME_MS
    on_time: list[int] = []
    fire = max(next_fire_ms, cron.next_after(on_time_from - 1))  # the first on time
    while fire <= now_ms:
        on_time.append(fire)
        fire = cron.next_after(fire)
    following = fire
    missed_fires = _missed(cron, next_fire_ms, on_time_from, catch_up)
    caught = missed_fires[-catch_up:] if catch_up else []
    skipped = len(missed_fires) - len(caught)
    if len(missed_fires) >= MISSED_COUNT_LIMIT:
        skipped = max(skipped, MISSED_COUNT_LIMIT)
    return FirePlan((*caught, *on_time), skipped, following)


def _missed(cron: Cron, first_ms: int, on_time_from: int, catch_up: int) -> list[int]:
    """The fires from ``first_ms`` up to (not including) the on-time window, oldest first:
    every one while there are at most MISSED_COUNT_LIMIT of them; past that, the latest
    ``catch_up`` and enough older ones to say the count reached the limit."""
    found: list[int] = []
    fire = first_ms
    while fire < on_time_from and len(found) < MISSED_COUNT_LIMIT:
        found.append(fire)
        fire = cron.next_after(fire)
    if fire >= on_time_from or not catch_up:
        return found
    # More than the limit: the latest ``catch_up`` are found walking back from the window.
    latest: list[int] = []
    fire = cron.previous_before(on_time_from)
    while fire >= first_ms and len(latest) < catch_up:
        latest.append(fire)
        fire = cron.previous_before(fire)
    return found[: MISSED_COUNT_LIMIT - len(latest)] + latest[::-1]


def first_fire(cron: Cron, now_ms: int) -> int:
    """A new (or resumed) schedule's next fire: the first after ``now_ms``."""
    return cron.next_after(now_ms)


def describe_fire(cron: Cron, fire_ms: int) -> str:
    """A fire time for people: UTC, and the schedule's own zone when it has another."""
    return iso_utc(fire_ms) + ("" if cron.tz == "UTC" else f" ({cron.tz})")
