"""A workflow definition's JSON form (schemas/workflow.schema.json): parsed into the core's
values (``parse_workflow`` raises ``ValidationError`` naming the offending field; each step's
parser is core/step_parse.py) and written back canonically by the one writer
(``workflow_to_json``), which the authoring API (processor/authoring.py) writes through too: a
step's option lives in the schema, the parser and this writer. The values themselves are
core/workflow_def.py's. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import replace
from graphlib import CycleError, TopologicalSorter
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

from processor.core.deadlines import timeout_problem
from processor.core.limit_defs import MAX_LIMIT, RunKeyLimit
from processor.core.routing import DEFAULT_QUEUE
from processor.core.step_parse import check_keys, concurrency_key, optional, parse_step, require
from processor.core.workflow_def import (
    FAILURE_NODE,
    MAP,
    ON_FAILURE_NODE,
    ON_TIMEOUT_FAIL,
    SLEEP,
    TASK,
    WAIT,
    WORKFLOW,
    RetryPolicy,
    StepDef,
    ValidationError,
    WorkflowDef,
    WorkflowOutput,
    undo_node,
)

__all__ = [
    "handler_to_json",
    "parse_workflow",
    "step_to_json",
    "workflow_to_json",
]


def parse_workflow(raw: Any) -> WorkflowDef:
    """Validate a workflow definition (see schemas/workflow.schema.json) into a WorkflowDef."""
    if not isinstance(raw, dict):
        raise ValidationError("workflow: expected a JSON object")
    check_keys(
        raw,
        {"name", "version", "steps", "description", "output", "input_schema", "timeout_ms"}
        | {"on_failure", "concurrency"},
        "workflow",
    )
    if not isinstance(raw.get("description", ""), str):
        raise ValidationError("workflow.description: expected str")
    name = require(raw, "name", str, "workflow")
    if not name or len(name) > 200:
        raise ValidationError("workflow.name: must be 1 to 200 characters")
    version = require(raw, "version", int, "workflow")
    if version < 1:
        raise ValidationError("workflow.version: must be >= 1")
    raw_steps = require(raw, "steps", list, "workflow")
    if not raw_steps:
        raise ValidationError("workflow.steps: a workflow needs at least one step")
    steps = [_parsed_step(raw_step, f"workflow.steps[{i}]") for i, raw_step in enumerate(raw_steps)]
    _check_graph(steps)
    _check_names(steps, name, "on_failure" in raw)
    output = _parse_output(raw["output"], steps) if "output" in raw else None
    schema = _parse_input_schema(raw["input_schema"]) if "input_schema" in raw else None
    timeout = raw.get("timeout_ms")
    if "timeout_ms" in raw and (problem := timeout_problem(timeout, "workflow.timeout_ms")):
        raise ValidationError(problem)
    handler = _on_failure(raw["on_failure"], steps) if "on_failure" in raw else None
    return WorkflowDef(
        name=name,
        version=version,
        steps=tuple(steps),
        output=output,
        input_schema=schema,
        timeout_ms=timeout,
        on_failure=handler,
        concurrency=_parse_run_key(raw.get("concurrency"), name),
    )


def _parse_run_key(raw: Any, workflow: str) -> RunKeyLimit | None:
    """The workflow's ``concurrency``: at most ``limit`` live runs per value of ``key``."""
    if raw is None:
        return None
    where = "workflow.concurrency"
    if not isinstance(raw, dict):
        raise ValidationError(
            f"{where}: expected an object, e.g. {{'limit': 1, 'key': 'customer.id'}}"
        )
    check_keys(raw, {"limit", "key"}, where)
    limit = require(raw, "limit", int, where)
    if not 1 <= limit <= MAX_LIMIT:
        raise ValidationError(f"{where}.limit: must be between 1 and {MAX_LIMIT}")
    return RunKeyLimit(
        workflow, int(limit), concurrency_key(optional(raw, "key", str, where, ""), where)
    )


def _on_failure(raw: Any, steps: list[StepDef]) -> StepDef:
    """The workflow's failure handler (core/sagas.py): a task named ``on_failure`` that reads
    the run's failure (``failure``); no step may be named either."""
    at = "workflow.on_failure"
    if not isinstance(raw, dict):
        raise ValidationError(f"{at}: expected an object with the handler's type, got {raw!r}")
    check_keys(raw, set(_COMPENSATE_KEYS), at)
    for step in steps:
        if step.name in (FAILURE_NODE, ON_FAILURE_NODE):
            raise ValidationError(
                f"workflow.steps: {step.name!r}: a workflow with on_failure names no step"
                f" {FAILURE_NODE!r} or {ON_FAILURE_NODE!r} (its handler's nodes)"
            )
    handler = {**raw, "kind": TASK, "name": ON_FAILURE_NODE, "depends_on": [FAILURE_NODE]}
    return parse_step(handler, at)


def _parsed_step(raw_step: Any, where: str) -> StepDef:
    step = parse_step(raw_step, where)
    if "compensate" in raw_step:
        return _with_compensation(raw_step, where, step)
    return step


# What a compensation may say (core/sagas.py): the task options of the step that undoes.
_COMPENSATE_KEYS = frozenset(
    {"type", "retry", "timeout_ms", "queue", "heartbeat_timeout_ms", "version"}
)


def _with_compensation(raw_step: Any, where: str, step: StepDef) -> StepDef:
    """``step`` with its compensation (``compensate``: a task step's only), a task step named
    ``undo(step)`` that depends on the step (it reads its output and the run's input)."""
    at = f"{where}.compensate"
    if step.kind != TASK:
        raise ValidationError(f"{at}: only a task step has a compensation (this is a {step.kind})")
    raw = raw_step["compensate"]
    if not isinstance(raw, dict):
        raise ValidationError(f"{at}: expected an object with the undoing task's type, got {raw!r}")
    check_keys(raw, set(_COMPENSATE_KEYS), at)
    undo = {**raw, "kind": TASK, "name": undo_node(step.name), "depends_on": [step.name]}
    return replace(step, compensate=parse_step(undo, at))


def _check_names(steps: list[StepDef], workflow: str, handled: bool) -> None:
    """What the steps' names and children may not be in this workflow: a map's item names
    taken, or a child run of the workflow itself."""
    if any(s.maps for s in steps):
        for step in steps:
            if "[" in step.name or "]" in step.name:
                raise ValidationError(
                    f"workflow.steps: {step.name!r}: a workflow with a map step names no step"
                    " with '[' or ']' (its items are named so: step[0], step[1] ...)"
                )
    if handled or any(s.compensate is not None for s in steps):
        for step in steps:
            if step.name.startswith("undo("):
                raise ValidationError(
                    f"workflow.steps: {step.name!r}: a workflow with compensations or"
                    " on_failure names no step undo(... (a step's compensation is named so:"
                    " undo(charge))"
                )
    for step in steps:
        if step.starts_child and step.child_workflow == workflow:
            raise ValidationError(
                f"workflow.steps: {step.name!r} would start a run of this workflow itself"
            )


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


# ---------------------------------------------------------------------------------------------
# The one writer: what ``parse_workflow`` reads back as the same definition. Optional fields are
# written only when set, so definitions from before them are written as they were.


def workflow_to_json(wf: WorkflowDef) -> dict[str, Any]:
    raw = {
        "name": wf.name,
        "version": wf.version,
        "steps": [step_to_json(s) for s in wf.steps],
    }
    if wf.output is not None:  # absent otherwise: definitions from before outputs are unchanged
        raw["output"] = wf.output.to_json()
    if wf.input_schema is not None:
        raw["input_schema"] = orjson.loads(wf.input_schema)
    if wf.timeout_ms is not None:
        raw["timeout_ms"] = wf.timeout_ms
    if wf.concurrency is not None:
        raw["concurrency"] = wf.concurrency.to_json()
    if wf.on_failure is not None:
        raw["on_failure"] = handler_to_json(wf.on_failure)
    return raw


def step_to_json(s: StepDef) -> dict[str, Any]:
    """A step as JSON, its condition written only when it has one (older ones unchanged)."""
    raw = _step_json(s)
    if s.when is not None:
        raw["when"] = s.when.text
    if s.run_if is not None:
        raw["run_if"] = s.run_if
    if s.compensate is not None:
        raw["compensate"] = handler_to_json(s.compensate)
    return raw


def handler_to_json(c: StepDef) -> dict[str, Any]:
    """A step's compensation as its ``compensate`` holds it, or the workflow's ``on_failure``
    (their names and dependencies are fixed: not written)."""
    raw: dict[str, Any] = {
        "type": c.step_type,
        "retry": _retry_to_json(c.retry),
        "timeout_ms": c.timeout_ms,
    }
    if c.queue != DEFAULT_QUEUE:
        raw["queue"] = c.queue
    if c.heartbeat_timeout_ms is not None:
        raw["heartbeat_timeout_ms"] = c.heartbeat_timeout_ms
    if c.version is not None:
        raw["version"] = c.version
    return raw


def _step_json(s: StepDef) -> dict[str, Any]:
    """One step as the definition's JSON holds it."""
    if s.starts_child:
        return _child_to_json(s)
    if s.waits:
        wait = {
            "name": s.name,
            "kind": WAIT,
            "signal": s.signal,
            "depends_on": list(s.depends_on),
            "retry": _retry_to_json(s.retry),
            "timeout_ms": s.timeout_ms,
        }
        if s.on_timeout != ON_TIMEOUT_FAIL:  # written only when set: older ones unchanged
            wait["on_timeout"] = s.on_timeout
        if s.default_output is not None:
            wait["default"] = orjson.loads(s.default_output)
        return wait
    if s.sleeps:
        sleep: dict[str, Any] = {"name": s.name, "kind": SLEEP, "depends_on": list(s.depends_on)}
        if s.until is not None:
            sleep["until"] = s.until.text
        else:
            sleep["duration_ms"] = s.sleep_ms
        return sleep
    raw: dict[str, Any] = {
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
    if s.queue != DEFAULT_QUEUE:
        raw["queue"] = s.queue
    return raw | _task_options(s)


def _task_options(s: StepDef) -> dict[str, Any]:
    """A task or map step's optional bounds and limits, those it declares."""
    raw: dict[str, Any] = {}
    for key, value in (
        ("heartbeat_timeout_ms", s.heartbeat_timeout_ms),
        ("schedule_to_start_ms", s.schedule_to_start_ms),
        ("schedule_to_close_ms", s.schedule_to_close_ms),
    ):
        if value is not None:
            raw[key] = value
    if s.concurrency is not None:
        raw["concurrency"] = s.concurrency.to_json()
    if s.rate_limit is not None:
        raw["rate_limit"] = s.rate_limit.to_json()
    if s.version is not None:
        raw["version"] = s.version
    return raw


def _child_to_json(s: StepDef) -> dict[str, Any]:
    raw: dict[str, Any] = {"name": s.name, "kind": WORKFLOW, "workflow": s.child_workflow}
    if s.child_version is not None:
        raw["version"] = s.child_version
    if s.input_from is not None:
        raw["input_from"] = s.input_from
    return raw | {
        "depends_on": list(s.depends_on),
        "retry": _retry_to_json(s.retry),
        "timeout_ms": s.timeout_ms,
    }


def _retry_to_json(policy: RetryPolicy) -> dict[str, Any]:
    return {
        "max_attempts": policy.max_attempts,
        "backoff_ms": policy.backoff_ms,
        "backoff_multiplier": policy.backoff_multiplier,
        "max_backoff_ms": policy.max_backoff_ms,
    }
