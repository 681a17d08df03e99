"""The watch over running steps (flow.py, 2), a few times a second on the loop thread: a step
that outlives its deadline (and grace) or its heartbeat timeout is abandoned, and its slot is
free again; the others report a late start and their heartbeats; long ones are asked whether
their attempt still matters; too many abandoned steps still running stop the worker."""

from __future__ import annotations

import logging
from collections.abc import Callable

from processor.io.postgres.step_attempts import Report
from processor.io.runtime.clock import Clock
from processor.worker.messages import CheckCurrent, Request
from processor.worker.options import WorkerOptions
from processor.worker.results import Results, new_details
from processor.worker.runs import Runs
from processor.worker.steps import AttemptResult
from processor.worker.tasks import State, Task, TaskBook

log = logging.getLogger("ductor.worker")

# How often (and after how long) running steps are asked whether their attempt still matters.
CURRENT_CHECK_EVERY_S = 1.0
# A step that started on its slot this long after its claim (at most; a quarter of its
# timeout when that is less) reports its start: its timeout counts from there (core/tick.py,
# rule 4). Most start within milliseconds of their claim, and report nothing.
_LATE_START_S = 1.0
# Heartbeats are recorded at most this often (the last one's details with them), and at least
# twice within a step's heartbeat timeout: the coordinator judges that timeout from them.
_BEAT_RECORD_EVERY_S = 10.0
_BEATS_PER_TIMEOUT = 2.5


class DeadlineWatch:
    def __init__(
        self,
        *,
        book: TaskBook,
        clock: Clock,
        options: WorkerOptions,
        runs: Runs,
        results: Results,
        ask: Callable[[Request], None],
        too_many_abandoned: Callable[[], None],
    ) -> None:
        self._book = book
        self._clock = clock
        self._options = options
        self._runs = runs
        self._results = results
        self._ask = ask
        self._too_many_abandoned = too_many_abandoned
        self._next_current_check = 0.0
        self._bound_reached = False

    def watch(self, now: float) -> None:
        """Judge every running step at ``now`` (monotonic seconds), then the bound of
        abandoned steps still running."""
        wall_ms = self._clock.wall_ms()
        long_running: list[Task] = []
        for task in self._book.in_state(State.RUNNING):
            if not task.started_ns:
                continue  # waiting for a slot (skipped by it if its deadline passes)
            if self._timed_out(task, now, wall_ms):
                continue
            self._report_progress(task, now)
            if now * 1e9 - task.started_ns > CURRENT_CHECK_EVERY_S * 1e9:
                long_running.append(task)
        if long_running and now >= self._next_current_check:
            self._next_current_check = now + CURRENT_CHECK_EVERY_S
            self._ask(CheckCurrent(long_running))
        alive = self._runs.abandoned_alive()
        if alive > self._options.abandoned_limit and not self._bound_reached:
            log.error(
                "%d abandoned steps are still running (at most %d): the worker stops, for its"
                " supervisor to start a fresh process",
                alive,
                self._options.abandoned_limit,
            )
            self._bound_reached = True
            self._too_many_abandoned()

    def _timed_out(self, task: Task, now: float, wall_ms: int) -> bool:
        """Abandon ``task`` if it is past its deadline and grace, or silent past its heartbeat
        timeout (True), recording what its attempt became."""
        step = task.step
        deadline_ms = task.handle.deadline_ms  # (its start plus its timeout)
        silent_ms = (now - task.handle.beat_at) * 1000
        if wall_ms > deadline_ms + self._options.abandon_after_s * 1000:
            late_s = (wall_ms - deadline_ms) / 1000
            self._runs.abandon(task, f"still running {late_s:.1f} s after its deadline")
            if step.timeout_ms is None:
                self._results.done(task)  # its attempt timed out at the coordinator
            else:  # (which may learn late that it started, if it waited in its queue)
                error = f"attempt {task.key.attempt} timed out after {step.timeout_ms} ms"
                self._results.record(task, AttemptResult.failed(error))
            return True
        if step.heartbeat_timeout_ms is not None and silent_ms > step.heartbeat_timeout_ms:
            why = (
                f"no heartbeat for {silent_ms / 1000:.1f} s"
                f" (heartbeat_timeout_ms {step.heartbeat_timeout_ms})"
            )
            self._runs.abandon(task, why)
            self._results.record(task, AttemptResult.failed(f"abandoned: {why}"))
            return True
        return False

    def _report_progress(self, task: Task, now: float) -> None:
        """What a running step reports of its execution (io/postgres/step_attempts.py): its start,
        when it came well after its claim (a task claimed ahead of the slots waited for one: its
        timeout counts from its start, not its claim); its heartbeats, with the details of the
        last one, a few times per heartbeat timeout at most (the coordinator judges that
        timeout from them: core/tick.py, rule 4)."""
        step = task.step
        if not task.start_reported:
            task.start_reported = True
            if step.timeout_ms is not None and task.claimed_ns:
                waited_s = (task.started_ns - task.claimed_ns) / 1e9
                if waited_s > min(_LATE_START_S, step.timeout_ms / 4000):
                    self._results.report(Report(task.key, started=True))
        handle = task.handle
        if handle.beats == task.beats_reported:
            return
        every = _BEAT_RECORD_EVERY_S
        if step.heartbeat_timeout_ms is not None:
            every = min(every, step.heartbeat_timeout_ms / 1000 / _BEATS_PER_TIMEOUT)
        if now - task.beat_reported_at >= every:
            self._results.report(Report(task.key, beat=True, details=new_details(task)))
            task.beats_reported = handle.beats
            task.beat_reported_at = now
