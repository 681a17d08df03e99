"""The ``ductor`` command line.

Exit codes scripts can rely on: 0 success, 1 the operation failed (a service is unreachable,
a run did not end as expected), 2 bad usage or bad configuration. Errors are printed as one
sentence on stderr, never as a traceback.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

from processor.core.envelope import Wakeup
from processor.core.model import SignalKind, ValidationError, parse_workflow, state_checksum
from processor.core.outcomes import DLQ_REASONS
from processor.core.routing import TIERS, TopicNames, partition_for
from processor.engine.processor import Processor
from processor.engine.worker import Worker, sample_registry
from processor.io.config import ConfigError, Settings, load_settings
from processor.io.dlq import DlqError, fetch_dead_letter, read_dead_letters, replay
from processor.io.kafka import choose_partition, produce, producer_config, topic_partitions
from processor.io.logs import setup_logging
from processor.io.migrate import migrate
from processor.io.runs_admin import (
    insert_runs,
    insert_signal,
    register_workflow,
    run_columns,
    run_tier,
)
from processor.io.store import Definitions, load_runs
from processor.io.topics import create_topics
from processor.tools.bench import add_arguments as add_bench_arguments
from processor.tools.bench import run as run_bench
from processor.tools.demo import run_demo

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


class CliError(Exception):
    """A failure to report as one sentence, with its exit code."""

    def __init__(self, message: str, code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.code = code


def _connect(settings: Settings) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(
            f"cannot connect to Postgres at {settings.pg_dsn_redacted} ({first_line});"
            " is it running (make up) and is DUCTOR_PG_DSN right?"
        ) from None


def cmd_migrate(settings: Settings, _args: argparse.Namespace) -> int:
    with _connect(settings):
        pass
    applied = migrate(settings.pg_dsn)
    print("applied: " + ", ".join(applied) if applied else "schema is up to date")
    return EXIT_OK


def cmd_topics_create(settings: Settings, _args: argparse.Namespace) -> int:
    report = create_topics(settings)
    for topic, state in report.items():
        print(f"{topic:32} {state}")
    return EXIT_OK


def cmd_workflows_register(settings: Settings, args: argparse.Namespace) -> int:
    path = Path(args.file)
    try:
        raw = orjson.loads(path.read_bytes())
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror}", EXIT_USAGE) from None
    except orjson.JSONDecodeError as exc:
        raise CliError(f"{path} is not valid JSON: {exc}", EXIT_USAGE) from None
    try:
        wf = parse_workflow(raw)
    except ValidationError as exc:
        raise CliError(f"{path}: {exc}", EXIT_USAGE) from None
    with _connect(settings) as conn:
        try:
            new = register_workflow(conn, wf)
        except ValueError as exc:
            raise CliError(str(exc)) from None
    print(f"workflow {wf.name} v{wf.version} {'registered' if new else 'already registered'}")
    return EXIT_OK


def start_runs(
    settings: Settings,
    workflow: str,
    run_ids: Sequence[str],
    run_input: Any = None,
    tier: str = "t1",
    version: int | None = None,
) -> list[str]:
    """Insert the runs (idempotently) and produce their first wakeups. Returns the new ids."""
    names = TopicNames(settings.topic_prefix)
    with _connect(settings) as conn:
        definitions = Definitions()
        wf = (
            definitions.get(conn, (workflow, version))
            if version
            else definitions.latest(conn, workflow)
        )
        inserted: list[str] = []
        for start in range(0, len(run_ids), 5000):
            chunk = run_ids[start : start + 5000]
            inserted += insert_runs(conn, wf, [(r, run_input or {}) for r in chunk], tier)
    producer = Producer(producer_config(settings, "ductor-cli"))
    topic = names.wakeup(tier)
    partitions = topic_partitions(producer, [topic])[topic]
    now_ms = int(time.time() * 1000)
    for run_id in run_ids:  # a repeated start wakes the run again; its tick is then a no-op
        wakeup = Wakeup(run_id=run_id, reason="start", produced_at=now_ms)
        partition = choose_partition(run_id, partitions, settings.partition_by_run)
        produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
    if producer.flush(30) != 0:
        raise CliError("the broker did not acknowledge every start wakeup within 30 s")
    return inserted


def cmd_start(settings: Settings, args: argparse.Namespace) -> int:
    try:
        run_input = orjson.loads(args.input) if args.input else {}
    except orjson.JSONDecodeError as exc:
        raise CliError(f"--input is not valid JSON: {exc}", EXIT_USAGE) from None
    if args.count < 1:
        raise CliError("--count must be at least 1", EXIT_USAGE)
    if args.run_id:
        ids = (
            [args.run_id] if args.count == 1 else [f"{args.run_id}-{i}" for i in range(args.count)]
        )
    else:
        ids = [f"{args.workflow}-{uuid.uuid4().hex[:12]}" for _ in range(args.count)]
    inserted = start_runs(settings, args.workflow, ids, run_input, args.tier)
    if args.count == 1:
        print(ids[0] if inserted else f"{ids[0]} (already started)")
    else:
        print(f"started {len(inserted)} run(s), {len(ids) - len(inserted)} already existed")
    return EXIT_OK


def cmd_process(settings: Settings, args: argparse.Namespace) -> int:
    processor = Processor(settings)
    _stop_on_signals(processor.stop)
    processor.run()
    return EXIT_OK


def cmd_worker(settings: Settings, args: argparse.Namespace) -> int:
    worker = Worker(settings, sample_registry(), threads=args.threads)
    _stop_on_signals(worker.stop)
    worker.run()
    return EXIT_OK


def _stop_on_signals(stop: Any) -> None:
    def handler(_signum: int, _frame: Any) -> None:
        stop()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def cmd_inspect(settings: Settings, args: argparse.Namespace) -> int:
    with _connect(settings) as conn:
        run = load_runs(conn, Definitions(), [args.run_id]).get(args.run_id)
        columns = run_columns(conn, args.run_id)
    if run is None or columns is None:
        raise CliError(f"no run with id {args.run_id!r}")
    if isinstance(run, Exception):
        raise CliError(str(run))
    print(f"run        {run.run_id}")
    print(f"workflow   {run.workflow[0]} v{run.workflow[1]}")
    print(
        f"status     {run.state.status.value}"
        + (f" ({run.state.reason})" if run.state.reason else "")
    )
    print(f"version    {columns.version}   seq {run.state.seq}   tier {run.tier}")
    check = "ok" if run.checksum_ok else f"MISMATCH (row says {run.stored_checksum})"
    print(f"checksum   {state_checksum(run.state)} {check}")
    print(f"next wake  {columns.next_wakeup_at or '-'}")
    print("nodes:")
    for name, node in run.state.nodes:
        extra = f"  error: {node.error}" if node.error else ""
        print(f"  {name:20} {node.status.value:11} attempt {node.attempt}{extra}")
    return EXIT_OK if run.checksum_ok else EXIT_FAILED


def cmd_signal(settings: Settings, args: argparse.Namespace) -> int:
    kind = SignalKind(args.kind)
    signal_id = args.signal_id or f"{kind.value}-{uuid.uuid4().hex[:12]}"
    with _connect(settings) as conn:
        tier = run_tier(conn, args.run_id)
        if tier is None:
            raise CliError(f"no run with id {args.run_id!r}")
        new = insert_signal(conn, args.run_id, signal_id, kind)
    producer = Producer(producer_config(settings, "ductor-cli"))
    topic = TopicNames(settings.topic_prefix).wakeup(tier)
    partitions = topic_partitions(producer, [topic])[topic]
    wakeup = Wakeup(run_id=args.run_id, reason="signal", produced_at=int(time.time() * 1000))
    produce(producer, topic, wakeup.encode(), wakeup.key(), partition_for(args.run_id, partitions))
    if producer.flush(30) != 0:
        raise CliError("the broker did not acknowledge the signal's wakeup within 30 s")
    print(f"signal {kind.value} {'sent' if new else 'was already recorded'} ({signal_id})")
    return EXIT_OK


def cmd_demo(settings: Settings, args: argparse.Namespace) -> int:
    return run_demo(settings, runs=args.runs, timeout_s=args.timeout)


def cmd_bench(settings: Settings, args: argparse.Namespace) -> int:
    return run_bench(args)


def cmd_dlq_list(settings: Settings, args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 1:
        raise CliError("--limit must be at least 1", EXIT_USAGE)
    try:
        letters = read_dead_letters(settings, reason=args.reason, limit=args.limit)
    except DlqError as exc:
        raise CliError(str(exc)) from None
    for letter in letters:
        print(letter.describe())
    # The count goes to stderr, so stdout stays exactly one line per record for scripts.
    which = f" with reason {args.reason}" if args.reason else ""
    topic = TopicNames(settings.topic_prefix).dlq
    print(f"{len(letters)} dead letter(s){which} listed from {topic}", file=sys.stderr)
    return EXIT_OK


def cmd_dlq_replay(settings: Settings, args: argparse.Namespace) -> int:
    if args.dlq_offset < 0 or args.partition < 0:
        raise CliError("the offset and --partition must not be negative", EXIT_USAGE)
    value: bytes | None = None
    if args.value_file:
        try:
            value = Path(args.value_file).read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {args.value_file}: {exc.strerror}", EXIT_USAGE) from None
    try:
        letter = fetch_dead_letter(settings, args.partition, args.dlq_offset)
        done = replay(settings, letter, value, force=args.force)
    except DlqError as exc:
        raise CliError(str(exc)) from None
    source = "a fixed value" if value is not None else "its original value"
    print(
        f"replayed {letter.partition}:{letter.offset} ({letter.reason}) with {source}"
        f" to {done.topic} partition {done.partition} offset {done.offset}"
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ductor",
        description="Ductor coordinator: advances durable workflow runs from Kafka wakeups, "
        "committing each tick to Postgres with optimistic concurrency.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("migrate", help="apply the SQL migrations in schemas/migrations")
    p.set_defaults(func=cmd_migrate)

    topics = sub.add_parser("topics", help="manage the Kafka topics")
    topics_sub = topics.add_subparsers(dest="topics_command", required=True, metavar="ACTION")
    p = topics_sub.add_parser(
        "create", help="create every topic idempotently (partitions from config)"
    )
    p.set_defaults(func=cmd_topics_create)

    workflows = sub.add_parser("workflows", help="manage workflow definitions")
    wf_sub = workflows.add_subparsers(dest="workflows_command", required=True, metavar="ACTION")
    p = wf_sub.add_parser("register", help="validate and register a workflow definition (JSON)")
    p.add_argument("file", help="path to the workflow JSON (see schemas/workflow.schema.json)")
    p.set_defaults(func=cmd_workflows_register)

    p = sub.add_parser("start", help="start runs of a registered workflow")
    p.add_argument("workflow", help="workflow name (its latest version is used)")
    p.add_argument("--input", help="run input as JSON")
    p.add_argument("--run-id", help="run id (idempotent: the same id starts once)")
    p.add_argument("--count", type=int, default=1, help="how many runs to start")
    p.add_argument(
        "--tier", choices=TIERS, default="t1", help="wakeup tier (t0 interactive, t2 bulk)"
    )
    p.set_defaults(func=cmd_start)

    p = sub.add_parser("process", help="run one coordinator instance until SIGTERM/SIGINT")
    p.set_defaults(func=cmd_process)

    p = sub.add_parser("worker", help="run a step worker with the sample step functions")
    p.add_argument("--threads", type=int, default=8, help="step functions run in parallel")
    p.set_defaults(func=cmd_worker)

    p = sub.add_parser("inspect", help="show a run: status, nodes, version, seq, checksum check")
    p.add_argument("run_id")
    p.set_defaults(func=cmd_inspect)

    p = sub.add_parser("signal", help="send a signal to a run")
    p.add_argument("run_id")
    p.add_argument("kind", choices=[k.value for k in SignalKind])
    p.add_argument("--signal-id", help="idempotency key (default: a new one)")
    p.set_defaults(func=cmd_signal)

    p = sub.add_parser(
        "demo", help="the whole system live: infra, 2 processors, a worker, thousands of runs"
    )
    p.add_argument(
        "--runs", type=int, default=3000, help="sample runs to start (plus hot, failing, cancelled)"
    )
    p.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("bench", help="the benchmark (same as `make bench`); prints figures")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench)

    dlq = sub.add_parser("dlq", help="list and replay dead-lettered records")
    dlq_sub = dlq.add_subparsers(dest="dlq_command", required=True, metavar="ACTION")
    p = dlq_sub.add_parser(
        "list",
        help="print the dead letters from the beginning, one line each: dlq partition:offset,"
        " reason, source topic[partition]@offset, key, value excerpt, detail",
    )
    p.add_argument("--limit", type=int, help="print at most N records (the first N read)")
    p.add_argument("--reason", choices=DLQ_REASONS, help="only records dead-lettered for R")
    p.set_defaults(func=cmd_dlq_list)
    p = dlq_sub.add_parser(
        "replay",
        help="produce a dead letter again to its source topic, with its key and headers"
        " (without the ductor.dlq.* ones)",
    )
    p.add_argument("dlq_offset", type=int, help="the record's offset in the dead-letter topic")
    p.add_argument("--partition", type=int, default=0, help="its dead-letter partition (0)")
    p.add_argument("--value-file", help="send this file's bytes as the value instead")
    p.add_argument(
        "--force",
        action="store_true",
        help="replay even a value the processor would dead-letter again",
    )
    p.set_defaults(func=cmd_dlq_replay)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings()
        setup_logging(settings.log_format, settings.log_level)
        code: int = args.func(settings, args)
        return code
    except ConfigError as exc:
        print(f"ductor: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CliError as exc:
        print(f"ductor: {exc}", file=sys.stderr)
        return exc.code
    except KafkaException as exc:
        error = exc.args[0]
        if isinstance(error, KafkaError) and error.code() == KafkaError._INVALID_ARG:
            print(
                f"ductor: configuration error: {error.str()}; check the DUCTOR_KAFKA_* variables",
                file=sys.stderr,
            )
            return EXIT_USAGE
        print(f"ductor: Kafka error: {error}; is the broker up (make up)?", file=sys.stderr)
        return EXIT_FAILED
    except (psycopg.Error, LookupError, RuntimeError) as exc:
        message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"ductor: {message}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
