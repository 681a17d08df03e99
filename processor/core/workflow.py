"""Workflow definitions: steps, their retry policies and dependencies, a workflow's declared
output and the JSON Schema its input must match; parsed from JSON (``parse_workflow`` raises
``ValidationError`` naming the offending field) and written back canonically
(``workflow_to_json``). Pure values, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import cached_property
from graphlib import CycleError, TopologicalSorter
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from processor.core.limit_defs import LIMIT_NAME, MAX_LIMIT, ConcurrencyLimit, RateLimit
from processor.core.routing import DEFAULT_QUEUE


class ValidationError(ValueError):
    """Input that cannot be accepted; the message says what is wrong and where."""


# A queue's name goes into a topic name (``<prefix>.steps.<queue>``).
_QUEUE_NAME = re.compile(r"[A-Za-z0-9_-]{1,100}")

# The longest wait between two attempts a workflow may declare: a retry timer's target is
# never further ahead than this (intake.py rejects a wakeup that says otherwise).
MAX_BACKOFF_MS = 7 * 24 * 3600 * 1000


@dataclass(frozen=True)
class RetryPolicy:
    max_attempts: int = 3
    backoff_ms: int = 100
    backoff_multiplier: float = 2.0
    max_backoff_ms: int = 60_000

    def delay_after(self, attempt: int) -> int:
        """The wait before attempt ``attempt + 1`` once attempt ``attempt`` (from 1) failed."""
        raw = self.backoff_ms * self.backoff_multiplier ** max(0, attempt - 1)
        return int(min(raw, self.max_backoff_ms))


TASK, WAIT, WORKFLOW, MAP = "task", "wait", "workflow", "map"  # the kinds of step
# A signal's name: what ``ductor signal RUN NAME`` sends and a wait step waits for.
SIGNAL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,99}")
# A wait step waits a week unless it says otherwise (a person may be away).
WAIT_TIMEOUT_MS = 7 * 24 * 3600 * 1000
# A child workflow's step waits a day for its child run unless it says otherwise.
CHILD_TIMEOUT_MS = 24 * 3600 * 1000
# A map step runs at most this many items (``max_items``, default MAP_ITEMS), this many at once
# (``parallelism``, default MAP_PARALLELISM).
MAP_ITEMS, MAP_ITEMS_LIMIT = 1_000, 10_000
MAP_PARALLELISM, MAP_PARALLELISM_LIMIT = 10, 1_000


def item_node(step: str, index: int) -> str:
    """The node of item ``index`` of map step ``step`` in a run's state."""
    return f"{step}[{index}]"


@dataclass(frozen=True)
class StepDef:
    name: str
    step_type: str  # the function a worker runs ("" for a wait step: no worker runs it)
    depends_on: tuple[str, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Start-to-close: how long an attempt may run, counted from the moment a worker starts it
    # (its claim, io/postgres/step_attempts.py), never from its dispatch: time in a queue does not
    # count (core/tick.py, rule 4). A wait step's: how long it waits; a workflow step's: how
    # long its child run may take.
    timeout_ms: int = 30_000
    # The queue whose workers run it: each queue is a steps topic of its own (routing.py).
    queue: str = DEFAULT_QUEUE
    # A long step calls ``ctx.heartbeat()`` at least this often, or its attempt fails without
    # waiting for its deadline. None: no heartbeat is expected.
    heartbeat_timeout_ms: int | None = None
    # Schedule-to-start: how long an attempt may wait in its queue for a worker to start it;
    # past it the step fails, final. None: as long as it takes.
    schedule_to_start_ms: int | None = None
    # Schedule-to-close: how long the step may take in all, from the dispatch of its first
    # attempt (since the run was last resumed) to the end of its last; past it the step
    # fails, final. None: no bound.
    schedule_to_close_ms: int | None = None
    # "task": a worker runs it; "wait": it waits for the first signal named ``signal`` sent
    # to the run (before it or while it waits), and its output is that signal's payload.
    kind: str = TASK
    signal: str | None = None
    # "workflow": it starts a run of ``child_workflow`` (its ``child_version``, or the latest
    # when None) with the run's input, or the output of ``input_from`` (a dependency), and
    # ends as that child run does: its output the child's, or failed with its failure.
    child_workflow: str | None = None
    child_version: int | None = None
    input_from: str | None = None
    # "map": one attempt of ``step_type`` per item of a list, the run's input (``items_from``
    # None) or a dependency's output, at most ``max_items`` of them and ``parallelism`` at
    # once, each retried by the step's policy; its output is the items' outputs, in order.
    items_from: str | None = None
    max_items: int = MAP_ITEMS
    parallelism: int = MAP_PARALLELISM
    # Bounds on its dispatches, counted across runs (core/limits.py); for task and map steps.
    concurrency: ConcurrencyLimit | None = None
    rate_limit: RateLimit | None = None

    @property
    def limited(self) -> bool:
        return self.concurrency is not None or self.rate_limit is not None

    @property
    def waits(self) -> bool:
        return self.kind == WAIT

    @property
    def starts_child(self) -> bool:
        return self.kind == WORKFLOW

    @property
    def maps(self) -> bool:
        return self.kind == MAP

    @property
    def runs_on_a_worker(self) -> bool:
        """Whether its attempts are sent to the workers (a map's are its items')."""
        return self.kind == TASK


@dataclass(frozen=True)
class WorkflowOutput:
    """What a succeeded run stores as its output (``eec_workflow_run.output``): the output of
    one step (``step``), or a mapping of names to steps' outputs (``fields``, sorted by name:
    a JSON object's keys have no order, and the stored definition, jsonb, keeps none of its
    own, so a definition read back must equal the one registered)."""

    step: str | None = None
    fields: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> str | dict[str, str]:
        return self.step if self.step is not None else dict(self.fields)


@dataclass(frozen=True)
class WorkflowDef:
    name: str
    version: int
    steps: tuple[StepDef, ...]
    output: WorkflowOutput | None = None  # None: the workflow declares no output
    # The JSON Schema (draft 2020-12) a run's input must match, as canonical JSON text (keys
    # sorted: a value, compared and hashed as one); None: any input (core/run_input.py).
    input_schema: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.version)

    @cached_property
    def step_map(self) -> dict[str, StepDef]:
        """Steps by name (computed once per definition; definitions are immutable)."""
        return {s.name: s for s in self.steps}

    def step_for(self, node: str) -> StepDef:
        """The step a node of a run's state is of: a step, or an item of a map step
        (``resize[3]``)."""
        step = self.step_map.get(node)
        if step is None and node.endswith("]") and "[" in node:
            step = self.step_map.get(node[: node.rindex("[")])
            if step is not None and not step.maps:
                step = None
        if step is None:
            raise KeyError(node)
        return step

    @cached_property
    def only_tasks(self) -> bool:
        """Whether every step is a task (the tick's fast path: no wait, map or child)."""
        return all(s.kind == TASK for s in self.steps)

    @cached_property
    def has_limits(self) -> bool:
        """Whether a step bounds its dispatches (core/limits.py): the batch counts them."""
        return any(s.limited for s in self.steps)

    @cached_property
    def has_maps(self) -> bool:
        return any(s.maps for s in self.steps)

    @cached_property
    def signals(self) -> frozenset[str]:
        """The names its wait steps wait for (a signal of another name, but ``cancel``,
        would change nothing: core/landing.py refuses it)."""
        return frozenset(s.signal for s in self.steps if s.waits and s.signal is not None)

    @cached_property
    def has_children(self) -> bool:
        """Whether a step starts child runs (what the commit path then looks for)."""
        return any(s.starts_child for s in self.steps)

    @property
    def queues(self) -> list[str]:
        """The queues its steps run on, sorted."""
        return sorted({s.queue for s in self.steps})

    def step(self, name: str) -> StepDef:
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(name)


def _require(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise ValidationError(f"{where}: missing required field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValidationError(f"{where}.{key}: expected {_kind_name(kind)}, got {value!r}")
    return value


def _optional(
    obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any
) -> Any:
    if key not in obj:
        return default
    return _require(obj, key, kind, where)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def _check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ValidationError(f"{where}: unknown field(s) {', '.join(unknown)}")


def parse_retry(raw: Any, where: str) -> RetryPolicy:
    if not isinstance(raw, dict):
        raise ValidationError(f"{where}: expected an object")
    _check_keys(raw, {"max_attempts", "backoff_ms", "backoff_multiplier", "max_backoff_ms"}, where)
    policy = RetryPolicy(
        max_attempts=_optional(raw, "max_attempts", int, where, 3),
        backoff_ms=_optional(raw, "backoff_ms", int, where, 100),
        backoff_multiplier=float(_optional(raw, "backoff_multiplier", (int, float), where, 2.0)),
        max_backoff_ms=_optional(raw, "max_backoff_ms", int, where, 60_000),
    )
    if not 1 <= policy.max_attempts <= 100:
        raise ValidationError(f"{where}.max_attempts: must be between 1 and 100")
    if policy.backoff_ms < 0 or policy.max_backoff_ms < 0:
        raise ValidationError(f"{where}: backoff values must be >= 0")
    if max(policy.backoff_ms, policy.max_backoff_ms) > MAX_BACKOFF_MS:
        raise ValidationError(f"{where}: backoff values must be at most {MAX_BACKOFF_MS} ms")
    if not 1.0 <= policy.backoff_multiplier <= 10.0:
        raise ValidationError(f"{where}.backoff_multiplier: must be between 1 and 10")
    return policy


def parse_workflow(raw: Any) -> WorkflowDef:
    """Validate a workflow definition (see schemas/workflow.schema.json) into a WorkflowDef."""
    if not isinstance(raw, dict):
        raise ValidationError("workflow: expected a JSON object")
    _check_keys(
        raw, {"name", "version", "steps", "description", "output", "input_schema"}, "workflow"
    )
    if not isinstance(raw.get("description", ""), str):
        raise ValidationError("workflow.description: expected str")
    name = _require(raw, "name", str, "workflow")
    if not name or len(name) > 200:
        raise ValidationError("workflow.name: must be 1 to 200 characters")
    version = _require(raw, "version", int, "workflow")
    if version < 1:
        raise ValidationError("workflow.version: must be >= 1")
    raw_steps = _require(raw, "steps", list, "workflow")
    if not raw_steps:
        raise ValidationError("workflow.steps: a workflow needs at least one step")
    steps: list[StepDef] = []
    for i, raw_step in enumerate(raw_steps):
        where = f"workflow.steps[{i}]"
        if not isinstance(raw_step, dict):
            raise ValidationError(f"{where}: expected an object")
        kind = _optional(raw_step, "kind", str, where, TASK)
        if kind == WAIT:
            steps.append(_parse_wait(raw_step, where))
            continue
        if kind == WORKFLOW:
            steps.append(_parse_child(raw_step, where))
            continue
        if kind not in (TASK, MAP):
            raise ValidationError(
                f"{where}.kind: must be 'task', 'wait', 'workflow' or 'map', not {kind!r}"
            )
        _check_keys(
            raw_step,
            {
                "name",
                "kind",
                "type",
                "depends_on",
                "retry",
                "timeout_ms",
                "queue",
                "heartbeat_timeout_ms",
                "schedule_to_start_ms",
                "schedule_to_close_ms",
                "concurrency",
                "rate_limit",
                *(("items_from", "max_items", "parallelism") if kind == MAP else ()),
            },
            where,
        )
        deps = _dependencies(raw_step, where)
        if not _require(raw_step, "type", str, where):
            raise ValidationError(f"{where}.type: must not be empty")
        timeout_ms = _optional(raw_step, "timeout_ms", int, where, 30_000)
        if timeout_ms < 1:
            raise ValidationError(f"{where}.timeout_ms: must be >= 1")
        queue = _optional(raw_step, "queue", str, where, DEFAULT_QUEUE)
        if not _QUEUE_NAME.fullmatch(queue):
            raise ValidationError(
                f"{where}.queue: {queue!r} must be 1 to 100 letters, digits, '_' or '-'"
            )
        heartbeat_ms = _optional(raw_step, "heartbeat_timeout_ms", int, where, None)
        if heartbeat_ms is not None and not 1 <= heartbeat_ms < timeout_ms:
            raise ValidationError(
                f"{where}.heartbeat_timeout_ms: must be >= 1 and shorter than timeout_ms"
                f" ({timeout_ms})"
            )
        step = StepDef(
            name=_require(raw_step, "name", str, where),
            step_type=_require(raw_step, "type", str, where),
            depends_on=tuple(deps),
            retry=parse_retry(raw_step.get("retry", {}), f"{where}.retry"),
            timeout_ms=timeout_ms,
            queue=queue,
            heartbeat_timeout_ms=heartbeat_ms,
            schedule_to_start_ms=_bound(raw_step, "schedule_to_start_ms", where),
            schedule_to_close_ms=_bound(raw_step, "schedule_to_close_ms", where),
            concurrency=_parse_concurrency(raw_step, where),
            rate_limit=_parse_rate_limit(raw_step, where),
        )
        steps.append(_parse_map(raw_step, where, step) if kind == MAP else step)
    _check_graph(steps)
    if any(s.maps for s in steps):
        for step in steps:
            if "[" in step.name or "]" in step.name:
                raise ValidationError(
                    f"workflow.steps: {step.name!r}: a workflow with a map step names no step"
                    " with '[' or ']' (its items are named so: step[0], step[1] ...)"
                )
    for step in steps:
        if step.starts_child and step.child_workflow == name:
            raise ValidationError(
                f"workflow.steps: {step.name!r} would start a run of this workflow itself"
            )
    output = _parse_output(raw["output"], steps) if "output" in raw else None
    schema = _parse_input_schema(raw["input_schema"]) if "input_schema" in raw else None
    return WorkflowDef(
        name=name, version=version, steps=tuple(steps), output=output, input_schema=schema
    )


# The longest a step's timeouts may be: ten years (a due time stays within the bounds of an
# epoch in ms every door checks).
MAX_TIMEOUT_MS = 10 * 365 * 24 * 3600 * 1000


def _bound(raw_step: Mapping[str, Any], key: str, where: str) -> int | None:
    """An optional timeout of a task or map step (schedule-to-start, schedule-to-close)."""
    value = _optional(raw_step, key, int, where, None)
    if value is not None and not 1 <= value <= MAX_TIMEOUT_MS:
        raise ValidationError(f"{where}.{key}: must be between 1 and {MAX_TIMEOUT_MS} (ten years)")
    return None if value is None else int(value)


def _limit_name(raw: Mapping[str, Any], where: str, step_type: str) -> str:
    name = _optional(raw, "name", str, where, step_type)
    if not LIMIT_NAME.fullmatch(name):
        raise ValidationError(
            f"{where}.name: {name!r} must be 1 to 100 letters, digits, '_', '.', ':' or '-'"
            + (" (it defaults to the step's type: name the limit)" if "name" not in raw else "")
        )
    return str(name)


def _limit_count(raw: Mapping[str, Any], where: str) -> int:
    limit = _require(raw, "limit", int, where)
    if not 1 <= limit <= MAX_LIMIT:
        raise ValidationError(f"{where}.limit: must be between 1 and {MAX_LIMIT}")
    return int(limit)


def _parse_concurrency(raw_step: Mapping[str, Any], where: str) -> ConcurrencyLimit | None:
    raw = raw_step.get("concurrency")
    if raw is None:
        return None
    where = f"{where}.concurrency"
    if not isinstance(raw, dict):
        raise ValidationError(
            f"{where}: expected an object, e.g. {{'limit': 5, 'key': 'customer'}}"
        )
    _check_keys(raw, {"limit", "key", "name"}, where)
    path = _optional(raw, "key", str, where, "")
    key = tuple(path.removeprefix("$.").split(".")) if path else ()
    if any(not part for part in key):
        raise ValidationError(
            f"{where}.key: {path!r} is a dotted path in the input, e.g. 'customer.id'"
        )
    name = _limit_name(raw, where, str(raw_step.get("type", "")))
    return ConcurrencyLimit(name, _limit_count(raw, where), key)


def _parse_rate_limit(raw_step: Mapping[str, Any], where: str) -> RateLimit | None:
    raw = raw_step.get("rate_limit")
    if raw is None:
        return None
    where = f"{where}.rate_limit"
    if not isinstance(raw, dict):
        raise ValidationError(f"{where}: expected an object, e.g. {{'limit': 100, 'per_s': 60}}")
    _check_keys(raw, {"limit", "per_s", "name"}, where)
    per_s = _require(raw, "per_s", (int, float), where)
    per_ms = round(per_s * 1000)
    if not 1 <= per_ms <= MAX_BACKOFF_MS:
        raise ValidationError(f"{where}.per_s: must be between 0.001 and a week (604800)")
    name = _limit_name(raw, where, str(raw_step.get("type", "")))
    return RateLimit(name, _limit_count(raw, where), per_ms)


def _parse_input_schema(raw: Any) -> str:
    """The input schema as canonical text, once it is known to be a JSON Schema."""
    if not isinstance(raw, dict):
        raise ValidationError(f"workflow.input_schema: expected a JSON Schema object, got {raw!r}")
    try:
        Draft202012Validator.check_schema(raw)
    except SchemaError as exc:
        where = "".join(f"[{p!r}]" if isinstance(p, int) else f".{p}" for p in exc.path)
        raise ValidationError(
            f"workflow.input_schema{where}: not a valid JSON Schema: {exc.message}"
        ) from None
    try:
        return orjson.dumps(raw, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError as not_json:  # (only from code: JSON documents hold JSON values)
        raise ValidationError(f"workflow.input_schema: not JSON: {not_json}") from None


def _dependencies(raw_step: Mapping[str, Any], where: str) -> tuple[str, ...]:
    deps = _optional(raw_step, "depends_on", list, where, [])
    if not all(isinstance(d, str) for d in deps):
        raise ValidationError(f"{where}.depends_on: expected a list of step names")
    if len(set(deps)) != len(deps):
        raise ValidationError(f"{where}.depends_on: a dependency is listed twice")
    return tuple(deps)


def _parse_wait(raw_step: Mapping[str, Any], where: str) -> StepDef:
    """A step that waits for a signal: no worker runs it, so it has no type, queue or
    heartbeat; its timeout is how long it waits (an attempt), its retry policy whether it
    waits again after one timed out (one attempt unless it says so)."""
    _check_keys(raw_step, {"name", "kind", "signal", "depends_on", "retry", "timeout_ms"}, where)
    signal = _require(raw_step, "signal", str, where)
    if not SIGNAL_NAME.fullmatch(signal):
        raise ValidationError(
            f"{where}.signal: {signal!r} must be 1 to 100 letters, digits, '_', '.', ':' or '-',"
            " starting with a letter or digit"
        )
    if signal == "cancel":
        raise ValidationError(f"{where}.signal: 'cancel' cancels the run; wait for another name")
    timeout_ms = _optional(raw_step, "timeout_ms", int, where, WAIT_TIMEOUT_MS)
    if timeout_ms < 1:
        raise ValidationError(f"{where}.timeout_ms: must be >= 1")
    return StepDef(
        name=_require(raw_step, "name", str, where),
        step_type="",
        depends_on=_dependencies(raw_step, where),
        retry=parse_retry(raw_step.get("retry", {"max_attempts": 1}), f"{where}.retry"),
        timeout_ms=timeout_ms,
        kind=WAIT,
        signal=signal,
    )


def _parse_map(raw_step: Mapping[str, Any], where: str, step: StepDef) -> StepDef:
    """A task step run once per item: where its items come from, how many, how many at once."""
    items_from = _optional(raw_step, "items_from", str, where, None)
    if items_from is not None and items_from not in step.depends_on:
        raise ValidationError(
            f"{where}.items_from: {items_from!r} must be one of the steps it depends on"
        )
    max_items = _optional(raw_step, "max_items", int, where, MAP_ITEMS)
    if not 1 <= max_items <= MAP_ITEMS_LIMIT:
        raise ValidationError(f"{where}.max_items: must be between 1 and {MAP_ITEMS_LIMIT}")
    parallelism = _optional(raw_step, "parallelism", int, where, MAP_PARALLELISM)
    if not 1 <= parallelism <= MAP_PARALLELISM_LIMIT:
        raise ValidationError(f"{where}.parallelism: must be between 1 and {MAP_PARALLELISM_LIMIT}")
    return replace(
        step, kind=MAP, items_from=items_from, max_items=max_items, parallelism=parallelism
    )


def _parse_child(raw_step: Mapping[str, Any], where: str) -> StepDef:
    """A step that starts a child run of another workflow and ends as it does."""
    _check_keys(
        raw_step,
        {"name", "kind", "workflow", "version", "input_from", "depends_on", "retry", "timeout_ms"},
        where,
    )
    child = _require(raw_step, "workflow", str, where)
    if not child or len(child) > 200:
        raise ValidationError(f"{where}.workflow: must be 1 to 200 characters")
    version = _optional(raw_step, "version", int, where, None)
    if version is not None and version < 1:
        raise ValidationError(f"{where}.version: must be >= 1")
    deps = _dependencies(raw_step, where)
    input_from = _optional(raw_step, "input_from", str, where, None)
    if input_from is not None and input_from not in deps:
        raise ValidationError(
            f"{where}.input_from: {input_from!r} must be one of the steps it depends on"
        )
    timeout_ms = _optional(raw_step, "timeout_ms", int, where, CHILD_TIMEOUT_MS)
    if timeout_ms < 1:
        raise ValidationError(f"{where}.timeout_ms: must be >= 1")
    return StepDef(
        name=_require(raw_step, "name", str, where),
        step_type="",
        depends_on=deps,
        retry=parse_retry(raw_step.get("retry", {"max_attempts": 1}), f"{where}.retry"),
        timeout_ms=timeout_ms,
        kind=WORKFLOW,
        child_workflow=child,
        child_version=version,
        input_from=input_from,
    )


def _parse_output(raw: Any, steps: list[StepDef]) -> WorkflowOutput:
    names = {s.name for s in steps}
    if isinstance(raw, str):
        if raw not in names:
            raise ValidationError(f"workflow.output: {raw!r} is not a step of this workflow")
        return WorkflowOutput(step=raw)
    if not isinstance(raw, dict):
        raise ValidationError(
            f"workflow.output: expected a step name or an object of names to step names,"
            f" got {raw!r}"
        )
    if not raw:
        raise ValidationError("workflow.output: an object of names needs at least one name")
    for key, step in raw.items():
        if not key:
            raise ValidationError("workflow.output: a name is empty")
        if not isinstance(step, str):
            raise ValidationError(f"workflow.output.{key}: expected a step name, got {step!r}")
        if step not in names:
            raise ValidationError(f"workflow.output.{key}: {step!r} is not a step of this workflow")
    return WorkflowOutput(fields=tuple(sorted(raw.items())))


def _check_graph(steps: list[StepDef]) -> None:
    names = [s.name for s in steps]
    seen: set[str] = set()
    for n in names:
        if not n:
            raise ValidationError("workflow.steps: a step name is empty")
        if n in seen:
            raise ValidationError(f"workflow.steps: step name {n!r} is used twice")
        seen.add(n)
    for s in steps:
        for d in s.depends_on:
            if d not in seen:
                raise ValidationError(f"workflow.steps: {s.name!r} depends on unknown step {d!r}")
            if d == s.name:
                raise ValidationError(f"workflow.steps: {s.name!r} depends on itself")
    try:
        TopologicalSorter({s.name: s.depends_on for s in steps}).prepare()
    except CycleError as exc:
        # The second argument is one cycle found, its first step repeated at its end.
        on_cycle = sorted(set(exc.args[1]))
        raise ValidationError(f"workflow.steps: dependency cycle among {on_cycle}") from None


def workflow_to_json(wf: WorkflowDef) -> dict[str, Any]:
    raw = {
        "name": wf.name,
        "version": wf.version,
        "steps": [_step_to_json(s) for s in wf.steps],
    }
    if wf.output is not None:  # absent otherwise: definitions from before outputs are unchanged
        raw["output"] = wf.output.to_json()
    if wf.input_schema is not None:
        raw["input_schema"] = orjson.loads(wf.input_schema)
    return raw


def _step_to_json(s: StepDef) -> dict[str, Any]:
    if s.starts_child:
        raw: dict[str, Any] = {"name": s.name, "kind": WORKFLOW, "workflow": s.child_workflow}
        if s.child_version is not None:
            raw["version"] = s.child_version
        if s.input_from is not None:
            raw["input_from"] = s.input_from
        raw |= {
            "depends_on": list(s.depends_on),
            "retry": _retry_to_json(s.retry),
            "timeout_ms": s.timeout_ms,
        }
        return raw
    if s.waits:
        return {
            "name": s.name,
            "kind": WAIT,
            "signal": s.signal,
            "depends_on": list(s.depends_on),
            "retry": _retry_to_json(s.retry),
            "timeout_ms": s.timeout_ms,
        }
    raw = {
        "name": s.name,
        "type": s.step_type,
        "depends_on": list(s.depends_on),
        "retry": _retry_to_json(s.retry),
        "timeout_ms": s.timeout_ms,
    }
    if s.maps:
        raw["kind"] = MAP
        if s.items_from is not None:
            raw["items_from"] = s.items_from
        raw["max_items"] = s.max_items
        raw["parallelism"] = s.parallelism
    # Written only when set: definitions from before queues and heartbeats are unchanged.
    if s.queue != DEFAULT_QUEUE:
        raw["queue"] = s.queue
    if s.heartbeat_timeout_ms is not None:
        raw["heartbeat_timeout_ms"] = s.heartbeat_timeout_ms
    if s.schedule_to_start_ms is not None:
        raw["schedule_to_start_ms"] = s.schedule_to_start_ms
    if s.schedule_to_close_ms is not None:
        raw["schedule_to_close_ms"] = s.schedule_to_close_ms
    if s.concurrency is not None:
        raw["concurrency"] = s.concurrency.to_json()
    if s.rate_limit is not None:
        raw["rate_limit"] = s.rate_limit.to_json()
    return raw


def _retry_to_json(policy: RetryPolicy) -> dict[str, Any]:
    return {
        "max_attempts": policy.max_attempts,
        "backoff_ms": policy.backoff_ms,
        "backoff_multiplier": policy.backoff_multiplier,
        "max_backoff_ms": policy.max_backoff_ms,
    }
