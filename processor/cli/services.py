"""Commands that set up and run the services: migrate, topics create, process, worker."""

from __future__ import annotations

import argparse
import re
import sys
import threading
from typing import Any

import psycopg

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError, stop_on_signals
from processor.cli.grammar import emit, print_json_lines
from processor.client import ClientError, connect
from processor.engine.processor import Processor
from processor.io.config.otel import otel_settings
from processor.io.config.settings import Settings
from processor.io.config.values import ConfigError
from processor.io.kafka.clients import check_authentication
from processor.io.kafka.errors import KafkaAuthError
from processor.io.kafka.topics import create_topics
from processor.io.postgres.migrate import migrate
from processor.io.postgres.workflows import registered_queues
from processor.io.runtime.exit_codes import EXIT_KAFKA_FATAL
from processor.io.runtime.faults import Faults, Point, skew_wall_clock
from processor.worker.app import AppError, registry_for
from processor.worker.environment import scrub_secrets
from processor.worker.options import WorkerOptions
from processor.worker.worker import Worker

# What the services print is their log (DUCTOR_LOG_FORMAT=json for JSON lines).
_LOGS = "a service logs; DUCTOR_LOG_FORMAT=json makes its log JSON lines"


def register_setup(sub: Any) -> None:
    """`ductor migrate` and `ductor topics create`."""
    p = sub.add_parser(
        "migrate", help="apply the SQL migrations the package ships (schemas/migrations)"
    )
    p.set_defaults(func=cmd_migrate)
    topics = sub.add_parser("topics", help="manage the Kafka topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    p = topics_sub.add_parser(
        "create",
        help="create every topic idempotently (partitions from config), with a steps topic"
        " for each queue the registered workflows name",
    )
    p.add_argument(
        "--queue", metavar="Q[,Q...]", help="steps topics of these queues too (not registered yet)"
    )
    p.set_defaults(func=cmd_topics_create)


def register_services(sub: Any) -> None:
    """`ductor process` and `ductor worker`: they run until SIGTERM or SIGINT."""
    p = sub.add_parser("process", help="run one coordinator instance until SIGTERM/SIGINT")
    p.set_defaults(func=cmd_process, handles_signals=True, json_refused=_LOGS)
    p = sub.add_parser(
        "worker", help="run a step worker with your step functions (--app) or the sample ones"
    )
    _worker_arguments(p)
    p.set_defaults(func=cmd_worker, handles_signals=True, json_refused=_LOGS)


def _worker_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--concurrency",
        "--threads",
        type=int,
        default=8,
        help="most step functions running at once (plain ones each on a thread of its own)",
    )
    p.add_argument(
        "--prefetch",
        type=int,
        default=None,
        metavar="N",
        help="most tasks held waiting to run (read, claimed, waiting for a slot)"
        " (default: 16 per slot, at least 512)",
    )
    p.add_argument(
        "--queue",
        default="default",
        metavar="Q[,Q...]",
        help="the queues to serve (a step names its queue; default: default)",
    )
    p.add_argument(
        "--isolation",
        choices=("thread", "process"),
        default="thread",
        help="run steps in the worker's threads, or each slot in a child process that a hung"
        " or crashing step takes down alone (default: thread)",
    )
    p.add_argument(
        "--abandon-after",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a step still running this long past its deadline is abandoned (default: 5)",
    )
    p.add_argument(
        "--max-abandoned",
        type=int,
        default=None,
        metavar="N",
        help="abandoned steps still running past which the worker stops with exit code 5"
        " (default: the concurrency)",
    )
    p.add_argument(
        "--crash-reruns",
        type=int,
        default=1,
        metavar="N",
        help="how many more times an attempt runs (in a child process of its own) after the"
        " worker running it died, before it fails (default: 1)",
    )
    p.add_argument(
        "--app",
        metavar="MODULE:ATTRIBUTE",
        help="the StepRegistry to run, e.g. my_package.steps:registry (the current directory"
        " is importable); default: the sample step functions",
    )


def cmd_migrate(settings: Settings, args: argparse.Namespace) -> int:
    with connect(settings):
        pass
    applied = migrate(settings.pg_dsn)
    text = "applied: " + ", ".join(applied) if applied else "schema is up to date"
    emit(args, {"applied": applied}, text)
    return EXIT_OK


def cmd_topics_create(settings: Settings, args: argparse.Namespace) -> int:
    """The topics, with a steps topic for every queue the registered workflows name (when
    the database answers) and every ``--queue``."""
    queues = set(_queue_names(args.queue or ""))
    try:
        with connect(settings) as conn:
            queues.update(registered_queues(conn))
    except (ClientError, psycopg.Error) as exc:
        print(f"(the queues of registered workflows were not read: {exc})", file=sys.stderr)
    report = create_topics(settings, queues=sorted(queues))
    if args.output == "json":
        print_json_lines([{"topic": topic, "state": state} for topic, state in report.items()])
        return EXIT_OK
    for topic, state in report.items():
        print(f"{topic:32} {state}")
    return EXIT_OK


def _test_faults(settings: Settings) -> Faults:
    """The fault points DUCTOR_TEST_FAULTS arms (tests only: io/runtime/faults.py)."""
    try:
        return Faults.from_spec(settings.test_faults)
    except ValueError as exc:
        raise ConfigError(f"DUCTOR_TEST_FAULTS: {exc}") from None


def cmd_process(settings: Settings, args: argparse.Namespace) -> int:
    otel_settings()  # bad OTEL_* values stop the command before anything connects
    faults = _test_faults(settings)
    skew_wall_clock(settings.test_clock_ahead_ms)
    requested = threading.Event()
    stop_on_signals(requested.set)  # a SIGTERM while starting is kept, not a hard kill
    faults.hit(Point.STARTING)
    _check_kafka_credentials(settings)
    processor = Processor(settings, faults=faults)
    stop_on_signals(processor.stop, settings.shutdown_timeout_s)
    if requested.is_set():
        processor.stop()  # run() then shuts down at once, cleanly
    processor.run()
    faults.hit(Point.STOPPED)
    return EXIT_KAFKA_FATAL if processor.client_errors.fatal is not None else EXIT_OK


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    options = worker_options(args)
    otel_settings()  # bad OTEL_* values stop the command before anything connects
    # The settings are read: the secrets leave the environment before the steps module is
    # imported, so step code (a thread's, a child process's) never finds them there.
    scrub_secrets()
    # The registry first: a wrong --app is a usage error, reported before any connection.
    try:
        registry = registry_for(args.app)
    except AppError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
    faults = _test_faults(settings)
    skew_wall_clock(settings.test_clock_ahead_ms)
    requested = threading.Event()
    stop_on_signals(requested.set)  # a SIGTERM while starting is kept, not a hard kill
    _check_kafka_credentials(settings)
    worker = Worker(settings, registry, options, faults=faults)
    stop_on_signals(worker.stop, settings.shutdown_timeout_s)
    if requested.is_set():
        worker.stop()
    worker.run()
    faults.hit(Point.STOPPED)
    return worker.exit_code


def worker_options(args: argparse.Namespace) -> WorkerOptions:
    """The worker's flags as its options, or CliError (exit 2) saying which flag is wrong."""
    queues = _queue_names(args.queue)
    try:
        return WorkerOptions(
            concurrency=args.concurrency,
            prefetch=args.prefetch,
            queues=queues,
            isolation=args.isolation,
            abandon_after_s=args.abandon_after,
            max_abandoned=args.max_abandoned,
            crash_reruns=args.crash_reruns,
            app=args.app,
        )
    except ValueError as exc:
        raise CliError(f"ductor worker: {exc}", EXIT_USAGE) from None


def _queue_names(text: str) -> tuple[str, ...]:
    """``--queue a,b``: the names, or CliError (exit 2) naming one that is not a queue."""
    queues = tuple(q.strip() for q in text.split(",") if q.strip())
    for queue in queues:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,100}", queue):
            raise CliError(
                f"--queue: {queue!r} is not a queue name (letters, digits, '_', '-')", EXIT_USAGE
            )
    return queues


def _check_kafka_credentials(settings: Settings) -> None:
    """Refused credentials stop a long-running command at once, with exit code 2: its Kafka
    clients would otherwise retry them forever without saying so."""
    try:
        check_authentication(settings)
    except KafkaAuthError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
