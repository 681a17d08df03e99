"""A task's second stage (flow.py, 2): its step function **runs** on a slot of its own
(runners.py; isolation.py for processes), with heartbeats and a ``cancelled`` flag, and its
end comes back to the loop as an answer (messages.py: ``Ended``, ``Over``). Reruns (attempts a
worker that died had started) run in child processes of their own, beside the slots."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace

from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.setup import Telemetry
from processor.io.telemetry.spans import context_headers, end_error, end_ok
from processor.worker.isolation import ProcessRunner
from processor.worker.messages import Ended, News, Over
from processor.worker.options import WorkerOptions
from processor.worker.results import ids
from processor.worker.runners import AsyncRunner, Runner, ThreadRunner
from processor.worker.stats import WorkerStats
from processor.worker.steps import AttemptResult, StepRegistry, execute_async_step, execute_step
from processor.worker.tasks import State, Task, TaskBook

log = logging.getLogger("ductor.worker")

# Reruns run in child processes of their own, started as they are needed, up to twice as many
# at once as the worker has slots (a worker that dies leaves at most its running steps and its
# start window as reruns); a child left idle this long ends.
_RERUN_SLOTS_PER_SLOT = 2
_RERUN_IDLE_EXIT_S = 30.0


class Runs:
    def __init__(
        self,
        *,
        book: TaskBook,
        options: WorkerOptions,
        registry: StepRegistry,
        stats: WorkerStats,
        telemetry: Telemetry,
        post: Callable[[News], None],
        threads: ThreadWatch,
        runners: dict[str, Runner] | None = None,
    ) -> None:
        """``post``: how a slot hands its answer to the loop; ``runners``: tests only (by
        kind: sync, async, rerun), else made from the options."""
        self._book = book
        self._options = options
        self._registry = registry
        self._stats = stats
        self._telemetry = telemetry
        self._post = post
        self._threads = threads
        self._runners = runners if runners is not None else self._make_runners()
        # Reruns running in children of their own, beside the slots (not waiting for them).
        self._rerunning: set[Task] = set()

    def _make_runners(self) -> dict[str, Runner]:
        options = self._options
        if options.isolation == "process":
            runner = ProcessRunner(options, self._ended, threads=self._threads, over=self._over)
            return {"sync": runner, "async": runner, "rerun": runner}
        runners: dict[str, Runner] = {
            "sync": ThreadRunner(
                options.concurrency, self._execute, self._ended, self._threads, self._over
            ),
            "async": AsyncRunner(self._execute_async, self._ended, self._threads, self._over),
        }
        if options.reruns_in_child:
            # A rerun may kill its process again: it runs in a child of its own (started
            # only when reruns come), so the worker and its other tasks go on if it does.
            runners["rerun"] = ProcessRunner(
                options,
                self._ended,
                slots=_RERUN_SLOTS_PER_SLOT * options.concurrency,
                idle_exit_s=_RERUN_IDLE_EXIT_S,
                name="rerun",
                threads=self._threads,
                over=self._over,
            )
        return runners

    def _runner_of(self, task: Task) -> Runner:
        if task.starts > 1 and "rerun" in self._runners:
            return self._runners["rerun"]
        return self._runners[
            "async"
            if self._registry.is_async(task.step.step_type, task.step.step_version)
            else "sync"
        ]

    def abandoned_alive(self) -> int:
        return sum(r.abandoned_alive() for r in set(self._runners.values()))

    def waiting_for_a_slot(self) -> int:
        """Tasks handed to a runner that wait there for a free slot."""
        running = self._book.count(State.RUNNING) - len(self._rerunning)
        return max(0, running - self._options.concurrency)

    def close(self) -> None:
        for runner in set(self._runners.values()):
            runner.close()

    def start(self, task: Task) -> None:
        self._book.move(task, State.RUNNING)
        runner = self._runner_of(task)
        if task.starts > 1:
            if runner is self._runners.get("rerun") and runner is not self._runners["sync"]:
                self._rerunning.add(task)
            self._stats.reruns += 1
            log.warning(
                "running a step again, in a process of its own: the worker that started it"
                " died (execution %d)",
                task.starts,
                extra=ids(task),
            )
        if self._telemetry.tracing:
            self._trace(task)
        runner.submit(task)

    def _trace(self, task: Task) -> None:
        record = (task.tp[0], task.tp[1], task.offset, None, task.headers)
        span = task.span = self._telemetry.start_consumer_span(
            task.tp[0], [record], task.key.run_id
        )
        if span.is_recording():
            span.set_attributes(
                {
                    "ductor.node": task.key.node,
                    "ductor.attempt": task.key.attempt,
                    "ductor.step_type": task.step.step_type,
                }
            )
        # The wakeup carries the execution's context: the run's next tick is its child.
        task.headers = context_headers(span) or task.headers

    def ended(self, task: Task) -> None:
        """``task``'s execution ended (it no longer holds a rerun's child)."""
        self._rerunning.discard(task)

    def abandon(self, task: Task, why: str) -> None:
        """Give up a running step: its slot is free again (its thread is a daemon, its child
        process is killed); its runner reports when its execution is over."""
        self._rerunning.discard(task)
        self._runner_of(task).abandon(task)
        self._stats.abandoned += 1
        self._stats.heartbeats += task.handle.beats
        log.warning("abandoned a step: %s", why, extra={**ids(task), "reason": why})
        end_span(task, None, f"abandoned: {why}")

    def free_slot(self, task: Task) -> None:
        """Free the slot of a task whose handling failed (its step may still run)."""
        self._rerunning.discard(task)
        self._runner_of(task).abandon(task)

    def _execute(self, task: Task) -> AttemptResult:
        """On a slot's thread: the step function, inside its span's context."""
        assert task.data is not None
        token = _attach(task.span)
        try:
            return execute_step(self._registry, task.step, task.data, task.handle)
        finally:
            _detach(token)

    async def _execute_async(self, task: Task) -> AttemptResult:
        assert task.data is not None
        return await execute_async_step(self._registry, task.step, task.data, task.handle)

    def _ended(
        self, task: Task, outcome: AttemptResult | None, started_ns: int, ended_ns: int
    ) -> None:
        self._post(Ended(task, outcome, started_ns, ended_ns))

    def _over(self, task: Task) -> None:
        self._post(Over(task))


def end_span(task: Task, outcome: AttemptResult | None, why: str | None = None) -> None:
    span, task.span = task.span, None
    if span is None:
        return
    if outcome is not None and outcome.error is None:
        end_ok(span, outcome.outcome.value, attempt=task.key.attempt)
    else:
        end_error(span, RuntimeError(why or (outcome.error if outcome else "") or "failed"))


def _attach(span: Any) -> object | None:
    if span is None:
        return None
    return otel_context.attach(trace.set_span_in_context(span))


def _detach(token: object | None) -> None:
    if token is not None:
        otel_context.detach(token)  # type: ignore[arg-type]
