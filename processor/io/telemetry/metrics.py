"""The metrics both services export, in one table: each one's service, name, kind, unit and
description. Each service creates its instruments from it, saying only how each is read (the
processor: io/telemetry/setup.py; the worker: worker/metrics.py), and the docs that list them
(docs/telemetry.md#metrics, docs/operations/workers.md) are held to it by
tests/unit/test_metric_table.py. Labels are bounded (no run id is ever one).

On a Prometheus endpoint the names follow OpenTelemetry's Prometheus conventions
(``prometheus_name``): dots become underscores, counters end in ``_total``, the millisecond
histograms in ``_milliseconds``, gauges keep their name.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from opentelemetry.metrics import Histogram, Meter, Observation


class MetricKind(enum.Enum):
    COUNTER = "counter"  # observable: read from the service's stats when collected
    GAUGE = "gauge"  # observable
    HISTOGRAM = "histogram"  # recorded where the time is measured


class Service(enum.Enum):
    PROCESSOR = "ductor.processor"  # the meter's scope
    WORKER = "ductor.worker"


@dataclass(frozen=True)
class Metric:
    service: Service
    name: str
    kind: MetricKind
    unit: str
    description: str

    @property
    def prometheus_name(self) -> str:
        name = self.name.replace(".", "_")
        if self.unit == "ms":
            name += "_milliseconds"
        return name + "_total" if self.kind is MetricKind.COUNTER else name


_P, _W = Service.PROCESSOR, Service.WORKER
_COUNTER, _GAUGE, _HISTOGRAM = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM

METRICS: tuple[Metric, ...] = (
    # -- the processor -------------------------------------------------------------------------
    Metric(_P, "ductor.ticks", _COUNTER, "{tick}", "ticks by outcome"),
    Metric(_P, "ductor.conflicts", _COUNTER, "{conflict}", "lost version races (not errors)"),
    Metric(
        _P,
        "ductor.relayed",
        _COUNTER,
        "{record}",
        "records sent again from the outbox (their instance died after its commit)",
    ),
    Metric(_P, "ductor.errors", _COUNTER, "{error}", "genuine failures by type"),
    Metric(_P, "ductor.requeues", _COUNTER, "{requeue}", "requeues by delay rung"),
    Metric(_P, "ductor.force_fails", _COUNTER, "{run}", "runs force-failed by reason"),
    Metric(_P, "ductor.dead_letters", _COUNTER, "{record}", "records dead-lettered by reason"),
    Metric(
        _P,
        "ductor.quarantined",
        _COUNTER,
        "{run}",
        "runs flagged as unusable (the sweeps skip them) by reason",
    ),
    Metric(
        _P,
        "ductor.isolated",
        _COUNTER,
        "{item}",
        "exceptions nobody foresaw, each isolated to the item it was met on (a dead letter,"
        " a quarantine, a sweep item left), by where",
    ),
    Metric(
        _P,
        "ductor.consumer.rejoins",
        _COUNTER,
        "{rejoin}",
        "times the consumer joined its group again: records waited that it held or was given"
        " but did not read",
    ),
    Metric(
        _P,
        "ductor.trigger.records",
        _COUNTER,
        "{record}",
        "records of triggers' source topics by trigger and outcome (requested, skipped by"
        " the filter, rejected)",
    ),
    Metric(
        _P,
        "ductor.outbox.parked",
        _COUNTER,
        "{row}",
        "outbox rows parked: the broker refuses a record of theirs for good, by its error",
    ),
    # Business metrics (core/run_tally.py): bounded labels, a registered workflow's name and a
    # final status.
    Metric(
        _P,
        "ductor.runs.started",
        _COUNTER,
        "{run}",
        "runs started (their first transition out of pending committed) by workflow",
    ),
    Metric(
        _P,
        "ductor.runs.ended",
        _COUNTER,
        "{run}",
        "runs ended by workflow and final status (succeeded, failed, cancelled), force-fails"
        " included",
    ),
    # Limits at dispatch (core/limits.py), by the limit's name (bounded: a definition's).
    Metric(
        _P,
        "ductor.limit.refused",
        _COUNTER,
        "{dispatch}",
        "dispatches a full concurrency or rate limit held back (the step waits for it)",
    ),
    Metric(
        _P,
        "ductor.limit.wait.duration",
        _HISTOGRAM,
        "ms",
        "time a step waited for its limit, recorded when it is let in",
    ),
    Metric(
        _P,
        "ductor.consumer.lag",
        _GAUGE,
        "{record}",
        "records behind the high watermark per partition, paused ones included",
    ),
    Metric(_P, "ductor.tick.duration", _HISTOGRAM, "ms", "time to load and tick a batch"),
    Metric(
        _P, "ductor.commit.duration", _HISTOGRAM, "ms", "time of the batched conditional UPDATE"
    ),
    Metric(
        _P,
        "ductor.end_to_end.latency",
        _HISTOGRAM,
        "ms",
        "wakeup produced (or due) to tick committed",
    ),
    Metric(
        _P,
        "ductor.wakeup.arrival",
        _HISTOGRAM,
        "ms",
        "wakeup produced to taken in by the instance (the producer, the broker, the fetch)",
    ),
    Metric(
        _P, "ductor.delay.lateness", _HISTOGRAM, "ms", "delay record processed minus its due time"
    ),
    Metric(
        _P, "ductor.ready", _GAUGE, "", "1 when the instance is ready (as /readyz says), else 0"
    ),
    Metric(
        _P,
        "ductor.partitions.assigned",
        _GAUGE,
        "{partition}",
        "partitions of the coordinator topics this instance owns",
    ),
    # -- the worker ----------------------------------------------------------------------------
    Metric(
        _W,
        "ductor.worker.step_attempts",
        _COUNTER,
        "{execution}",
        "step executions that ended, by step type and outcome",
    ),
    Metric(
        _W,
        "ductor.worker.skipped",
        _COUNTER,
        "{task}",
        "tasks not run, by reason (stale, recorded, the worker died running it, ...)",
    ),
    Metric(
        _W,
        "ductor.worker.abandoned",
        _COUNTER,
        "{step}",
        "steps given up while still running (deadline or heartbeat timeout passed)",
    ),
    Metric(
        _W, "ductor.worker.heartbeats", _COUNTER, "{heartbeat}", "heartbeats the steps reported"
    ),
    Metric(
        _W,
        "ductor.worker.reruns",
        _COUNTER,
        "{execution}",
        "executions begun again after the worker running them died",
    ),
    Metric(
        _W,
        "ductor.worker.rerun_crashes",
        _COUNTER,
        "{execution}",
        "reruns whose step killed the child process running it again (the attempt failed)",
    ),
    Metric(
        _W,
        "ductor.worker.rejoins",
        _COUNTER,
        "{rejoin}",
        "times the worker's consumer joined its group again: tasks waited that it held or"
        " was given but did not read",
    ),
    Metric(
        _W,
        "ductor.worker.handed_back",
        _COUNTER,
        "{task}",
        "tasks of a step type this worker has no function for, handed to a worker that"
        " has, by step type",
    ),
    Metric(
        _W, "ductor.worker.errors", _COUNTER, "{error}", "genuine failures of the worker by type"
    ),
    Metric(
        _W,
        "ductor.worker.isolated",
        _COUNTER,
        "{task}",
        "exceptions nobody foresaw, each isolated to the task it was met on (a dead letter,"
        " a failed attempt), by where",
    ),
    Metric(
        _W,
        "ductor.worker.tasks_in_flight",
        _GAUGE,
        "{task}",
        "tasks the worker holds: waiting to run, and running",
    ),
    Metric(
        _W,
        "ductor.worker.abandoned_running",
        _GAUGE,
        "{step}",
        "abandoned steps still running (threads cannot be killed)",
    ),
    Metric(_W, "ductor.ready", _GAUGE, "", "1 when the worker is ready (as /readyz says), else 0"),
    Metric(
        _W,
        "ductor.partitions.assigned",
        _GAUGE,
        "{partition}",
        "partitions of its queues' steps topics the worker owns",
    ),
    Metric(_W, "ductor.worker.step.duration", _HISTOGRAM, "ms", "time a step function took"),
    Metric(
        _W,
        "ductor.worker.schedule_to_start",
        _HISTOGRAM,
        "ms",
        "from the task's dispatch (its record) to its step starting",
    ),
)

Read = Callable[[], Iterable[Observation]]
PROCESSOR, WORKER = Service.PROCESSOR, Service.WORKER


def metrics_of(service: Service) -> dict[str, Metric]:
    """``service``'s metrics by name, in the table's order."""
    return {m.name: m for m in METRICS if m.service is service}


def observe(meter: Meter, service: Service, reads: Mapping[str, Read]) -> None:
    """Creates the observable instruments (counters, gauges) of ``service`` named in
    ``reads``, each read by its function when the metrics are collected (a scrape, an
    export), never on a service's loop."""
    table = metrics_of(service)
    for name, read in reads.items():
        metric = table[name]

        def callback(_options: object, read: Read = read) -> list[Observation]:
            return list(read())

        if metric.kind is MetricKind.COUNTER:
            meter.create_observable_counter(
                name, callbacks=[callback], unit=metric.unit, description=metric.description
            )
        elif metric.kind is MetricKind.GAUGE:
            meter.create_observable_gauge(
                name, callbacks=[callback], unit=metric.unit, description=metric.description
            )
        else:
            raise ValueError(f"{name} is a histogram, recorded where it is measured")


def histogram(meter: Meter, service: Service, name: str) -> Histogram:
    """The histogram ``name`` of ``service``'s table."""
    metric = metrics_of(service)[name]
    if metric.kind is not MetricKind.HISTOGRAM:
        raise ValueError(f"{name} is a {metric.kind.value}, not a histogram")
    return meter.create_histogram(name, unit=metric.unit, description=metric.description)
