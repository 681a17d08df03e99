"""A worker's metrics, as OpenTelemetry instruments (exported like the processor's: OTLP by the
standard ``OTEL_*`` variables, Prometheus on ``DUCTOR_METRICS_PORT``), created from the one
table of metrics (io/telemetry/metrics.py: names, kinds, units, descriptions; listed in
docs/operations/workers.md). Counters are read from ``WorkerStats`` when collected; the two
histograms are recorded as steps start and end. Labels are bounded: step types (the
registry's), outcomes and reasons; never a run id.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from opentelemetry.metrics import Histogram, Observation

from processor.io.telemetry.metrics import WORKER, Read, histogram, observe
from processor.io.telemetry.setup import Telemetry
from processor.worker.stats import WorkerStats


class WorkerMetrics:
    def __init__(
        self,
        telemetry: Telemetry,
        stats: WorkerStats,
        in_flight: Callable[[], tuple[int, int]],
        abandoned_running: Callable[[], int],
        ready: Callable[[], bool],
        assigned: Callable[[], int],
    ) -> None:
        self._duration: Histogram | None = None
        self._schedule_to_start: Histogram | None = None
        if telemetry.meter_provider is None:
            return
        meter = telemetry.meter_provider.get_meter(WORKER.value)
        reads = _reads(stats)

        def read_in_flight() -> list[Observation]:
            waiting, running = in_flight()
            return [
                Observation(waiting, {"ductor.state": "waiting"}),
                Observation(running, {"ductor.state": "running"}),
            ]

        reads["ductor.worker.tasks_in_flight"] = read_in_flight
        reads["ductor.worker.abandoned_running"] = lambda: [Observation(abandoned_running())]
        reads["ductor.ready"] = lambda: [Observation(1 if ready() else 0)]
        reads["ductor.partitions.assigned"] = lambda: [Observation(assigned())]
        observe(meter, WORKER, reads)
        self._duration = histogram(meter, WORKER, "ductor.worker.step.duration")
        self._schedule_to_start = histogram(meter, WORKER, "ductor.worker.schedule_to_start")

    def step_ended(self, step_type: str, duration_ms: float) -> None:
        if self._duration is not None:
            self._duration.record(duration_ms, {"ductor.step_type": step_type})

    def step_started(self, waited_ms: float) -> None:
        if self._schedule_to_start is not None:
            self._schedule_to_start.record(waited_ms)


def _reads(stats: WorkerStats) -> dict[str, Read]:
    """How each of the worker's counters is read from its stats."""

    def by(label: str, counts: Mapping[str, int], zero: bool = False) -> Read:
        return lambda: (
            [Observation(n, {label: k}) for k, n in list(counts.items())]
            or ([Observation(0)] if zero else [])
        )

    return {
        "ductor.worker.step_attempts": lambda: [
            Observation(n, {"ductor.step_type": t, "ductor.outcome": o})
            for (t, o), n in list(stats.attempts.items())
        ],
        "ductor.worker.skipped": by("ductor.reason", stats.skipped),
        "ductor.worker.abandoned": lambda: [Observation(stats.abandoned)],
        "ductor.worker.heartbeats": lambda: [Observation(stats.heartbeats)],
        "ductor.worker.reruns": lambda: [Observation(stats.reruns)],
        "ductor.worker.rerun_crashes": lambda: [Observation(stats.rerun_crashes)],
        "ductor.worker.rejoins": lambda: [Observation(stats.rejoins)],
        "ductor.worker.handed_back": by("ductor.step_type", stats.handed_back),
        "ductor.worker.errors": by("error.type", stats.errors, zero=True),
        "ductor.worker.isolated": by("ductor.stage", stats.isolated, zero=True),
    }
