"""Commands about workflow definitions: workflows register (a JSON file, or a workflow written
in Python: processor/authoring.py, whose module's text is kept with it), list and show (the
definition, or with ``--source`` the Python it was registered from)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import KafkaException

from processor.authoring import Workflow
from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError
from processor.cli.grammar import emit, print_json, print_json_lines
from processor.cli.workers import warn_unserved
from processor.client import connect
from processor.core.child_graph import ChildCycle
from processor.core.model import UnknownWorkflow
from processor.core.routing import DEFAULT_QUEUE, TopicNames
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import ValidationError, WorkflowDef
from processor.core.workflow_source import WorkflowSource
from processor.io.config.settings import Settings
from processor.io.kafka.topics import create_topics
from processor.io.postgres.store import Definitions
from processor.io.postgres.workflows import (
    WorkflowVersion,
    register_workflow,
    stored_version,
    workflow_versions,
)
from processor.io.runtime.module_source import module_source
from processor.io.shipped.workflow_schema import WorkflowSchemaError, check_workflow_document
from processor.worker.app import AppError, load_attribute


def register(sub: Any) -> None:
    workflows = sub.add_parser("workflows", help="manage workflow definitions")
    wf_sub = workflows.add_subparsers(dest="workflows_command", required=True, metavar="ACTION")
    p = wf_sub.add_parser(
        "register",
        help="validate and register workflow definitions: a JSON file, or MODULE:ATTR naming a"
        " Workflow written in Python (a list of them, or a definition)",
    )
    p.add_argument(
        "source",
        metavar="FILE|MODULE:ATTR",
        help="the workflow JSON (see schemas/workflow.schema.json), or e.g. my_app.flows:checkout",
    )
    p.set_defaults(func=cmd_workflows_register)
    p = wf_sub.add_parser("list", help="the registered workflows: each version, its steps")
    p.set_defaults(func=cmd_workflows_list)
    p = wf_sub.add_parser(
        "show", help="print a registered definition as JSON, or the Python it came from"
    )
    p.add_argument("name", help="the workflow's name")
    p.add_argument("--version", type=int, help="this version (default: the latest)")
    p.add_argument(
        "--source",
        action="store_true",
        help="print the text of the Python module the version was last registered from instead"
        " (with -o json: its module, text and when it was kept); exit 1 if it was registered"
        " from JSON only",
    )
    p.set_defaults(func=cmd_workflows_show)


def cmd_workflows_register(settings: Settings, args: argparse.Namespace) -> int:
    definitions = _definitions_from(args.source)
    with connect(settings) as conn:
        news = []
        for wf, source in definitions:
            try:
                news.append(register_workflow(conn, wf, source))
            except ChildCycle as exc:  # the definition itself cannot be registered: usage
                raise CliError(str(exc), EXIT_USAGE) from None
            except ValueError as exc:
                raise CliError(str(exc)) from None
    for (wf, _), new in zip(definitions, news, strict=True):
        said = "registered" if new else "already registered"
        document = {"name": wf.name, "version": wf.version, "new": new}
        emit(args, document, f"workflow {wf.name} v{wf.version} {said}")
        _ensure_queue_topics(settings, wf)
    warn_unserved(settings, [wf for wf, _ in definitions])
    return EXIT_OK


def _definitions_from(source: str) -> list[tuple[WorkflowDef, WorkflowSource | None]]:
    """The definitions a file or a MODULE:ATTR holds, each validated (exit 2 if one is not),
    with the text of the module that created each ``Workflow`` (none for JSON, or a bare
    definition): an existing path is read as JSON; otherwise ``source`` is imported as
    ``worker --app`` imports its steps."""
    path = Path(source)
    if path.exists() or source.endswith(".json") or ":" not in source:
        return [(_definition_from_file(path), None)]
    try:
        target = load_attribute(source, "workflows register", "my_app.flows:checkout")
    except AppError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    items = list(target) if isinstance(target, (list, tuple)) else [target]
    if not items:
        raise CliError(f"{source} is an empty list: no workflow to register", EXIT_USAGE)
    found: list[tuple[WorkflowDef, WorkflowSource | None]] = []
    for item in items:
        if isinstance(item, Workflow):
            try:
                found.append((item.definition(), module_source(item.defined_in)))
            except ValidationError as exc:
                raise CliError(f"{source}: {exc}", EXIT_USAGE) from None
        elif isinstance(item, WorkflowDef):
            found.append((item, None))
        else:
            raise CliError(
                f"{source} holds a {type(item).__name__}, not a Workflow (processor.Workflow)",
                EXIT_USAGE,
            )
    return found


def _definition_from_file(path: Path) -> WorkflowDef:
    try:
        raw = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}", EXIT_USAGE) from None
    try:
        check_workflow_document(raw)
        return parse_workflow(raw)
    except (WorkflowSchemaError, ValidationError) as exc:
        raise CliError(f"{path}: {exc}", EXIT_USAGE) from None


def _ensure_queue_topics(settings: Settings, wf: WorkflowDef) -> None:
    """A workflow that names a queue gets its steps topic at once: the coordinator would
    otherwise dispatch its steps to a topic that does not exist. Unreachable broker: said,
    with the command that does it later."""
    queues = [q for q in wf.queues if q != DEFAULT_QUEUE]
    if not queues:
        return
    try:
        report = create_topics(settings, timeout_s=15.0, queues=queues)
    except (KafkaException, RuntimeError) as exc:
        print(
            f"the steps topics of queue(s) {', '.join(queues)} were not created ({exc});"
            " run `ductor topics create` before starting runs",
            file=sys.stderr,
        )
        return
    names = TopicNames(settings.topic_prefix)
    for queue in queues:
        print(f"queue {queue}: topic {names.steps_for(queue)} {report[names.steps_for(queue)]}")


def cmd_workflows_list(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings) as conn:
        versions = workflow_versions(conn)
    if args.output == "json":
        print_json_lines([_version_json(v) for v in versions])
        return EXIT_OK
    if not versions:
        print("no workflow is registered (ductor workflows register FILE|MODULE:ATTR)")
        return EXIT_OK
    width = max(len("NAME"), *(len(v.name) for v in versions))
    print(f"{'NAME':<{width}}  VERSION  REGISTERED                 STEPS")
    for v in versions:
        registered = v.registered_at.isoformat(timespec="seconds")
        print(f"{v.name:<{width}}  {v.version:>7}  {registered:<25}  {', '.join(v.steps)}")
    return EXIT_OK


def _version_json(v: WorkflowVersion) -> dict[str, Any]:
    return {
        "name": v.name,
        "version": v.version,
        "registered_at": v.registered_at.isoformat(),
        "steps": list(v.steps),
    }


def cmd_workflows_show(settings: Settings, args: argparse.Namespace) -> int:
    definitions = Definitions()
    with connect(settings) as conn:
        try:
            if args.version is None:
                wf = definitions.latest(conn, args.name)
            else:
                wf = definitions.get(conn, (args.name, args.version))
        except UnknownWorkflow as exc:
            raise CliError(str(exc), EXIT_USAGE) from None
        if args.source:
            return _show_source(conn, wf, args)
    if args.output == "json":
        print_json(workflow_to_json(wf))  # one line: the same document
        return EXIT_OK
    print(orjson.dumps(workflow_to_json(wf), option=orjson.OPT_INDENT_2).decode())
    return EXIT_OK


def _show_source(conn: psycopg.Connection[Any], wf: WorkflowDef, args: argparse.Namespace) -> int:
    """The Python the version was last registered from: its text as it is (text), or a
    document with its module and when it was kept (JSON: ``source`` null when there is none);
    exit 1 when there is none (registered from JSON only)."""
    stored = stored_version(conn, wf.name, wf.version)
    kept = None if stored is None else stored.source
    if args.output == "json":
        document: dict[str, Any] = {"name": wf.name, "version": wf.version, "source": None}
        if kept is not None:
            document["source"] = {
                "module": kept.module,
                "text": kept.text,
                "kept_at": kept.kept_at.isoformat(),
            }
        print_json(document)
    elif kept is not None:
        sys.stdout.write(kept.text)
    if kept is None:
        raise CliError(
            f"workflow {wf.name!r} version {wf.version} was registered from JSON: no Python"
            " source is kept (`ductor workflows register MODULE:WORKFLOW` keeps it)"
        )
    return EXIT_OK
