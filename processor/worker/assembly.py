"""How a worker's task flow is put together: its collaborators built in one place, around one
book of tasks, one clock and one queue of answers (worker.py is the composition root that
calls it; a unit test calls it too, with a fake clock and its own ``ask``, or builds any one
collaborator alone).

    intake ─> claims ─> runs ─> results        (the stages a task goes through)
                 watch ─┘         │            (running steps judged, a few times a second)
    TaskFlow: every state move, from the answers the lanes and the slots post
"""

from __future__ import annotations

import queue
from collections.abc import Callable
from dataclasses import dataclass

from processor.core.routing import TopicNames
from processor.core.shapes import TopicPartition
from processor.io.config.settings import Settings
from processor.io.kafka.delivery import Delivery
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.instances import Presence, heartbeat_interval_s
from processor.io.postgres.worker_registry import Directory, WorkerAbout, ductor_version
from processor.io.runtime.clock import Clock
from processor.io.runtime.faults import Faults
from processor.io.runtime.outage import Outage
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.setup import Telemetry
from processor.worker.claiming import Claims
from processor.worker.flow import TaskFlow
from processor.worker.handback import Handback
from processor.worker.intake import Intake
from processor.worker.messages import News, Request
from processor.worker.metrics import WorkerMetrics
from processor.worker.options import WorkerOptions
from processor.worker.results import Results
from processor.worker.runners import Runner
from processor.worker.runs import Runs
from processor.worker.stats import WorkerStats
from processor.worker.steps import StepRegistry
from processor.worker.tasks import State, TaskBook
from processor.worker.watch import DeadlineWatch


@dataclass(frozen=True)
class FlowParts:
    """What a task flow is built from: the worker's own parts (its options, its clock, how it
    asks the database and delivers records) and what it tells the loop."""

    options: WorkerOptions
    registry: StepRegistry
    names: TopicNames
    stats: WorkerStats
    telemetry: Telemetry
    clock: Clock
    db_clock: DatabaseClock
    answers: queue.SimpleQueue[News]
    ask: Callable[[Request], None]
    delivery: Delivery
    flush: Callable[[float], object]  # wait so long for the records on their way
    kafka_outage: Outage
    done_offset: Callable[[TopicPartition, int], None]
    too_many_abandoned: Callable[[], None]
    partition_by_run: bool
    shutdown_timeout_s: float
    dlq_max_bytes: int
    faults: Faults
    threads: ThreadWatch


def build_flow(
    parts: FlowParts,
    directory: Directory | None = None,
    instance_id: str = "",
    gauges: tuple[Callable[[], bool], Callable[[], int]] | None = None,
    runners: dict[str, Runner] | None = None,
) -> TaskFlow:
    """A task flow. ``directory``: the other workers (the registry), for the tasks this one
    has no function for (handback.py; None: such tasks run here, and fail); ``gauges``: the
    worker's readiness and partitions assigned, for its metrics (None: no metrics);
    ``runners``: tests only (runs.py)."""
    p = parts
    book = TaskBook()
    runs, results, claims, watch = _stages(p, book, runners)
    intake = Intake(
        book=book,
        claims=claims,
        clock=p.clock,
        db_clock=p.db_clock,
        registry=p.registry,
        stats=p.stats,
        delivery=p.delivery,
        dlq_topic=p.names.dlq,
        dlq_max_bytes=p.dlq_max_bytes,
        done_offset=p.done_offset,
        faults=p.faults,
    )
    handback = _handback(p, directory, instance_id, intake)
    metrics = None
    if gauges is not None:
        in_flight = lambda: (book.in_hand, book.count(State.RUNNING))  # noqa: E731
        metrics = WorkerMetrics(
            p.telemetry, p.stats, in_flight, runs.abandoned_alive, gauges[0], gauges[1]
        )
    flow = TaskFlow(
        book=book,
        clock=p.clock,
        options=p.options,
        stats=p.stats,
        answers=p.answers,
        runs=runs,
        claims=claims,
        results=results,
        watch=watch,
        intake=intake,
        handback=handback,
        faults=p.faults,
        flush=p.flush,
        shutdown_timeout_s=p.shutdown_timeout_s,
        metrics=metrics,
    )
    return flow


def _handback(
    p: FlowParts, directory: Directory | None, instance_id: str, intake: Intake
) -> Handback | None:
    if directory is None:
        return None
    intake.handback = Handback(
        p.names,
        p.options.queues,
        instance_id,
        directory,
        p.delivery,
        p.done_offset,
        intake.run_here,
        p.stats,
    )
    return intake.handback


def _stages(
    p: FlowParts, book: TaskBook, runners: dict[str, Runner] | None
) -> tuple[Runs, Results, Claims, DeadlineWatch]:
    """The stages a task goes through once taken in, around ``book``."""
    runs = Runs(
        book=book,
        options=p.options,
        registry=p.registry,
        stats=p.stats,
        telemetry=p.telemetry,
        post=p.answers.put,
        threads=p.threads,
        runners=runners,
    )
    results = Results(
        book=book,
        clock=p.clock,
        names=p.names,
        partition_by_run=p.partition_by_run,
        delivery=p.delivery,
        kafka_outage=p.kafka_outage,
        ask=p.ask,
        done_offset=p.done_offset,
        tracing=p.telemetry.tracing,
    )
    claims = Claims(
        book=book,
        clock=p.clock,
        concurrency=p.options.concurrency,
        held_limit=p.options.held_limit,
        runs=runs,
        ask=p.ask,
    )
    watch = DeadlineWatch(
        book=book,
        clock=p.clock,
        options=p.options,
        runs=runs,
        results=results,
        ask=p.ask,
        too_many_abandoned=p.too_many_abandoned,
    )
    return runs, results, claims, watch


def presence_of(
    settings: Settings,
    options: WorkerOptions,
    registry: StepRegistry,
    instance_id: str,
    db_clock: DatabaseClock,
    threads: ThreadWatch,
    directory: Directory,
) -> Presence:
    """A worker's heartbeat and row in the instance registry (io/postgres/instances.py): what it
    serves (`ductor workers`); each heartbeat reads the other workers into ``directory``."""
    about = WorkerAbout(
        settings.worker_group_id,
        settings.worker_name or None,
        options.queues,
        tuple(registry.served()),
        options.concurrency,
        ductor_version(),
        options.app,
    )
    return Presence(
        settings.pg_dsn,
        instance_id,
        "worker",
        heartbeat_interval_s(settings.instance_timeout_s),
        settings.instance_timeout_s,
        db_clock,
        threads,
        about,
        directory.refresh,
    )
