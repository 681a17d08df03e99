"""Schedules in Postgres (``eec_schedule``, migration 0014): created, listed, paused, resumed,
triggered and deleted by `ductor schedules` and the client, and fired by the processors' sweep
over the shards each owns (engine/watchdog.py), what core/schedules.py plans.

A fire is one transaction: the due schedule rows of the owned shards are locked without
waiting (SKIP LOCKED: a schedule another instance is firing is its), each one's runs are
inserted idempotently under run ids derived from the fire times, and its next fire written.
Two instances that fire one schedule at once (a rebalance moved its shard) start its runs once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import psycopg

from processor.core.bounds import json_problem
from processor.core.cron import Cron
from processor.core.model import UnknownWorkflow
from processor.core.routing import TIERS, run_shard
from processor.core.run_input import input_problem
from processor.core.schedules import (
    FirePlan,
    check_catch_up,
    check_schedule_name,
    fire_run_id,
    first_fire,
    manual_run_id,
    plan_fires,
)
from processor.core.shapes import RunRef
from processor.core.workflow_def import ValidationError, WorkflowDef
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.store import Definitions
from processor.io.runtime.faults import NO_FAULTS, Faults, Point
from processor.io.runtime.zones import zone_named

log = logging.getLogger("ductor.schedules")


class ScheduleError(ValueError):
    """A schedule cannot be made or changed as asked; the message says why."""


@dataclass(frozen=True)
class Schedule:
    """A schedule as `ductor schedules list` shows it."""

    name: str
    cron: str  # five fields, or a @ name
    seconds: str | None  # the seconds field (``*/10``); None: at second 0
    tz: str
    workflow: str
    version: int | None  # None: the latest at each fire
    input: Any
    tier: str
    catch_up: int
    next_fire_at: datetime
    last_fired_at: datetime | None
    last_run_id: str | None
    fires: int
    missed: int
    paused_at: datetime | None


_COLUMNS = """name, cron, seconds, tz, workflow_name, workflow_version, input, tier, catch_up,
              next_fire_at, last_fired_at, last_run_id, fires, missed, paused_at"""


def create_schedule(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    name: str,
    cron: str,
    workflow: str,
    *,
    tz: str = "UTC",
    seconds: str | None = None,
    version: int | None = None,
    run_input: Any = None,
    tier: str = "t1",
    catch_up: int = 0,
) -> Schedule:
    """A new schedule, its first fire the first after now (Postgres's clock). ScheduleError
    when the name is taken, the expression (six fields among others: core/cron.py), seconds,
    zone, tier or catch-up is wrong, the input is
    beyond the bounds of stored JSON (core/bounds.py), the workflow is not registered, or the
    input does not match its schema."""
    try:
        check_schedule_name(name)
        check_catch_up(catch_up)
        parsed = Cron(cron, zone_named(tz), seconds)
    except ValidationError as exc:
        raise ScheduleError(str(exc)) from None
    if tier not in TIERS:
        raise ScheduleError(f"tier must be one of {', '.join(TIERS)}, not {tier!r}")
    _check_input(run_input)
    wf = _workflow(conn, definitions, workflow, version)
    problem = input_problem(wf, run_input if run_input is not None else {})
    if problem is not None:
        raise ScheduleError(problem)
    now_ms = _now_ms(conn)
    row = conn.execute(
        f"""INSERT INTO eec_schedule (name, cron, seconds, tz, workflow_name, workflow_version,
                                      input, tier, catch_up, shard, next_fire_at)
            VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, to_timestamp(%s / 1000.0))
            ON CONFLICT (name) DO NOTHING RETURNING {_COLUMNS}""",
        (
            name,
            parsed.expression,
            seconds,
            tz,
            workflow,
            version,
            orjson.dumps(run_input if run_input is not None else {}).decode(),
            tier,
            catch_up,
            run_shard(name),
            first_fire(parsed, now_ms),
        ),
    ).fetchone()
    if row is None:
        raise ScheduleError(f"schedule {name!r} exists already: delete it first to change it")
    return _schedule(row)


def list_schedules(conn: psycopg.Connection[Any]) -> list[Schedule]:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM eec_schedule ORDER BY name").fetchall()
    return [_schedule(r) for r in rows]


def get_schedule(conn: psycopg.Connection[Any], name: str) -> Schedule:
    row = conn.execute(f"SELECT {_COLUMNS} FROM eec_schedule WHERE name = %s", (name,)).fetchone()
    if row is None:
        raise ScheduleError(f"no schedule is named {name!r}")
    return _schedule(row)


def pause_schedule(conn: psycopg.Connection[Any], name: str) -> bool:
    """Stop firing it; False when it was paused already."""
    get_schedule(conn, name)
    row = conn.execute(
        "UPDATE eec_schedule SET paused_at = now() WHERE name = %s AND paused_at IS NULL"
        " RETURNING name",
        (name,),
    ).fetchone()
    return row is not None


def resume_schedule(conn: psycopg.Connection[Any], name: str) -> bool:
    """Fire it again from its next fire after now (the fires while it was paused are not
    owed); False when it was not paused."""
    schedule = get_schedule(conn, name)
    if schedule.paused_at is None:
        return False
    next_fire = first_fire(cron_of(schedule), _now_ms(conn))
    conn.execute(
        "UPDATE eec_schedule SET paused_at = NULL, next_fire_at = to_timestamp(%s / 1000.0)"
        " WHERE name = %s",
        (next_fire, name),
    )
    return True


def delete_schedule(conn: psycopg.Connection[Any], name: str) -> bool:
    """Delete it (the runs it started stay); False when there was none."""
    row = conn.execute("DELETE FROM eec_schedule WHERE name = %s RETURNING name", (name,))
    return row.fetchone() is not None


def trigger_schedule(conn: psycopg.Connection[Any], definitions: Definitions, name: str) -> RunRef:
    """Start a run of the schedule now, by hand (paused or not; its own fires are not
    moved): the run id (``name@manual-<now>``) and its tier, for the caller to wake it."""
    schedule = get_schedule(conn, name)
    _check_input(schedule.input)  # a row written by hand, or before the bounds
    wf = _workflow(conn, definitions, schedule.workflow, schedule.version)
    run_id = manual_run_id(name, _now_ms(conn))
    insert_runs(conn, wf, [(run_id, schedule.input)], schedule.tier, tags=schedule_tags(name))
    return run_id, schedule.tier


def schedule_tags(name: str) -> dict[str, str]:
    """The tags of a run a schedule started: `ductor runs list --tag schedule=NAME`."""
    return {"schedule": name}


_DUE = """
SELECT name, cron, seconds, tz, workflow_name, workflow_version, input, tier, catch_up,
       (extract(epoch FROM next_fire_at) * 1000)::bigint,
       (extract(epoch FROM now()) * 1000)::bigint
  FROM eec_schedule
 WHERE paused_at IS NULL AND next_fire_at <= now()
   AND shard %% %(modulus)s = ANY(%(shards)s)
 ORDER BY next_fire_at LIMIT %(limit)s
   FOR UPDATE SKIP LOCKED
"""

_FIRED = """
UPDATE eec_schedule
   SET next_fire_at = to_timestamp(%(next)s / 1000.0),
       last_fired_at = CASE WHEN %(fired)s > 0 THEN now() ELSE last_fired_at END,
       last_run_id = coalesce(%(last_run)s, last_run_id),
       fires = fires + %(fired)s, missed = missed + %(missed)s
 WHERE name = %(name)s
"""


def fire_due(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    modulus: int,
    shards: Sequence[int],
    limit: int,
    faults: Faults = NO_FAULTS,
    unexpected: Callable[[str, Exception], None] | None = None,
) -> list[RunRef]:
    """Fire the due schedules of the given shards, in one transaction: the runs started
    (created now, or by an instance that fired the same fire first), each with its tier,
    for the caller to wake. A schedule that cannot fire (its workflow is gone, its input no
    longer matches the latest version's schema, its row was written by hand) is logged and
    moved to its next fire, in a savepoint of its own: one bad schedule never stops the
    others. So is one whose fire raised what nobody foresaw (an input that cannot be encoded,
    a bug), handed to ``unexpected`` (the sweep's log and count) rather than only logged."""
    params = {"modulus": modulus, "shards": list(shards), "limit": limit}
    to_wake: list[RunRef] = []
    with conn.transaction():
        for row in conn.execute(_DUE, params).fetchall():
            name = row[0]
            try:
                with conn.transaction():
                    faults.hit(Point.SWEEP, name)
                    to_wake += _fire(conn, definitions, row)
            except (ScheduleError, ValidationError, psycopg.DataError) as exc:
                log.error("schedule %s cannot fire: %s", name, exc, extra={"schedule": name})
                _advance(conn, name, FirePlan((), 0, int(row[-1]) + _RETRY_MS), None)
            except psycopg.Error:
                raise  # the database's: the sweep reports it
            except Exception as unforeseen:
                if unexpected is None:
                    raise
                unexpected(f"schedule {name}", unforeseen)
                _advance(conn, name, FirePlan((), 0, int(row[-1]) + _RETRY_MS), None)
    return to_wake


# A schedule that could not fire is tried again this much later.
_RETRY_MS = 60_000


def _fire(
    conn: psycopg.Connection[Any], definitions: Definitions, row: Sequence[Any]
) -> list[RunRef]:
    name, cron, seconds, tz, workflow, version, run_input, tier, catch_up, next_ms, now_ms = row
    plan = plan_fires(Cron(cron, zone_named(tz), seconds), next_ms, now_ms, catch_up)
    if plan.missed:
        log.warning(
            "schedule %s: %d fire(s) missed (more than a minute late) and skipped",
            name,
            plan.missed,
            extra={"schedule": name, "missed": plan.missed},
        )
    run_ids = [fire_run_id(name, fire) for fire in plan.fires]
    if run_ids:
        _check_input(run_input)  # a row written by hand, or before the bounds
        wf = _workflow(conn, definitions, workflow, version)
        problem = input_problem(wf, run_input)
        if problem is not None:
            raise ScheduleError(problem)
        insert_runs(
            conn, wf, [(run_id, run_input) for run_id in run_ids], tier, tags=schedule_tags(name)
        )
    _advance(conn, name, plan, run_ids[-1] if run_ids else None)
    return [(run_id, tier) for run_id in run_ids]


def _advance(
    conn: psycopg.Connection[Any], name: str, plan: FirePlan, last_run: str | None
) -> None:
    conn.execute(
        _FIRED,
        {
            "name": name,
            "next": plan.next_fire_ms,
            "fired": len(plan.fires),
            "missed": plan.missed,
            "last_run": last_run,
        },
    )


def _check_input(run_input: Any) -> None:
    problem = json_problem(run_input)
    if problem is not None:
        raise ScheduleError(problem.describe("the input"))


def _workflow(
    conn: psycopg.Connection[Any], definitions: Definitions, name: str, version: int | None
) -> WorkflowDef:
    try:
        if version is None:
            return definitions.latest(conn, name)
        return definitions.get(conn, (name, version))
    except UnknownWorkflow as exc:
        raise ScheduleError(str(exc)) from None


def _now_ms(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def _schedule(row: Sequence[Any]) -> Schedule:
    return Schedule(*row)


def cron_of(schedule: Schedule) -> Cron:
    """A stored schedule's expression, parsed; ScheduleError for one that cannot be (a row
    written by hand)."""
    try:
        return Cron(schedule.cron, zone_named(schedule.tz), schedule.seconds)
    except ValidationError as exc:
        raise ScheduleError(f"schedule {schedule.name!r}: {exc}") from None
