"""Commands about triggers (docs/requests.md#triggers): triggers create, list, delete."""

from __future__ import annotations

import argparse
import sys

import orjson
from confluent_kafka import KafkaException

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError
from processor.cli.grammar import emit, print_json_lines
from processor.client import connect
from processor.core.model import UnknownWorkflow
from processor.core.routing import TopicNames
from processor.core.triggers import Trigger, parse_trigger
from processor.io.config.settings import Settings
from processor.io.kafka.topics import topic_end_offsets
from processor.io.postgres.store import Definitions
from processor.io.postgres.trigger_store import (
    TriggerConflict,
    create_trigger,
    delete_trigger,
    list_triggers,
)


def cmd_triggers_create(settings: Settings, args: argparse.Namespace) -> int:
    trigger = _trigger_from(args)
    if TopicNames(settings.topic_prefix).source_of(trigger.topic) != "trigger":
        raise CliError(
            f"{trigger.topic} is one of Ductor's own topics, not a source topic", EXIT_USAGE
        )
    try:
        ends = topic_end_offsets(settings, trigger.topic)
    except ValueError as exc:  # no such topic: the team's to create, with its own settings
        raise CliError(
            f"{exc}: create it first, with the partitions and retention your producers need"
            f" (e.g. kafka-topics.sh --bootstrap-server {settings.bootstrap_servers}"
            f" --create --topic {trigger.topic} --partitions 3), then create the trigger"
            " again; with --from-beginning it also reads what was written before",
            EXIT_USAGE,
        ) from None
    except KafkaException as exc:
        raise CliError(f"cannot read topic {trigger.topic}: {exc}") from None
    start = {} if args.from_beginning else ends
    with connect(settings) as conn:
        if trigger.action == "start":
            try:
                if trigger.workflow_version is None:
                    Definitions().latest(conn, trigger.workflow)
                else:
                    Definitions().get(conn, (trigger.workflow, trigger.workflow_version))
            except UnknownWorkflow as exc:
                raise CliError(
                    f"{exc}: register it first (ductor workflows register)", EXIT_USAGE
                ) from None
        try:
            new = create_trigger(conn, trigger, start)
        except TriggerConflict as exc:
            raise CliError(str(exc)) from None
    document = {"name": trigger.name, "new": new}
    if not new:
        emit(args, document, f"trigger {trigger.name} exists already, the same")
        return EXIT_OK
    where = "its first records" if args.from_beginning else "the records written from now on"
    text = f"trigger {trigger.name} created: {trigger.action}s from {trigger.topic}, {where}"
    emit(args, document, text)
    return EXIT_OK


def _trigger_from(args: argparse.Namespace) -> Trigger:
    """The trigger the flags describe, checked as the processors read it (exit 2 if wrong)."""
    raw: dict[str, object] = {
        "trigger_version": 1,
        "topic": args.topic,
        "action": "signal" if args.signal else "start",
        "run_id": args.run_id or ("$.run_id" if args.signal else "position"),
        "input": args.input or "$",
    }
    if args.signal:
        if args.workflow or args.version or args.tier:
            raise CliError("--signal takes no --workflow, --version or --tier", EXIT_USAGE)
        raw["signal"] = args.signal
    else:
        if not args.workflow:
            raise CliError("a trigger starts runs of --workflow, or sends --signal", EXIT_USAGE)
        raw |= {"workflow": args.workflow, "tier": args.tier or "t1"}
        if args.version is not None:
            raw["workflow_version"] = args.version
    if args.run_id_prefix:
        raw["run_id_prefix"] = args.run_id_prefix
    if args.filter:
        path, sep, text = args.filter.partition("=")
        if not sep:
            raise CliError("--filter is PATH=VALUE, as in '$.type=order_placed'", EXIT_USAGE)
        try:
            equals = orjson.loads(text)
        except orjson.JSONDecodeError:
            equals = text  # a bare word is a string
        raw["filter"] = {"path": path, "equals": equals}
    try:
        return parse_trigger(args.name, raw)
    except ValueError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None


def cmd_triggers_list(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        stored = list_triggers(conn)
    if args.output == "json":
        print_json_lines(
            [{"name": t.name, "definition": t.definition, "problem": t.problem} for t in stored]
        )
        return EXIT_OK
    for t in stored:
        if t.trigger is None:
            print(f"{t.name}  UNREADABLE ({t.problem})  {orjson.dumps(t.definition).decode()}")
            continue
        tr = t.trigger
        does = f"start {tr.workflow}" if tr.action == "start" else f"signal {tr.signal}"
        if tr.action == "start" and tr.workflow_version is not None:
            does += f" v{tr.workflow_version}"
        extra = (
            f"  filter {tr.filter.path.text}={orjson.dumps(tr.filter.equals).decode()}"
            if tr.filter
            else ""
        )
        print(
            f"{tr.name}  {tr.topic}  {does}  run id {tr.run_id_prefix}{{{tr.run_id.text}}}"
            f"  input {tr.input.text}{extra}"
        )
    print(f"{len(stored)} trigger(s)", file=sys.stderr)
    return EXIT_OK


def cmd_triggers_delete(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        deleted = delete_trigger(conn, args.name)
    if not deleted:
        raise CliError(f"there is no trigger {args.name!r}")
    text = f"trigger {args.name} deleted: the processors let its topic go within seconds"
    emit(args, {"name": args.name, "deleted": True}, text)
    return EXIT_OK


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    triggers = sub.add_parser("triggers", help="map the records of your own topics to runs")
    actions = triggers.add_subparsers(dest="triggers_command", required=True, metavar="ACTION")
    p = actions.add_parser(
        "create",
        help="start (or signal) a run for each record of a topic; from the records written"
        " after it is created",
    )
    p.add_argument("name", help="the trigger's name (letters, digits, . _ -)")
    p.add_argument("--topic", required=True, help="the source topic (it must exist)")
    p.add_argument("--workflow", help="start runs of this workflow")
    p.add_argument("--version", type=int, help="of this version (default: the latest)")
    p.add_argument("--tier", choices=("t0", "t1", "t2"), help="the runs' wakeup tier (t1)")
    p.add_argument(
        "--signal",
        metavar="NAME",
        help="send this signal instead of starting: cancel, or one a wait step waits for (its"
        " payload: what --input picks)",
    )
    p.add_argument(
        "--run-id",
        metavar="SOURCE",
        help="where the run id comes from: a JSON path into the value ($.order_id),"
        " header:NAME, key, or position (one run per record; the default for a start;"
        " a signal's default is $.run_id)",
    )
    p.add_argument(
        "--run-id-prefix",
        default="",
        help="put before each run id: the trigger reaches only the runs whose ids begin with it"
        " (required with --signal)",
    )
    p.add_argument(
        "--input",
        metavar="PATH",
        help="the JSON path of the run's input (a signal's payload) in the value; default $,"
        " the whole value",
    )
    p.add_argument(
        "--filter",
        metavar="PATH=VALUE",
        help="only records whose value has VALUE (JSON, or a bare word) at PATH",
    )
    p.add_argument(
        "--from-beginning",
        action="store_true",
        help="read the topic from its first records, not only those written from now on",
    )
    p.set_defaults(func=cmd_triggers_create)
    p = actions.add_parser("list", help="the triggers, one line each")
    p.set_defaults(func=cmd_triggers_list)
    p = actions.add_parser("delete", help="delete a trigger (its runs stay)")
    p.add_argument("name")
    p.set_defaults(func=cmd_triggers_delete)
