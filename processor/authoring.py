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

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, overload

from processor.core.routing import DEFAULT_QUEUE
from processor.core.workflow import ValidationError, WorkflowDef, parse_workflow
from processor.worker.steps import StepFunction, StepRegistry

Duration = int | str | timedelta

_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def duration_ms(value: Duration, what: str = "duration") -> int:
    """``value`` in whole milliseconds; ValidationError naming ``what`` when it is not a
    duration (a negative one included)."""
    if isinstance(value, bool):
        raise ValidationError(f"{what}: expected a duration, got {value!r}")
    if isinstance(value, int):
        ms = value
    elif isinstance(value, timedelta):
        ms = round(value.total_seconds() * 1000)
    elif isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        ms = round(float(match.group(1)) * _UNIT_MS[match.group(2)])
    else:
        raise ValidationError(
            f"{what}: expected milliseconds, a timedelta or text such as '500ms', '15s', '10m',"
            f" '2h', '1d'; got {value!r}"
        )
    if ms < 0:
        raise ValidationError(f"{what}: must not be negative, got {value!r}")
    return ms


def _optional_ms(value: Duration | None, what: str) -> int | None:
    """``duration_ms`` of an optional duration (None stays None)."""
    return None if value is None else duration_ms(value, what)


@dataclass(frozen=True)
class Retry:
    """A step's retry policy: at most ``max_attempts`` attempts, the n-th retry waiting
    ``backoff * multiplier ** (n - 1)``, never more than ``max_backoff``."""

    max_attempts: int = 3
    backoff: Duration = 100
    multiplier: float = 2.0
    max_backoff: Duration = "60s"

    def to_json(self) -> dict[str, Any]:
        return {
            "max_attempts": self.max_attempts,
            "backoff_ms": duration_ms(self.backoff, "retry.backoff"),
            "backoff_multiplier": float(self.multiplier),
            "max_backoff_ms": duration_ms(self.max_backoff, "retry.max_backoff"),
        }


@dataclass(frozen=True)
class Concurrency:
    """At most ``limit`` attempts of the step in flight at once across runs, counted apart
    per value of ``key`` (a dotted path in the run's input, e.g. ``"customer.id"``) when
    given. Steps naming the same limit (``name``; the step's type by default) share it."""

    limit: int
    key: str | None = None
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"limit": self.limit}
        if self.key is not None:
            raw["key"] = self.key
        if self.name is not None:
            raw["name"] = self.name
        return raw


@dataclass(frozen=True)
class RateLimit:
    """At most ``limit`` attempts of the step dispatched in any window of ``per`` (a
    duration: ``"1m"``, ``"1s"``, milliseconds as a number), across runs; shared by name."""

    limit: int
    per: Duration = "1s"
    name: str | None = None

    def to_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {
            "limit": self.limit,
            "per_s": duration_ms(self.per, "rate_limit.per") / 1000,
        }
        if self.name is not None:
            raw["name"] = self.name
        return raw


@dataclass(frozen=True)
class _Step:
    name: str
    step_type: str
    after: tuple[str, ...]
    timeout_ms: int
    retry: Retry | None
    queue: str
    heartbeat_timeout_ms: int | None
    # A map step: (items_from, max_items, parallelism); None for a plain one.
    mapping: tuple[str | None, int, int] | None = None
    concurrency: Concurrency | None = None
    rate_limit: RateLimit | None = None
    schedule_to_start_ms: int | None = None
    schedule_to_close_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"name": self.name, "type": self.step_type}
        if self.mapping is not None:
            items_from, max_items, parallelism = self.mapping
            raw["kind"] = "map"
            if items_from is not None:
                raw["items_from"] = items_from
            raw |= {"max_items": max_items, "parallelism": parallelism}
        if self.after:
            raw["depends_on"] = list(self.after)
        if self.retry is not None:
            raw["retry"] = self.retry.to_json()
        raw["timeout_ms"] = self.timeout_ms
        if self.queue != DEFAULT_QUEUE:
            raw["queue"] = self.queue
        if self.heartbeat_timeout_ms is not None:
            raw["heartbeat_timeout_ms"] = self.heartbeat_timeout_ms
        if self.schedule_to_start_ms is not None:
            raw["schedule_to_start_ms"] = self.schedule_to_start_ms
        if self.schedule_to_close_ms is not None:
            raw["schedule_to_close_ms"] = self.schedule_to_close_ms
        if self.concurrency is not None:
            raw["concurrency"] = self.concurrency.to_json()
        if self.rate_limit is not None:
            raw["rate_limit"] = self.rate_limit.to_json()
        return raw


@dataclass(frozen=True)
class _WaitStep:
    name: str
    signal: str
    after: tuple[str, ...]
    timeout_ms: int
    retry: Retry

    def to_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"name": self.name, "kind": "wait", "signal": self.signal}
        if self.after:
            raw["depends_on"] = list(self.after)
        raw["retry"] = self.retry.to_json()
        raw["timeout_ms"] = self.timeout_ms
        return raw


@dataclass(frozen=True)
class _ChildStep:
    name: str
    workflow: str
    version: int | None
    input_from: str | None
    after: tuple[str, ...]
    timeout_ms: int
    retry: Retry

    def to_json(self) -> dict[str, Any]:
        raw: dict[str, Any] = {"name": self.name, "kind": "workflow", "workflow": self.workflow}
        if self.version is not None:
            raw["version"] = self.version
        if self.input_from is not None:
            raw["input_from"] = self.input_from
        if self.after:
            raw["depends_on"] = list(self.after)
        raw["retry"] = self.retry.to_json()
        raw["timeout_ms"] = self.timeout_ms
        return raw


Dependency = str | Callable[..., object]


def _names(dependencies: Iterable[Dependency], wf: Workflow) -> set[str]:
    return {d if isinstance(d, str) else wf._names.get(id(d), "") for d in dependencies}


def _json_schema(source: Mapping[str, Any] | type) -> dict[str, Any]:
    """The JSON Schema ``source`` is or gives (a model class's ``model_json_schema()``)."""
    if isinstance(source, Mapping):
        return dict(source)
    produce = getattr(source, "model_json_schema", None)
    if not callable(produce):
        raise ValidationError(
            f"input_schema: expected a JSON Schema (a dict) or a model class with"
            f" model_json_schema() (a pydantic model), got {source!r}"
        )
    schema = produce()
    if not isinstance(schema, dict):
        raise ValidationError(f"input_schema: {source!r}.model_json_schema() gave {schema!r}")
    return schema


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
    ) -> None:
        """``input_schema``: the JSON Schema a run's input must match (a start is refused
        otherwise, saying where), or a model class that gives one (a pydantic model: its
        ``model_json_schema()``); steps read the input as the model with
        ``ctx.input_as(Model)``."""
        self.name = name
        self.version = version
        self.description = description
        self.output = output
        self.input_schema = _json_schema(input_schema) if input_schema is not None else None
        self.registry = registry if registry is not None else StepRegistry()
        self._steps: list[_Step | _WaitStep | _ChildStep] = []
        self._names: dict[int, str] = {}  # id(function) -> its step's name

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
    ) -> StepFunction | Callable[[StepFunction], StepFunction]:
        """Add a step run by the decorated function (plain or ``async def``): named after
        the function unless ``name`` says otherwise, of type ``type`` (the function's name by
        default), after the steps in ``after`` (their functions or names), with its deadline
        (``timeout``), retry policy, queue, heartbeat timeout and limits (``concurrency``,
        ``rate_limit``: docs/usage.md#limits). Usable bare (``@wf.step``)
        or with options. The function is returned unchanged."""
        after = tuple(after)

        def add(function: StepFunction) -> StepFunction:
            function_name = str(getattr(function, "__name__", ""))
            step_name = name if name is not None else function_name
            if any(s.name == step_name for s in self._steps):
                raise ValidationError(f"workflow {self.name!r}: step {step_name!r} is added twice")
            where = f"workflow {self.name!r}, step {step_name!r}"
            heartbeat = (
                None
                if heartbeat_timeout is None
                else duration_ms(heartbeat_timeout, f"{where}: heartbeat_timeout")
            )
            step = _Step(
                name=step_name,
                step_type=type if type is not None else function_name,
                after=tuple(self._dependency(d, where) for d in after),
                timeout_ms=duration_ms(timeout, f"{where}: timeout"),
                retry=retry,
                queue=queue,
                heartbeat_timeout_ms=heartbeat,
                concurrency=concurrency,
                rate_limit=rate_limit,
                schedule_to_start_ms=_optional_ms(schedule_to_start, f"{where}: schedule_to_start"),
                schedule_to_close_ms=_optional_ms(schedule_to_close, f"{where}: schedule_to_close"),
            )
            registered = self.registry.step(step.step_type)(function)
            self._steps.append(step)
            self._names[id(function)] = step.name
            return registered

        return add(fn) if fn is not None else add

    def map(
        self,
        *,
        items_from: Dependency | None = None,
        max_items: int = 1_000,
        parallelism: int = 10,
        name: str | None = None,
        type: str | None = None,
        after: Iterable[Dependency] = (),
        timeout: Duration = "30s",
        retry: Retry | None = None,
        queue: str = DEFAULT_QUEUE,
        concurrency: Concurrency | None = None,
        rate_limit: RateLimit | None = None,
        schedule_to_start: Duration | None = None,
        schedule_to_close: Duration | None = None,
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
            concurrency=concurrency,
            rate_limit=rate_limit,
            schedule_to_start=schedule_to_start,
            schedule_to_close=schedule_to_close,
        )

        def add(function: StepFunction) -> StepFunction:
            registered = register(function)
            plain = self._steps[-1]
            assert isinstance(plain, _Step)
            self._steps[-1] = replace(plain, mapping=(source, max_items, parallelism))
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
    ) -> str:
        """Add a step that waits for the first signal named ``signal`` sent to the run
        (`ductor signal RUN NAME --payload JSON`, ``client.send_signal``): an approval, a
        person's answer. Its output is the signal's payload; after ``timeout`` (default a
        week) the attempt times out, and ``retry`` says whether it waits again (once by
        default). Returns the step's name, for ``after=`` of the steps that follow."""
        if any(s.name == name for s in self._steps):
            raise ValidationError(f"workflow {self.name!r}: step {name!r} is added twice")
        where = f"workflow {self.name!r}, step {name!r}"
        self._steps.append(
            _WaitStep(
                name=name,
                signal=signal,
                after=tuple(self._dependency(d, where) for d in after),
                timeout_ms=duration_ms(timeout, f"{where}: timeout"),
                retry=retry or Retry(max_attempts=1),
            )
        )
        return name

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
    ) -> str:
        """Add a step that starts a child run of ``workflow`` (its ``version``, or the latest
        when the child starts) and ends as it does: with the child's output, or failed with
        its failure. The child's input is this run's input, or the output of ``input_from``
        (one of ``after``). ``timeout`` (default a day) bounds the wait for the child (which
        is cancelled then, as it is when this run is cancelled or fails); ``retry`` (once by
        default) says whether another child run is started after a failure. Returns the
        step's name, for ``after=`` of the steps that follow."""
        if any(s.name == name for s in self._steps):
            raise ValidationError(f"workflow {self.name!r}: step {name!r} is added twice")
        where = f"workflow {self.name!r}, step {name!r}"
        self._steps.append(
            _ChildStep(
                name=name,
                workflow=workflow.name if isinstance(workflow, Workflow) else workflow,
                version=version,
                input_from=None if input_from is None else self._dependency(input_from, where),
                after=tuple(self._dependency(d, where) for d in after),
                timeout_ms=duration_ms(timeout, f"{where}: timeout"),
                retry=retry or Retry(max_attempts=1),
            )
        )
        return name

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
        """The definition as JSON (schemas/workflow.schema.json), as written by hand."""
        raw: dict[str, Any] = {"name": self.name, "version": self.version}
        if self.description is not None:
            raw["description"] = self.description
        raw["steps"] = [s.to_json() for s in self._steps]
        if self.output is not None:
            raw["output"] = self.output if isinstance(self.output, str) else dict(self.output)
        if self.input_schema is not None:
            raw["input_schema"] = self.input_schema
        return raw

    def definition(self) -> WorkflowDef:
        """The validated definition (ValidationError says what is wrong and where)."""
        return parse_workflow(self.to_json())

    def __repr__(self) -> str:
        steps = ", ".join(s.name for s in self._steps)
        return f"Workflow({self.name!r}, version={self.version}, steps=[{steps}])"


__all__ = ["Concurrency", "Duration", "RateLimit", "Retry", "Workflow", "duration_ms"]
