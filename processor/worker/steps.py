"""Step functions: the registry a worker runs them from, what each is given, and running one
attempt.

Register your own with ``@registry.step("my_type")``: a plain function or an ``async def``
one, version 1 of its type unless it says (``@registry.step("my_type", version=2)``: a run
keeps the version it started with, docs/usage.md#versioned-step-code). It receives a
``StepContext`` (which attempt of which step, by when, the run's input and the outputs of the
step's dependencies, ``heartbeat()``, ``tag()`` and ``cancelled``) and returns a
JSON-serialisable output. Raising fails the attempt: ``StepFailed`` (or any exception)
leaves the next attempt to the step's retry policy, ``NonRetryable`` fails the step at once.
See docs/operations/steps.md#writing-step-functions.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
import traceback
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar, cast

import orjson

from processor.core.bounds import MAX_HEARTBEAT_BYTES, MAX_JSON_BYTES, json_problem
from processor.core.failures import bounded_error, bounded_traceback, first_user_frame
from processor.core.model import StepOutcome
from processor.core.run_search import step_tag_problem
from processor.core.step_task import NO_DEPS, StepData, StepTask
from processor.core.versions import VERSION_MARK, parse_served, served_key
from processor.core.workflow_def import MAX_STEP_VERSION
from processor.worker.handles import StepHandle

# The largest output a step may return (its encoded JSON): the bound of every stored value
# (core/bounds.py). It is stored in Postgres, read by the steps that depend on it and may
# become part of the run's output; data larger than this belongs in object storage, with its
# key as the output. A larger output fails the attempt.
MAX_STEP_OUTPUT_BYTES = MAX_JSON_BYTES


InputT = TypeVar("InputT")


class StepFailed(Exception):
    """Raised by a step function to fail its attempt with a message; the step's retry
    policy decides whether another attempt follows."""


class NonRetryable(StepFailed):
    """Raised by a step function to fail the step at once, whatever attempts its retry policy
    has left (a card declined, an order that cannot be valid)."""


class RegistrationError(ValueError):
    """A step registry refused a registration (the message says why)."""


@dataclass(frozen=True)
class StepContext:
    """What a step function is given: which attempt of which step it runs, by when, and its
    data: the run's input (``{}`` when the run was started without one) and the outputs of
    the steps it depends on, by step name (read-only; a step with no dependencies gets an
    empty mapping). The data is the same whether the task carried it or the worker fetched it.
    """

    run_id: str
    node: str
    attempt: int
    deadline_ms: int
    input: Any = None
    deps: Mapping[str, Any] = field(default_factory=lambda: NO_DEPS)
    _handle: StepHandle | None = field(default=None, repr=False, compare=False)
    # A map step's item: the element of its list this attempt runs, and its position there
    # (None for any other step).
    item: Any = None
    index: int | None = None
    # The details an earlier execution of this step gave its last heartbeat (an earlier
    # attempt's, or this one's before its worker died), None when none gave any: where a
    # long step that records its progress with its heartbeats goes on from.
    last_heartbeat: Any = None

    def heartbeat(self, details: Any = None) -> None:
        """Say the step is alive, and, with ``details`` (any JSON value, at most 64 KiB
        encoded), how far it got: the last details given are recorded (a few times per
        heartbeat timeout at most), shown by `ductor inspect` and given to the step's next
        execution as ``last_heartbeat``. A step whose workflow declares
        ``heartbeat_timeout_ms`` must call it at least that often once it started, or its
        attempt fails before its deadline. Raises ValueError for details beyond the
        bounds."""
        encoded = None
        if details is not None:
            problem = json_problem(details, MAX_HEARTBEAT_BYTES)
            if problem is not None:
                raise ValueError(problem.describe("the heartbeat's progress"))
            encoded = orjson.dumps(details).decode()
        if self._handle is not None:
            self._handle.heartbeat(encoded)

    def tag(self, key: str, value: str) -> None:
        """Tag the run with ``key`` = ``value``: `ductor runs list --tag key=value`, the
        client's ``list_runs(tags=...)`` and the web page find it by its tags, and `ductor
        inspect` shows them. The tags are recorded with this attempt's result, in the same
        statement, if it succeeds; a failed, timed-out or given-up attempt records none
        (its retry sets them again). A key set again, by this step or a later one (or given
        at the run's start), takes the latest value recorded. Bounded (core/bounds.py): a key
        is 1 to 64 letters, digits, '_', '.', ':', '/' or '-', starting with a letter or
        digit; a value a string of at most 200 characters; a run keeps at most 16 keys set
        by its steps. Raises ValueError beyond the bounds (the attempt fails, as for any
        exception); a result whose tags would take the run past 16 keys set by its steps
        (other steps set the others) is refused when it is recorded, and the step fails,
        finally, saying so."""
        kept = self._handle.tags if self._handle is not None else {}
        problem = step_tag_problem(key, value, kept)
        if problem is not None:
            raise ValueError(problem)
        if self._handle is not None:
            self._handle.tag(key, value)

    def input_as(self, kind: type[InputT]) -> InputT:
        """The run's input as ``kind``: a pydantic model (its ``model_validate``), a dataclass
        (built from the input object's keys), or any other type called with the input. The
        input matched the workflow's ``input_schema`` when the run started, if it declares one
        (``Workflow(..., input_schema=kind)`` declares the model's)."""
        validate = getattr(kind, "model_validate", None)
        if callable(validate):
            return cast(InputT, validate(self.input))
        if dataclasses.is_dataclass(kind) and isinstance(self.input, Mapping):
            return kind(**self.input)
        return kind(self.input)  # type: ignore[call-arg]

    @property
    def cancelled(self) -> bool:
        """True once the attempt no longer matters: its deadline passed, or the run was
        cancelled or ended, or the coordinator moved on from this attempt. A long step may
        check it between units of work and stop early (its result would be ignored)."""
        if self._handle is not None:
            return self._handle.cancelled
        return time.time() * 1000 >= self.deadline_ms


StepFn = Callable[[StepContext], Any]
AsyncStepFn = Callable[[StepContext], Awaitable[Any]]
# A step function as registered: the decorator returns it unchanged, with its own type, so
# a module of step functions type-checks under `mypy --strict` (and a function that does not
# take a StepContext is an error there).
StepFunction = TypeVar("StepFunction", bound=Callable[[StepContext], object])


class StepRegistry:
    """The step functions a worker runs, each registered for a step type at a version (1
    unless it says): a task runs only with the function of its version (core/versions.py)."""

    def __init__(self) -> None:
        self._steps: dict[str, StepFn | AsyncStepFn] = {}  # by served key: type, type@N
        self._async: set[str] = set()  # asked once per task: inspect is too slow for that

    def step(self, step_type: str, version: int = 1) -> Callable[[StepFunction], StepFunction]:
        """Register the decorated function (plain or ``async def``) as version ``version``
        of ``step_type`` (1 to 9999): several versions of a type may be registered, each its
        own function. A second function for the same type and version is refused
        (RegistrationError)."""
        if not isinstance(step_type, str) or not step_type:
            raise RegistrationError(f"a step type must be a non-empty string, not {step_type!r}")
        if VERSION_MARK in step_type:
            raise RegistrationError(
                f"step type {step_type!r}: {VERSION_MARK!r} marks a version in the worker"
                " registry; say the version with version=N"
            )
        if type(version) is not int or not 1 <= version <= MAX_STEP_VERSION:
            raise RegistrationError(
                f"step {step_type!r}: version must be an integer from 1 to {MAX_STEP_VERSION},"
                f" not {version!r}"
            )
        key = served_key(step_type, version)

        def register(fn: StepFunction) -> StepFunction:
            if not callable(fn):
                raise RegistrationError(f"step {step_type!r}: {fn!r} is not a function")
            known = self._steps.get(key)
            if known is not None and known is not fn:
                which = repr(step_type) + ("" if version == 1 else f" version {version}")
                raise RegistrationError(
                    f"step type {which} is registered twice: {_name(known)} and {_name(fn)};"
                    " a worker runs one function per type and version"
                )
            self._steps[key] = fn
            if inspect.iscoroutinefunction(fn):
                self._async.add(key)
            return fn

        return register

    def get(self, step_type: str, version: int = 1) -> StepFn | AsyncStepFn | None:
        return self._steps.get(step_type if version == 1 else served_key(step_type, version))

    def is_async(self, step_type: str, version: int = 1) -> bool:
        return (step_type if version == 1 else served_key(step_type, version)) in self._async

    def types(self) -> list[str]:
        """The step types it has a function for, at any version."""
        return sorted({parse_served(key)[0] for key in self._steps})

    def served(self) -> list[str]:
        """What it serves, as the instance registry says it: each type and version as its
        key (the type alone for version 1, ``type@N`` for N)."""
        return sorted(self._steps)


def _name(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class AttemptResult(NamedTuple):
    """An attempt's result as the worker records it. A failure raised by the step keeps the
    exception's type (``error_type``; ``error`` is ``"Type: message"``) and its traceback;
    a failure the worker decided (a deadline, a dead process) has neither, or a traceback
    that says why there is none."""

    outcome: StepOutcome
    output: Any = None
    error: str | None = None
    retryable: bool = True
    error_type: str | None = None
    traceback: str | None = None

    @staticmethod
    def failed(
        error: str,
        retryable: bool = True,
        error_type: str | None = None,
        traceback: str | None = None,
    ) -> AttemptResult:
        """The failure, its message and traceback storable and bounded (core/failures.py)."""
        kept = None if traceback is None else bounded_traceback(storable_text(traceback))
        kind = None if error_type is None else bounded_error(storable_text(error_type), 200)
        return AttemptResult(
            StepOutcome.FAILED, None, bounded_error(storable_text(error)), retryable, kind, kept
        )


def context_of(task: StepTask, data: StepData, handle: StepHandle | None = None) -> StepContext:
    """What the step function of ``task`` is given; its deadline is the attempt's (set when
    it started: its start plus its timeout)."""
    deadline = task.deadline_ms if handle is None else handle.deadline_ms
    last = None if handle is None else handle.last_details
    if task.item is None:
        return StepContext(
            task.run_id,
            task.node,
            task.attempt,
            deadline,
            data.input,
            data.deps,
            handle,
            last_heartbeat=last,
        )
    source = data.input if task.item.source is None else data.deps.get(task.item.source)
    position = task.item.position
    item = source[position] if isinstance(source, list) and position < len(source) else None
    return StepContext(
        task.run_id,
        task.node,
        task.attempt,
        deadline,
        data.input,
        data.deps,
        handle,
        item,
        position,
        last,
    )


def execute_step(
    registry: StepRegistry, task: StepTask, data: StepData, handle: StepHandle | None = None
) -> AttemptResult:
    """Run one attempt of a plain step function with its ``data`` (the task's own, or
    fetched): its output, or its failure as the attempt's result (never the worker's)."""
    fn = registry.get(task.step_type, task.step_version)
    if fn is None:
        return unknown_type(task)
    refused = checked_input(data)
    if refused is not None:
        return refused
    try:
        return checked_output(fn(context_of(task, data, handle)))
    except Exception as exc:  # a step's failure is the attempt's result, not the worker's
        return failure(exc)


async def execute_async_step(
    registry: StepRegistry, task: StepTask, data: StepData, handle: StepHandle | None = None
) -> AttemptResult:
    """``execute_step`` for an ``async def`` step function, on the caller's event loop."""
    fn = registry.get(task.step_type, task.step_version)
    if fn is None:
        return unknown_type(task)
    refused = checked_input(data)
    if refused is not None:
        return refused
    try:
        return checked_output(await fn(context_of(task, data, handle)))
    except Exception as exc:
        return failure(exc)


def unknown_type(task: StepTask) -> AttemptResult:
    """The failure of a task this worker has no function for (no live worker of its queue
    had: worker/handback.py), naming its type and the version its run pinned."""
    if task.step_version == 1:
        return AttemptResult.failed(f"no step function registered for type {task.step_type!r}")
    return AttemptResult.failed(
        f"no step function registered for type {task.step_type!r} version"
        f" {task.step_version} (its run pinned it: a worker must serve it, or `ductor runs"
        " upgrade` moves the run)"
    )


def failure(exc: BaseException) -> AttemptResult:
    """The failure of an attempt whose step raised ``exc``: ``"Type: message"``, the type,
    and the traceback from the step's own code on."""
    kind = type(exc).__name__
    try:
        message = str(exc)
    except Exception:  # (its __str__ raised: the type says what it was)
        message = "<its message could not be read>"
    retryable = not isinstance(exc, NonRetryable)
    return AttemptResult.failed(f"{kind}: {message}", retryable, kind, step_traceback(exc))


# The frames of the worker's own file: a step's exception is caught here, so its traceback
# begins with this module's frame, which the user did not write and does not need to read.
_OWN_FILES = frozenset({__file__})


def step_traceback(exc: BaseException) -> str | None:
    """``exc``'s traceback as Python prints it (with the exceptions it was raised from or
    while handling), from the first frame of the user's code on; None if it cannot be
    formatted (the caller bounds it)."""
    try:
        shown = traceback.TracebackException.from_exception(exc)
        frames = list(shown.stack)
        start = first_user_frame([f.filename for f in frames], _OWN_FILES)
        shown.stack = traceback.StackSummary.from_list(frames[start:])
        return "".join(shown.format())
    except Exception:  # a traceback nobody can format is no reason to lose the failure
        return None


def checked_output(output: Any) -> AttemptResult:
    """A step's return value as its result, or the failure that says why it cannot be
    stored: the result is stored as JSON, within the bounds of every stored value
    (core/bounds.py), so it is checked here, in the attempt. Such a failure is final: the
    same code would return the same value again."""
    problem = json_problem(output, MAX_STEP_OUTPUT_BYTES)
    if problem is not None:
        return AttemptResult.failed(
            f"OutOfBounds: {problem.describe('the output')}", retryable=False
        )
    return AttemptResult(StepOutcome.SUCCEEDED, output)


def checked_input(data: StepData) -> AttemptResult | None:
    """The failure of an attempt whose run's input is beyond the bounds, or None. Every door
    bounds an input before it is written; a child run's input is copied by Postgres from its
    parent's input or a step's output, and an aggregate (a map step's list of outputs, a
    child's output of several steps) may be deeper or larger than one value may be. The
    child's step then fails, finally, naming the path, and its parent's step fails with it."""
    problem = json_problem(data.input)
    if problem is None:
        return None
    return AttemptResult.failed(
        f"OutOfBounds: {problem.describe('the run input')}", retryable=False
    )


def storable_text(text: str) -> str:
    """``text`` as Postgres can store it (an attempt's error, a step's own message): a NUL
    replaced, a lone surrogate (text that is not Unicode: psycopg cannot even encode it, and
    the statement would fail before it is sent) written as its escape, ``\\ud800``."""
    text = text.replace("\x00", "\ufffd")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode()
