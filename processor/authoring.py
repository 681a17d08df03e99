"""Workflows written in Python, next to their steps: the same definition the JSON schema
describes (schemas/workflow.schema.json; the JSON stays the stored and wire form), with each
step's options beside its function.

    from processor import Retry, StepContext, Workflow

    checkout = Workflow("checkout", version=2, output="confirm")

    @checkout.step(timeout="15s", retry=Retry(3, backoff="500ms"))
    def charge(ctx: StepContext) -> dict[str, str]: ...

    @checkout.step(after=[charge])
    def confirm(ctx: StepContext) -> dict[str, str]: ...

``ductor workflows register my_app.flows:checkout`` registers it; ``ductor worker --app
my_app.flows:checkout`` runs its steps (a workflow carries the registry of its step functions;
several workflows may share one, ``Workflow(..., registry=...)``). ``definition()`` is the
validated ``WorkflowDef``, equal to the one parsed from the same JSON; ``to_json()`` that JSON.
A step's type is its function's name unless ``type=`` says otherwise.

Durations are milliseconds (an int), a ``timedelta``, or text: ``"500ms"``, ``"15s"``,
``"10m"``, ``"2h"``, ``"1d"``. Nothing here touches a service.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, overload

from processor.authoring_options import Compensate, Concurrency, RateLimit, Retry
from processor.core.durations import Duration, duration_ms, optional_ms
from processor.core.routing import DEFAULT_QUEUE
from processor.core.run_input import schema_of
from processor.core.skips import decides
from processor.core.step_parse import parse_step
from processor.core.workflow import handler_to_json, parse_workflow, step_to_json
from processor.core.workflow_def import (
    FAILURE_NODE,
    MAP,
    MAP_ITEMS,
    MAP_PARALLELISM,
    ON_FAILURE_NODE,
    ON_TIMEOUT_FAIL,
    WAIT,
    WORKFLOW,
    StepDef,
    ValidationError,
    WorkflowDef,
    undo_node,
)
from processor.io.runtime.module_source import creating_module
from processor.worker.steps import StepFunction, StepRegistry


@dataclass(frozen=True)
class _Declared:
    """A step as declared: its definition, but for the options written in this API's terms
    (durations of a retry policy, limits named after the step's type by default), which are
    resolved when the definition is asked for, where a mistake in them is reported."""

    step: StepDef
    retry: Retry | None = None
    concurrency: Concurrency | None = None
    rate_limit: RateLimit | None = None

    def definition(self, where: str) -> StepDef:
        """The step's definition, ``where`` its place in the workflow's."""
        step, step_type = self.step, self.step.step_type
        concurrency = self.concurrency
        return replace(
            step,
            retry=step.retry if self.retry is None else self.retry.policy(),
            concurrency=None if concurrency is None else concurrency.limit_of(step_type, where),
            rate_limit=None if self.rate_limit is None else self.rate_limit.limit_of(step_type),
        )


Dependency = str | Callable[..., object]
Undoing = str | Callable[..., object] | Compensate  # a compensation's or a handler's task


def _names(dependencies: Iterable[Dependency], wf: Workflow) -> set[str]:
    return {d if isinstance(d, str) else wf._names.get(id(d), "") for d in dependencies}


class Workflow:
    """A workflow definition built in code, and the registry of its step functions."""

    def __init__(
        self,
        name: str,
        version: int = 1,
        *,
        description: str | None = None,
        output: str | Mapping[str, str] | None = None,
        input_schema: Mapping[str, Any] | type | None = None,
        registry: StepRegistry | None = None,
        timeout: Duration | None = None,
        concurrency: Concurrency | None = None,
        on_failure: Undoing | None = None,
    ) -> None:
        """``input_schema``: the JSON Schema a run's input must match (a start is refused
        otherwise, saying where), or a model class that gives one (a pydantic model: its
        ``model_json_schema()``); steps read the input as ``ctx.input_as(Model)``.
        ``timeout``: how long a run may take from its start (``timeout_ms``);
        ``concurrency``: at most ``limit`` live runs per value of its ``key`` in the input
        (``Concurrency(1, key="customer.id")``), the others pending in line. ``on_failure``:
        the task run once a run failed, as ``compensate`` (docs/usage.md#failure-handlers)."""
        self.name = name
        self.version = version
        self.description = description
        self.output = output
        self.input_schema = schema_of(input_schema) if input_schema is not None else None
        self.timeout_ms = optional_ms(timeout, "workflow: timeout")
        self.concurrency = None if concurrency is None else concurrency.run_limit_of(name)
        self.registry = registry if registry is not None else StepRegistry()
        self._steps: list[_Declared] = []
        self._names: dict[int, str] = {}  # id(function) -> its step's name
        self.on_failure = None if on_failure is None else self._task(on_failure)  # (sagas.py)
        self.defined_in = creating_module(__name__)  # its text is kept: module_source.py

    @overload
    def step(self, fn: StepFunction, /) -> StepFunction: ...

    @overload
    def step(
        self,
        fn: None = None,
        /,
        *,
        name: str | None = None,
        type: str | None = None,
        after: Iterable[Dependency] = (),
        timeout: Duration = "30s",
        retry: Retry | None = None,
        queue: str = DEFAULT_QUEUE,
        heartbeat_timeout: Duration | None = None,
        concurrency: Concurrency | None = None,
        rate_limit: RateLimit | None = None,
        schedule_to_start: Duration | None = None,
        schedule_to_close: Duration | None = None,
        when: str | None = None,
        run_if: str | None = None,
        version: int | None = None,
        compensate: Undoing | None = None,
    ) -> Callable[[StepFunction], StepFunction]: ...

    def step(
        self,
        fn: StepFunction | None = None,
        /,
        *,
        name: str | None = None,
        type: str | None = None,
        after: Iterable[Dependency] = (),
        timeout: Duration = "30s",
        retry: Retry | None = None,
        queue: str = DEFAULT_QUEUE,
        heartbeat_timeout: Duration | None = None,
        concurrency: Concurrency | None = None,
        rate_limit: RateLimit | None = None,
        schedule_to_start: Duration | None = None,
        schedule_to_close: Duration | None = None,
        when: str | None = None,
        run_if: str | None = None,
        version: int | None = None,
        compensate: Undoing | None = None,
    ) -> StepFunction | Callable[[StepFunction], StepFunction]:
        """Add a step run by the decorated function (plain or ``async def``): named after
        the function unless ``name`` says otherwise, of type ``type`` (the function's name by
        default), after the steps in ``after`` (their functions or names), with its deadline
        (``timeout``), retry policy, queue, heartbeat timeout and limits (``concurrency``,
        ``rate_limit``: docs/usage.md#limits). ``when``: the condition it runs on (false:
        skipped), ``run_if="all_done"``: it runs even when the steps it follows were all
        skipped (docs/usage.md#conditions-and-skips). ``version``: the function is version N
        of its type, and every run runs that version (docs/usage.md#versioned-step-code;
        absent: version 1, and a run runs the newest version its workers serve when it
        starts). ``compensate``: what undoes it (docs/usage.md#compensation-sagas). Bare
        (``@wf.step``) or with options; the function is returned unchanged."""
        after = tuple(after)

        def add(function: StepFunction) -> StepFunction:
            function_name = str(getattr(function, "__name__", ""))
            step_name = name if name is not None else function_name
            where = self._new_step(step_name)
            step = StepDef(
                name=step_name,
                step_type=type if type is not None else function_name,
                depends_on=tuple(self._dependency(d, where) for d in after),
                timeout_ms=duration_ms(timeout, f"{where}: timeout"),
                queue=queue,
                heartbeat_timeout_ms=optional_ms(heartbeat_timeout, f"{where}: heartbeat_timeout"),
                schedule_to_start_ms=optional_ms(schedule_to_start, f"{where}: schedule_to_start"),
                schedule_to_close_ms=optional_ms(schedule_to_close, f"{where}: schedule_to_close"),
                version=version,
            )
            if when is not None or run_if is not None:
                step = decides(step, when, run_if, where)
            if compensate is not None:
                undo = self._task(compensate, undo_node(step.name), step.name, step.name)
                step = replace(step, compensate=undo)
            registered = self.registry.step(step.step_type, version or 1)(function)
            self._steps.append(_Declared(step, retry, concurrency, rate_limit))
            self._names[id(function)] = step.name
            return registered

        return add(fn) if fn is not None else add

    def map(
        self,
        *,
        items_from: Dependency | None = None,
        max_items: int = MAP_ITEMS,
        parallelism: int = MAP_PARALLELISM,
        name: str | None = None,
        type: str | None = None,
        after: Iterable[Dependency] = (),
        timeout: Duration = "30s",
        retry: Retry | None = None,
        queue: str = DEFAULT_QUEUE,
        heartbeat_timeout: Duration | None = None,
        concurrency: Concurrency | None = None,
        rate_limit: RateLimit | None = None,
        schedule_to_start: Duration | None = None,
        schedule_to_close: Duration | None = None,
        when: str | None = None,
        run_if: str | None = None,
        version: int | None = None,
    ) -> Callable[[StepFunction], StepFunction]:
        """Add a map step run by the decorated function once per item of a list: the run's
        input, or the output of ``items_from`` (a dependency: its function or name, which is
        then one of ``after``), at most ``max_items`` items and ``parallelism`` at once; the
        function reads its item as ``ctx.item`` (and its position, ``ctx.index``), each item
        is retried by ``retry``, and the step's output is the items' outputs, in order."""
        source = None if items_from is None else self._dependency(items_from, f"map {name}")
        after = tuple(after)
        if source is not None and source not in _names(after, self):
            after = (*after, source)
        register = self.step(
            name=name,
            type=type,
            after=after,
            timeout=timeout,
            retry=retry,
            queue=queue,
            heartbeat_timeout=heartbeat_timeout,
            concurrency=concurrency,
            rate_limit=rate_limit,
            schedule_to_start=schedule_to_start,
            schedule_to_close=schedule_to_close,
            when=when,
            run_if=run_if,
            version=version,
        )

        def add(function: StepFunction) -> StepFunction:
            registered = register(function)
            declared = self._steps[-1]
            mapped = replace(declared.step, kind=MAP, items_from=source, max_items=max_items)
            mapped = replace(mapped, parallelism=parallelism)
            self._steps[-1] = replace(declared, step=mapped)
            return registered

        return add

    def wait(
        self,
        name: str,
        *,
        signal: str,
        after: Iterable[Dependency] = (),
        timeout: Duration = "7d",
        retry: Retry | None = None,
        on_timeout: str = ON_TIMEOUT_FAIL,
        default: Any = None,
        when: str | None = None,
        run_if: str | None = None,
    ) -> str:
        """Add a step that waits for the first signal named ``signal`` sent to the run
        (`ductor signal RUN NAME --payload JSON`): its output is the signal's payload. After
        ``timeout`` (a week) the attempt times out, ``retry`` says whether it waits again (no);
        then the step fails, or (``on_timeout="continue"``) succeeds with ``default`` as its
        output. Returns its name, for ``after=`` of the steps after it."""
        raw = {"kind": WAIT, "signal": signal, "on_timeout": on_timeout, "default": default}
        raw |= {"when": when, "run_if": run_if}
        step = self._parsed(name, after, raw, timeout_ms=duration_ms(timeout, "timeout"))
        self._steps.append(_Declared(step, retry or Retry(max_attempts=1)))
        return name

    def sleep(
        self,
        name: str,
        *,
        duration: Duration | None = None,
        until: str | None = None,
        after: Iterable[Dependency] = (),
        when: str | None = None,
        run_if: str | None = None,
    ) -> str:
        """Add a step that sleeps, durably and on no worker: for ``duration`` from its start,
        or until the time ``until`` finds in the run (``"$.input.remind_at"``, or
        ``"$.steps.<step>.output.<field>"`` of one of ``after``): an ISO-8601 time with a
        zone, or epoch milliseconds. Its output: ``{"slept_until_ms": <that time>}``."""
        ms = None if duration is None else duration_ms(duration, f"{name}: duration")
        raw = {"kind": "sleep", "duration_ms": ms, "until": until, "when": when, "run_if": run_if}
        self._steps.append(_Declared(self._parsed(name, after, raw)))
        return name

    def _parsed(
        self, name: str, after: Iterable[Dependency], raw: dict[str, Any], **fields: Any
    ) -> StepDef:
        where = self._new_step(name)
        deps = [self._dependency(d, where) for d in after]
        given = {k: v for k, v in raw.items() if v is not None}
        step = parse_step({"name": name, "depends_on": deps, **given}, where)
        return replace(step, **fields)

    def child(
        self,
        name: str,
        *,
        workflow: str | Workflow,
        version: int | None = None,
        input_from: Dependency | None = None,
        after: Iterable[Dependency] = (),
        timeout: Duration = "1d",
        retry: Retry | None = None,
        when: str | None = None,
        run_if: str | None = None,
    ) -> str:
        """Add a step that starts a child run of ``workflow`` (its ``version``, or the latest)
        and ends as it does (its output, or its failure); the child's input is this run's, or
        the output of ``input_from`` (one of ``after``). ``timeout`` (a day) bounds the wait
        for the child (then cancelled, as when this run is cancelled or fails); ``retry``
        (once) says whether another child run starts after a failure. Returns its name."""
        source = None if input_from is None else self._dependency(input_from, name)
        child = workflow.name if isinstance(workflow, Workflow) else workflow
        raw = {"kind": WORKFLOW, "workflow": child, "version": version, "input_from": source}
        raw |= {"when": when, "run_if": run_if}
        step = self._parsed(name, after, raw, timeout_ms=duration_ms(timeout, "timeout"))
        self._steps.append(_Declared(step, retry or Retry(max_attempts=1)))
        return name

    def _new_step(self, name: str) -> str:
        """Where a new step ``name`` is declared (for messages), once it is known to be new."""
        if any(s.step.name == name for s in self._steps):
            raise ValidationError(f"workflow {self.name!r}: step {name!r} is added twice")
        return f"workflow {self.name!r}, step {name!r}"

    def _task(
        self, task: Undoing, name: str = ON_FAILURE_NODE, reads: str = FAILURE_NODE, of: str = ""
    ) -> StepDef:
        """A compensation (of step ``of``) or the failure handler; its function registered."""
        given = task if isinstance(task, Compensate) else Compensate(task)
        if not isinstance(given.step, str):
            self.registry.step(given.type_name(), given.version or 1)(given.step)
        return given.definition(name, reads, f"workflow {self.name!r}, the task of {of!r}")

    def _dependency(self, dependency: Dependency, where: str) -> str:
        if isinstance(dependency, str):
            return dependency
        found = self._names.get(id(dependency))
        if found is None:
            raise ValidationError(
                f"{where}: after {getattr(dependency, '__name__', dependency)!r}, which is not"
                f" a step of this workflow (add it first, or name it)"
            )
        return found

    def to_json(self) -> dict[str, Any]:
        """The definition as JSON (schemas/workflow.schema.json): each step as the core's one
        writer writes it (core/workflow.py), the workflow's own fields as they were given."""
        raw: dict[str, Any] = {"name": self.name, "version": self.version}
        if self.description is not None:
            raw["description"] = self.description
        raw["steps"] = [
            step_to_json(s.definition(f"workflow.steps[{i}]")) for i, s in enumerate(self._steps)
        ]
        if self.output is not None:
            raw["output"] = self.output if isinstance(self.output, str) else dict(self.output)
        if self.input_schema is not None:
            raw["input_schema"] = self.input_schema
        if self.concurrency is not None:
            raw["concurrency"] = self.concurrency.to_json()
        if self.on_failure is not None:
            raw["on_failure"] = handler_to_json(self.on_failure)
        return raw if self.timeout_ms is None else raw | {"timeout_ms": self.timeout_ms}

    def definition(self) -> WorkflowDef:
        """The validated definition (ValidationError says what is wrong and where)."""
        return parse_workflow(self.to_json())

    def __repr__(self) -> str:
        steps = ", ".join(s.step.name for s in self._steps)
        return f"Workflow({self.name!r}, version={self.version}, steps=[{steps}])"


__all__ = ["Compensate", "Concurrency", "Duration", "RateLimit", "Retry", "Workflow"]
__all__ += ["duration_ms"]
