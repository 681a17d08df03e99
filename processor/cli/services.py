"""Commands that set up and run the services: migrate, topics create, process, worker."""

from __future__ import annotations

import argparse
import threading

from processor.cli.common import EXIT_OK, EXIT_USAGE, CliError, stop_on_signals
from processor.cli.worker_app import load_registry
from processor.client import connect
from processor.engine.faults import Faults, Point
from processor.engine.processor import Processor
from processor.engine.worker import Worker, sample_registry
from processor.io.config import ConfigError, Settings
from processor.io.kafka import KafkaAuthError, check_authentication
from processor.io.migrate import migrate
from processor.io.topics import create_topics


def cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    with connect(settings):
        pass
    applied = migrate(settings.pg_dsn)
    print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return EXIT_OK


def cmd_topics_create(settings: Settings, _args: argparse.Namespace) -> int:
    report = create_topics(settings)
    for topic, state in report.items():
        print(f"{topic:32} {state}")
    return EXIT_OK


def cmd_process(settings: Settings, args: argparse.Namespace) -> int:
    try:
        faults = Faults.from_spec(settings.test_faults)
    except ValueError as exc:
        raise ConfigError(f"DUCTOR_TEST_FAULTS: {exc}") from None
    requested = threading.Event()
    stop_on_signals(requested.set)  # a SIGTERM while starting is kept, not a hard kill
    faults.hit(Point.STARTING)
    _check_kafka_credentials(settings)
    processor = Processor(settings, faults=faults)
    stop_on_signals(processor.stop)
    if requested.is_set():
        processor.stop()  # run() then shuts down at once, cleanly
    processor.run()
    return EXIT_OK


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    if args.threads < 1:
        raise CliError("--threads must be at least 1", EXIT_USAGE)
    # The registry first: a wrong --app is a usage error, reported before any connection.
    registry = sample_registry() if args.app is None else load_registry(args.app)
    requested = threading.Event()
    stop_on_signals(requested.set)  # a SIGTERM while starting is kept, not a hard kill
    _check_kafka_credentials(settings)
    worker = Worker(settings, registry, threads=args.threads)
    stop_on_signals(worker.stop)
    if requested.is_set():
        worker.stop()
    worker.run()
    return EXIT_OK


def _check_kafka_credentials(settings: Settings) -> None:
    """Refused credentials stop a long-running command at once, with exit code 2: its Kafka
    clients would otherwise retry them forever without saying so."""
    try:
        check_authentication(settings)
    except KafkaAuthError as exc:
        raise CliError(str(exc), EXIT_USAGE) from None
