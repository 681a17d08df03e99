"""A worker's metrics, as OpenTelemetry instruments (exported like the processor's: OTLP by the
standard ``OTEL_*`` variables, Prometheus on ``DUCTOR_METRICS_PORT``). Counters are read from
``WorkerStats`` when collected; the two histograms are recorded as steps start and end. Labels
are bounded: step types (the registry's), outcomes and reasons; never a run id.

On the Prometheus endpoint:

- ``ductor_worker_step_attempts_total{ductor_step_type, ductor_outcome}``: executions that
  ended, ``succeeded`` or ``failed``;
- ``ductor_worker_step_duration_milliseconds`` (histogram, by ``ductor_step_type``);
- ``ductor_worker_schedule_to_start_milliseconds``: from the task's record (the coordinator's
  dispatch) to its step starting;
- ``ductor_worker_tasks_in_flight{ductor_state}``: ``waiting`` (read, claimed, waiting for a
  slot) and ``running``;
- ``ductor_worker_skipped_total{ductor_reason}``: tasks not run (deadline, superseded, ahead,
  recorded, resend, run_gone, duplicate, died);
- ``ductor_worker_handed_back_total{ductor_step_type}``: tasks of a type this worker has no
  function for, handed to a worker that has (handback.py);
- ``ductor_worker_abandoned_total``, ``ductor_worker_abandoned_running`` (threads of abandoned
  steps still alive), ``ductor_worker_heartbeats_total``, ``ductor_worker_reruns_total``,
  ``ductor_worker_errors_total{error_type}``;
- ``ductor_ready`` and ``ductor_partitions_assigned``, as for a processor.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from opentelemetry.metrics import Histogram, Observation

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
        meter = telemetry.meter_provider.get_meter("ductor.worker")

        def counter(
            name: str, unit: str, what: str, read: Callable[[], Iterable[Observation]]
        ) -> None:
            meter.create_observable_counter(
                name, callbacks=[lambda _o: list(read())], unit=unit, description=what
            )

        def gauge(
            name: str, unit: str, what: str, read: Callable[[], Iterable[Observation]]
        ) -> None:
            meter.create_observable_gauge(
                name, callbacks=[lambda _o: list(read())], unit=unit, description=what
            )

        counter(
            "ductor.worker.step_attempts",
            "{execution}",
            "step executions that ended, by step type and outcome",
            lambda: [
                Observation(n, {"ductor.step_type": t, "ductor.outcome": o})
                for (t, o), n in stats.attempts.items()
            ],
        )
        counter(
            "ductor.worker.skipped",
            "{task}",
            "tasks not run, by reason (stale, recorded, the worker died running it, ...)",
            lambda: [Observation(n, {"ductor.reason": r}) for r, n in stats.skipped.items()],
        )
        counter(
            "ductor.worker.abandoned",
            "{step}",
            "steps given up while still running (deadline or heartbeat timeout passed)",
            lambda: [Observation(stats.abandoned)],
        )
        counter(
            "ductor.worker.heartbeats",
            "{heartbeat}",
            "heartbeats the steps reported",
            lambda: [Observation(stats.heartbeats)],
        )
        counter(
            "ductor.worker.reruns",
            "{execution}",
            "executions begun again after the worker running them died",
            lambda: [Observation(stats.reruns)],
        )
        counter(
            "ductor.worker.rerun_crashes",
            "{execution}",
            "reruns whose step killed the child process running it again (the attempt failed)",
            lambda: [Observation(stats.rerun_crashes)],
        )
        counter(
            "ductor.worker.rejoins",
            "{rejoin}",
            "times the worker's consumer joined its group again: tasks waited that it held or"
            " was given but did not read",
            lambda: [Observation(stats.rejoins)],
        )
        counter(
            "ductor.worker.handed_back",
            "{task}",
            "tasks of a step type this worker has no function for, handed to a worker that"
            " has, by step type",
            lambda: [
                Observation(n, {"ductor.step_type": t}) for t, n in list(stats.handed_back.items())
            ],
        )
        counter(
            "ductor.worker.errors",
            "{error}",
            "genuine failures of the worker by type",
            lambda: (
                [Observation(n, {"error.type": k}) for k, n in stats.errors.items()]
                or [Observation(0)]
            ),
        )

        counter(
            "ductor.worker.isolated",
            "{task}",
            "exceptions nobody foresaw, each isolated to the task it was met on (a dead letter,"
            " a failed attempt), by where",
            lambda: (
                [Observation(n, {"ductor.stage": k}) for k, n in list(stats.isolated.items())]
                or [Observation(0)]
            ),
        )

        def read_in_flight() -> list[Observation]:
            waiting, running = in_flight()
            return [
                Observation(waiting, {"ductor.state": "waiting"}),
                Observation(running, {"ductor.state": "running"}),
            ]

        gauge(
            "ductor.worker.tasks_in_flight",
            "{task}",
            "tasks the worker holds: waiting to run, and running",
            read_in_flight,
        )
        gauge(
            "ductor.worker.abandoned_running",
            "{step}",
            "abandoned steps still running (threads cannot be killed)",
            lambda: [Observation(abandoned_running())],
        )
        gauge(
            "ductor.ready",
            "",
            "1 when the worker is ready (as /readyz says), else 0",
            lambda: [Observation(1 if ready() else 0)],
        )
        gauge(
            "ductor.partitions.assigned",
            "{partition}",
            "partitions of its queues' steps topics the worker owns",
            lambda: [Observation(assigned())],
        )
        self._duration = meter.create_histogram(
            "ductor.worker.step.duration", unit="ms", description="time a step function took"
        )
        self._schedule_to_start = meter.create_histogram(
            "ductor.worker.schedule_to_start",
            unit="ms",
            description="from the task's dispatch (its record) to its step starting",
        )

    def step_ended(self, step_type: str, duration_ms: float) -> None:
        if self._duration is not None:
            self._duration.record(duration_ms, {"ductor.step_type": step_type})

    def step_started(self, waited_ms: float) -> None:
        if self._schedule_to_start is not None:
            self._schedule_to_start.record(waited_ms)
