"""One model of a step's definition: every option the JSON schema has (schemas/
workflow.schema.json) is read by the parser and written back by the one writer
(core/workflow.py) into the same definition, and the authoring API (processor/authoring.py),
which writes its steps through that writer, gives the definition the JSON form of the same
workflow gives. A new option the schema takes but the parser, the writer or the authoring API
misses fails here."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import Compensate, Concurrency, RateLimit, Retry, StepContext, Workflow
from processor.core.limit_defs import MAX_LIMIT
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import (
    MAX_BACKOFF_MS,
    MAX_TIMEOUT_MS,
    StepDef,
    ValidationError,
    WorkflowDef,
)
from processor.io.shipped.workflow_schema import workflow_validator

SCHEMA = workflow_validator()
STEP_SCHEMA: Any = cast(Any, SCHEMA.schema)["properties"]["steps"]["items"]

_NAMES = st.text("abcdefgh", min_size=1, max_size=6)
_LIMIT_NAMES = st.text("abcxyz09_.:-", min_size=1, max_size=8).map(lambda s: f"L{s}")
_MS = st.integers(1, 10_000_000)


def _retry() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {},
        optional={
            "max_attempts": st.integers(1, 100),
            "backoff_ms": st.integers(0, MAX_BACKOFF_MS),
            "backoff_multiplier": st.floats(1, 10, allow_nan=False),
            "max_backoff_ms": st.integers(0, MAX_BACKOFF_MS),
        },
    )


def _concurrency() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"limit": st.integers(1, MAX_LIMIT)},
        optional={
            "key": st.sampled_from(["customer", "customer.id", "$.a.b"]),
            "name": _LIMIT_NAMES,
        },
    )


def _rate_limit() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "limit": st.integers(1, MAX_LIMIT),
            "per_s": st.one_of(
                st.integers(1, 604_800), st.integers(1, 604_800_000).map(lambda ms: ms / 1000)
            ),
        },
        optional={"name": _LIMIT_NAMES},
    )


@st.composite
def _step(draw: st.DrawFn, name: str, before: list[str], kind: str) -> dict[str, Any]:
    deps = draw(st.lists(st.sampled_from(before), unique=True)) if before else []
    raw: dict[str, Any] = {"name": name, "depends_on": deps}
    raw["retry"] = draw(_retry())
    raw["timeout_ms"] = draw(_MS)
    for key in ("retry", "timeout_ms"):
        if draw(st.booleans()):
            del raw[key]
    if kind == "wait":
        raw |= {"kind": "wait", "signal": draw(st.sampled_from(["go", "ok.1", "a:b"]))}
        if draw(st.booleans()):
            raw["on_timeout"] = draw(st.sampled_from(["fail", "continue"]))
            if raw["on_timeout"] == "continue" and draw(st.booleans()):
                raw["default"] = draw(st.sampled_from([None, 0, "late", {"ok": False}, [1]]))
        return raw
    if kind == "sleep":
        raw.pop("retry", None)  # (a sleep has neither)
        raw.pop("timeout_ms", None)
        raw["kind"] = "sleep"
        if draw(st.booleans()) and deps:
            raw["until"] = f"$.steps.{draw(st.sampled_from(deps))}.output.at"
        elif draw(st.booleans()):
            raw["until"] = draw(st.sampled_from(["$.input", "$.input.wake_at", "$.input.a.0"]))
        else:
            raw["duration_ms"] = draw(st.integers(0, MAX_TIMEOUT_MS))
        return raw
    if kind == "workflow":
        raw |= {"kind": "workflow", "workflow": draw(st.sampled_from(["child", "other"]))}
        if draw(st.booleans()):
            raw["version"] = draw(st.integers(1, 50))
        if draw(st.booleans()) and deps:
            raw["input_from"] = draw(st.sampled_from(deps))
        return raw
    raw["type"] = f"t{name}"  # one function per type in the code form: a type per step
    if kind == "map":
        raw["kind"] = "map"
        if draw(st.booleans()) and deps:
            raw["items_from"] = draw(st.sampled_from(deps))
        if draw(st.booleans()):
            raw["max_items"] = draw(st.integers(1, 10_000))
        if draw(st.booleans()):
            raw["parallelism"] = draw(st.integers(1, 1_000))
    timeout_ms = raw.get("timeout_ms", 30_000)
    options: dict[str, st.SearchStrategy[Any]] = {
        "queue": st.sampled_from(["default", "fast", "slow-1"]),
        "heartbeat_timeout_ms": st.integers(1, max(1, timeout_ms - 1)),
        "schedule_to_start_ms": st.integers(1, MAX_TIMEOUT_MS),
        "schedule_to_close_ms": st.integers(1, MAX_TIMEOUT_MS),
        "concurrency": _concurrency(),
        "rate_limit": _rate_limit(),
    }
    if timeout_ms == 1:
        del options["heartbeat_timeout_ms"]  # (shorter than its timeout: none can be)
    for key, values in options.items():
        if draw(st.booleans()):
            raw[key] = draw(values)
    if kind == "task" and draw(st.booleans()):  # its compensation (core/sagas.py)
        raw["compensate"] = draw(_compensate(name))
    return raw


def _compensate(name: str) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {"type": st.just(f"undo{name}")},
        optional={
            "retry": _retry(),
            "timeout_ms": st.integers(2, 10_000_000),
            "queue": st.sampled_from(["default", "refunds"]),
            "heartbeat_timeout_ms": st.just(1),
            "version": st.integers(1, 9999),
        },
    )


@st.composite
def definitions(draw: st.DrawFn) -> dict[str, Any]:
    """Valid workflow documents, any step option set or not."""
    names = draw(st.lists(_NAMES, min_size=1, max_size=6, unique=True))
    kinds = st.sampled_from(["task", "task", "map", "wait", "workflow", "sleep"])
    steps = [draw(_step(name, names[:i], draw(kinds))) for i, name in enumerate(names)]
    raw: dict[str, Any] = {"name": "flow", "version": draw(st.integers(1, 50)), "steps": steps}
    if draw(st.booleans()):
        raw["description"] = draw(st.text(max_size=20))
    if draw(st.booleans()):
        raw["output"] = draw(
            st.sampled_from(names)
            | st.dictionaries(_NAMES, st.sampled_from(names), min_size=1, max_size=3)
        )
    if draw(st.booleans()):
        required = draw(st.lists(_NAMES, max_size=2, unique=True))
        raw["input_schema"] = {"type": "object", "required": required}
    if draw(st.booleans()):  # its failure handler (core/sagas.py)
        raw["on_failure"] = draw(_compensate("handler"))
    return raw


# Every option set, for each kind of step: what the schema has must be written back.
FULL: dict[str, Any] = {
    "name": "full",
    "version": 3,
    "description": "every option",
    "steps": [
        {
            "name": "task",
            "type": "charge",
            "retry": {
                "max_attempts": 5,
                "backoff_ms": 250,
                "backoff_multiplier": 1.5,
                "max_backoff_ms": 9_000,
            },
            "timeout_ms": 20_000,
            "queue": "payments",
            "heartbeat_timeout_ms": 2_000,
            "schedule_to_start_ms": 60_000,
            "schedule_to_close_ms": 600_000,
            "concurrency": {"limit": 4, "key": "customer.id", "name": "per-customer"},
            "rate_limit": {"limit": 100, "per_s": 1.5, "name": "charges"},
            "compensate": {
                "type": "refund",
                "retry": {"max_attempts": 9, "backoff_ms": 500},
                "timeout_ms": 5_000,
                "queue": "refunds",
                "heartbeat_timeout_ms": 1_000,
                "version": 3,
            },
        },
        {
            "name": "items",
            "kind": "map",
            "type": "resize",
            "depends_on": ["task"],
            "items_from": "task",
            "max_items": 50,
            "parallelism": 5,
            "heartbeat_timeout_ms": 1_000,
            "concurrency": {"limit": 2},
            "rate_limit": {"limit": 10, "per_s": 60},
        },
        {
            "name": "approve",
            "kind": "wait",
            "signal": "approved",
            "depends_on": ["items"],
            "on_timeout": "continue",
            "default": {"approved": False},
            "when": '$.input.region in ["eu", "us"] and $.steps.items.output[0] != null',
            "run_if": "all_done",
        },
        {"name": "pause", "kind": "sleep", "depends_on": ["approve"], "duration_ms": 5_000},
        {
            "name": "remind",
            "kind": "sleep",
            "depends_on": ["task"],
            "until": "$.steps.task.output.at",
        },
        {
            "name": "child",
            "kind": "workflow",
            "workflow": "shipping",
            "version": 2,
            "input_from": "approve",
            "depends_on": ["approve"],
            "retry": {"max_attempts": 2},
            "timeout_ms": 3_600_000,
        },
    ],
    "output": {"charged": "task", "shipped": "child"},
    "input_schema": {"type": "object", "required": ["customer"]},
    "on_failure": {"type": "page_someone", "retry": {"max_attempts": 5}, "queue": "alerts"},
}


def _keys(objects: list[dict[str, Any]]) -> set[str]:
    return {key for obj in objects for key in obj}


def test_the_writer_writes_back_every_option_the_schema_has() -> None:
    wf = parse_workflow(FULL)
    written = workflow_to_json(wf)
    assert list(SCHEMA.iter_errors(written)) == []
    steps = written["steps"]
    assert _keys(steps) == set(STEP_SCHEMA["properties"])
    for nested in ("retry", "concurrency", "rate_limit", "compensate"):
        assert _keys([s[nested] for s in steps if nested in s]) == set(
            STEP_SCHEMA["properties"][nested]["properties"]
        ), nested
    assert parse_workflow(written) == wf


@settings(max_examples=150, deadline=None)
@given(definitions())
def test_any_definition_round_trips_through_the_parser_and_the_writer(
    raw: dict[str, Any],
) -> None:
    assert list(SCHEMA.iter_errors(raw)) == []
    wf = parse_workflow(raw)
    written = workflow_to_json(wf)
    assert list(SCHEMA.iter_errors(written)) == []
    assert parse_workflow(written) == wf
    assert parse_workflow(json.loads(json.dumps(written))) == wf
    assert workflow_to_json(parse_workflow(written)) == written  # the writer's form is a fixpoint


# Each field of a step's definition, and the authoring API's option that declares it.
_IN_CODE = {
    "name": "name",
    "step_type": "type (its function, for a task or map step)",
    "compensate": "compensate",
    "depends_on": "after",
    "retry": "retry",
    "timeout_ms": "timeout",
    "queue": "queue",
    "heartbeat_timeout_ms": "heartbeat_timeout",
    "schedule_to_start_ms": "schedule_to_start",
    "schedule_to_close_ms": "schedule_to_close",
    "kind": "step, map, wait, child or sleep",
    "sleep_ms": "duration",
    "until": "until",
    "on_timeout": "on_timeout",
    "default_output": "default",
    "signal": "signal",
    "child_workflow": "workflow",
    "child_version": "version",
    "input_from": "input_from",
    "items_from": "items_from",
    "max_items": "max_items",
    "parallelism": "parallelism",
    "concurrency": "concurrency",
    "rate_limit": "rate_limit",
    "when": "when",
    "run_if": "run_if",
    "version": "version (a task or map step's)",
}


def test_every_field_of_a_step_has_its_option_in_code() -> None:
    assert {f.name for f in fields(StepDef)} == set(_IN_CODE)


def _in_code(wf: WorkflowDef, raw: dict[str, Any]) -> Workflow:
    """The workflow ``wf`` written with the authoring API, option by option."""
    output = wf.output.to_json() if wf.output is not None else None
    code = Workflow(
        wf.name,
        wf.version,
        description=raw.get("description"),
        output=output,
        input_schema=raw.get("input_schema"),
        on_failure=None if wf.on_failure is None else _as_compensate(wf.on_failure),
    )
    for step in wf.steps:
        retry = Retry(
            step.retry.max_attempts,
            step.retry.backoff_ms,
            step.retry.backoff_multiplier,
            step.retry.max_backoff_ms,
        )
        common: dict[str, Any] = {"after": step.depends_on, "timeout": step.timeout_ms}
        common |= {"when": None if step.when is None else step.when.text, "run_if": step.run_if}
        if step.waits:
            assert step.signal is not None
            default = None if step.default_output is None else json.loads(step.default_output)
            code.wait(
                step.name,
                signal=step.signal,
                retry=retry,
                on_timeout=step.on_timeout,
                default=default,
                **common,
            )
            continue
        if step.sleeps:
            until = None if step.until is None else step.until.text
            code.sleep(
                step.name,
                duration=step.sleep_ms,
                until=until,
                after=step.depends_on,
                when=common["when"],
                run_if=step.run_if,
            )
            continue
        if step.starts_child:
            assert step.child_workflow is not None
            code.child(
                step.name,
                workflow=step.child_workflow,
                version=step.child_version,
                input_from=step.input_from,
                retry=retry,
                **common,
            )
            continue
        options = common | _task_options(step) | {"retry": retry, "version": step.version}
        if step.maps:
            add = code.map(
                items_from=step.items_from,
                max_items=step.max_items,
                parallelism=step.parallelism,
                **options,
            )
        else:
            add = code.step(**options, compensate=_compensate_in_code(step))
        add(_function)
    return code


def _compensate_in_code(step: StepDef) -> Compensate | None:
    return None if step.compensate is None else _as_compensate(step.compensate)


def _as_compensate(undo: StepDef) -> Compensate:
    policy = undo.retry
    retry = Retry(
        policy.max_attempts, policy.backoff_ms, policy.backoff_multiplier, policy.max_backoff_ms
    )
    return Compensate(
        undo.step_type,
        timeout=undo.timeout_ms,
        retry=retry,
        queue=undo.queue,
        heartbeat_timeout=undo.heartbeat_timeout_ms,
        version=undo.version,
    )


def _task_options(step: StepDef) -> dict[str, Any]:
    concurrency = rate = None
    if step.concurrency is not None:
        limit = step.concurrency
        concurrency = Concurrency(
            limit.limit,
            key=".".join(limit.key) or None,
            name=None if limit.name == step.step_type else limit.name,
        )
    if step.rate_limit is not None:
        rated = step.rate_limit
        rate = RateLimit(rated.limit, per=rated.per_ms, name=rated.name)
    return {
        "name": step.name,
        "type": step.step_type,
        "queue": step.queue,
        "heartbeat_timeout": step.heartbeat_timeout_ms,
        "schedule_to_start": step.schedule_to_start_ms,
        "schedule_to_close": step.schedule_to_close_ms,
        "concurrency": concurrency,
        "rate_limit": rate,
    }


def _function(ctx: StepContext) -> None:
    return None


def test_the_full_workflow_in_code_is_its_json_form() -> None:
    wf = parse_workflow(FULL)
    code = _in_code(wf, FULL)
    assert code.definition() == wf
    assert code.to_json() == workflow_to_json(wf) | {"description": FULL["description"]}


@settings(max_examples=100, deadline=None)
@given(definitions())
def test_any_workflow_in_code_gives_the_definition_of_its_json_form(raw: dict[str, Any]) -> None:
    wf = parse_workflow(raw)
    code = _in_code(wf, raw)
    assert code.definition() == wf
    assert list(SCHEMA.iter_errors(code.to_json())) == []


@pytest.mark.parametrize("key", ["$.", "a..b", "."])
def test_a_limit_key_that_is_not_a_path_is_refused_in_code_as_in_json(key: str) -> None:
    raw = {
        "name": "keyed",
        "version": 1,
        "steps": [{"name": "a", "type": "a", "concurrency": {"limit": 1, "key": key}}],
    }
    with pytest.raises(ValidationError) as in_json:
        parse_workflow(raw)
    code = Workflow("keyed")
    code.step(name="a", type="a", concurrency=Concurrency(1, key=key))(_function)
    with pytest.raises(ValidationError) as in_code:
        code.definition()
    assert str(in_code.value) == str(in_json.value)
