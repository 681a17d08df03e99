"""Commands about schedules (docs/usage.md#delayed-starts-and-schedules): schedules create,
list, pause, resume, trigger, delete. The processors fire them (io/postgres/schedules.py)."""

from __future__ import annotations

import argparse
from typing import Any

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError, json_argument, print_table
from processor.cli.grammar import emit, print_json, print_json_lines
from processor.client import connect, wake
from processor.core.routing import TIERS
from processor.io.config.settings import Settings
from processor.io.postgres.schedules import (
    Schedule,
    ScheduleError,
    create_schedule,
    cron_of,
    delete_schedule,
    list_schedules,
    pause_schedule,
    resume_schedule,
    trigger_schedule,
)
from processor.io.postgres.store import Definitions

# The columns of `schedules list`, and what each says: the table's header and its --help.
COLUMNS = (
    ("NAME", "the schedule; its runs are NAME@<fire time in UTC>"),
    ("CRON", "its expression (with --seconds when it has them), and its zone when not UTC"),
    ("WORKFLOW", "what it starts: the latest version, or vN when it names one"),
    ("NEXT FIRE", "when it fires next (ISO 8601 with its offset), or paused"),
    ("LAST RUN", "the run its latest fire started (- before its first)"),
    ("FIRES", "the runs its fires started"),
    ("MISSED", "fires more than a minute late (no processor ran) that were skipped"),
)


def _columns_help() -> str:
    width = max(len(name) for name, _ in COLUMNS)
    lines = [f"  {name.ljust(width)}  {text}" for name, text in COLUMNS]
    return "columns:\n" + "\n".join(lines) + "\n\n-o json gives every field, one schedule a line."


def register(sub: Any) -> None:
    schedules = sub.add_parser("schedules", help="start a workflow on a cron schedule")
    s_sub = schedules.add_subparsers(dest="schedules_command", required=True, metavar="ACTION")
    p = s_sub.add_parser(
        "create", help="a schedule: a run of WORKFLOW at each fire time of a cron expression"
    )
    p.add_argument("name", help="the schedule's name; its runs are named NAME@<fire time, UTC>")
    p.add_argument(
        "--cron",
        required=True,
        help="five fields, as cron has them (minute hour day-of-month month day-of-week), or"
        " @hourly/@daily/@weekly/@monthly/@yearly; never six (seconds go in --seconds)",
    )
    p.add_argument(
        "--seconds",
        help="the seconds of each minute the five fields match (e.g. */10, 0,30); default 0",
    )
    p.add_argument("--tz", default="UTC", help="the IANA time zone it reads in (default UTC)")
    p.add_argument("--workflow", required=True, help="the workflow each fire starts")
    p.add_argument("--version", type=int, help="this version (default: the latest at each fire)")
    p.add_argument(
        "--input",
        metavar="JSON|@FILE|-",
        help="each run's input: JSON, @FILE to read it from a file, or - from stdin",
    )
    p.add_argument("--tier", choices=TIERS, default="t1", help="the runs' wakeup tier")
    p.add_argument(
        "--catch-up",
        type=int,
        default=0,
        help="fires missed while no processor could fire them (more than a minute late) that"
        " still start a run, the latest first (default 0: skipped)",
    )
    p.set_defaults(func=cmd_schedules_create)
    p = s_sub.add_parser(
        "list",
        help="the schedules: next fire, last run, fires and misses",
        epilog=_columns_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(func=cmd_schedules_list)
    for action, text in (
        ("pause", "stop firing it (its runs go on)"),
        ("resume", "fire it again from its next fire after now"),
        ("trigger", "start a run of it now, by hand (NAME@manual-<now>)"),
        ("delete", "delete it (the runs it started stay)"),
    ):
        p = s_sub.add_parser(action, help=text)
        p.add_argument("name")
        p.set_defaults(func=_ACTIONS[action])


def cmd_schedules_create(settings: Settings, args: argparse.Namespace) -> int:
    run_input = json_argument("--input", args.input, {})
    with connect(settings) as conn:
        try:
            schedule = create_schedule(
                conn,
                Definitions(),
                args.name,
                args.cron,
                args.workflow,
                tz=args.tz,
                seconds=args.seconds,
                version=args.version,
                run_input=run_input,
                tier=args.tier,
                catch_up=args.catch_up,
            )
        except ScheduleError as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
    cron = cron_of(schedule)
    first = round(schedule.next_fire_at.timestamp() * 1000)
    fires = [cron.local(fire) for fire in cron.following(first, NEXT_FIRES)]
    if args.output == "json":
        print_json({**_json(schedule), "next_fires": [str(fire) for fire in fires]})
        return EXIT_OK
    print(f"schedule {schedule.name} created; its next {NEXT_FIRES} fires ({cron.tz}):")
    for fire in fires:
        print(f"  {fire}")
    return EXIT_OK


# How many fire times `schedules create` prints: enough to see the expression's rhythm.
NEXT_FIRES = 3


def cmd_schedules_list(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        schedules = list_schedules(conn)
    if args.output == "json":
        print_json_lines([_json(s) for s in schedules])
        return EXIT_OK
    if not schedules:
        print("no schedule (ductor schedules create NAME --cron EXPR --workflow W)")
        return EXIT_OK
    rows = [
        (
            s.name,
            _cron(s) + ("" if s.tz == "UTC" else f" ({s.tz})"),
            s.workflow + ("" if s.version is None else f" v{s.version}"),
            "paused" if s.paused_at else _when(s.next_fire_at),
            s.last_run_id or "-",
            str(s.fires),
            str(s.missed),
        )
        for s in schedules
    ]
    print_table(tuple(name for name, _ in COLUMNS), rows)
    return EXIT_OK


def _json(s: Schedule) -> dict[str, Any]:
    return {
        "name": s.name,
        "cron": s.cron,
        "seconds": s.seconds,
        "tz": s.tz,
        "workflow": s.workflow,
        "version": s.version,
        "input": s.input,
        "tier": s.tier,
        "catch_up": s.catch_up,
        "next_fire_at": None if s.paused_at else s.next_fire_at.isoformat(),
        "last_fired_at": s.last_fired_at.isoformat() if s.last_fired_at else None,
        "last_run_id": s.last_run_id,
        "fires": s.fires,
        "missed": s.missed,
        "paused": s.paused_at is not None,
    }


def _cron(s: Schedule) -> str:
    return s.cron + ("" if s.seconds is None else f" --seconds {s.seconds}")


def _when(moment: Any) -> str:
    return str(moment.isoformat(timespec="seconds"))


def cmd_schedules_pause(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        changed = _refusing(lambda: pause_schedule(conn, args.name))
    said = "paused" if changed else "was paused already"
    emit(args, {"name": args.name, "changed": changed}, f"schedule {args.name} {said}")
    return EXIT_OK


def cmd_schedules_resume(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        changed = _refusing(lambda: resume_schedule(conn, args.name))
    said = "resumed" if changed else "was not paused"
    emit(args, {"name": args.name, "changed": changed}, f"schedule {args.name} {said}")
    return EXIT_OK


def cmd_schedules_trigger(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        run_id, tier = _refusing(lambda: trigger_schedule(conn, Definitions(), args.name))
    wake(settings, [run_id], tier, "start")
    emit(args, {"name": args.name, "run_id": run_id}, run_id)
    return EXIT_OK


def cmd_schedules_delete(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        if not delete_schedule(conn, args.name):
            raise CliError(f"no schedule is named {args.name!r}")
    emit(args, {"name": args.name, "deleted": True}, f"schedule {args.name} deleted")
    return EXIT_OK


def _refusing(action: Any) -> Any:
    try:
        return action()
    except ScheduleError as exc:
        raise CliError(str(exc)) from None


_ACTIONS = {
    "pause": cmd_schedules_pause,
    "resume": cmd_schedules_resume,
    "trigger": cmd_schedules_trigger,
    "delete": cmd_schedules_delete,
}
