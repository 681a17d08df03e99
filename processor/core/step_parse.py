"""The parser of one step of a workflow definition (schemas/workflow.schema.json, ``steps``):
each kind of step (task, map, wait, workflow, sleep) from its JSON object to a ``StepDef``,
with the condition any kind may have (``when``, ``run_if``), every option checked where it is
read (``ValidationError`` naming the field). The workflow around
the steps, and the one writer of the JSON form, are core/workflow.py's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import orjson

from processor.core.limit_defs import (
    LIMIT_NAME,
    MAX_LIMIT,
    ConcurrencyLimit,
    StepRateLimit,
)
from processor.core.routing import DEFAULT_QUEUE
from processor.core.selectors import BadSelector, parse_selector
from processor.core.skips import decides
from processor.core.workflow_def import (
    CHILD_TIMEOUT_MS,
    MAP,
    MAP_ITEMS,
    MAP_ITEMS_LIMIT,
    MAP_PARALLELISM,
    MAP_PARALLELISM_LIMIT,
    MAX_BACKOFF_MS,
    MAX_STEP_VERSION,
    MAX_TIMEOUT_MS,
    ON_TIMEOUT_CONTINUE,
    ON_TIMEOUT_FAIL,
    QUEUE_NAME,
    SIGNAL_NAME,
    SLEEP,
    TASK,
    WAIT,
    WAIT_TIMEOUT_MS,
    WORKFLOW,
    RetryPolicy,
    StepDef,
    ValidationError,
)

# A wait step's default output is part of its definition: kept small.
MAX_DEFAULT_BYTES = 64 * 1024

# The fields of each kind of step (a map step's are a task step's and its own).
# What any kind of step may say: its condition and whether it runs after skipped steps
# (core/skips.py).
_DECIDE_KEYS = frozenset({"when", "run_if"})
_TASK_KEYS = _DECIDE_KEYS | frozenset(
    {
        *("name", "kind", "type", "depends_on", "retry", "timeout_ms", "queue"),
        *("heartbeat_timeout_ms", "schedule_to_start_ms", "schedule_to_close_ms"),
        *("concurrency", "rate_limit", "version", "compensate"),
    }
)
_MAP_KEYS = _TASK_KEYS | {"items_from", "max_items", "parallelism"}


def parse_step(raw_step: Any, where: str) -> StepDef:
    """One step of a definition, ``where`` naming its place (``workflow.steps[2]``)."""
    if not isinstance(raw_step, dict):
        raise ValidationError(f"{where}: expected an object")
    kind = optional(raw_step, "kind", str, where, TASK)
    if kind == WAIT:
        step = _parse_wait(raw_step, where)
    elif kind == WORKFLOW:
        step = _parse_child(raw_step, where)
    elif kind == SLEEP:
        step = _parse_sleep(raw_step, where)
    elif kind in (TASK, MAP):
        check_keys(raw_step, set(_MAP_KEYS if kind == MAP else _TASK_KEYS), where)
        step = _parse_task(raw_step, where)
        step = _parse_map(raw_step, where, step) if kind == MAP else step
    else:
        raise ValidationError(
            f"{where}.kind: must be 'task', 'wait', 'workflow', 'map' or 'sleep', not {kind!r}"
        )
    if "when" not in raw_step and "run_if" not in raw_step:
        return step
    return decides(step, raw_step.get("when"), raw_step.get("run_if"), where)


def _parse_task(raw_step: Mapping[str, Any], where: str) -> StepDef:
    """A step a worker runs: its type, queue, timeouts and limits."""
    deps = _dependencies(raw_step, where)
    if not require(raw_step, "type", str, where):
        raise ValidationError(f"{where}.type: must not be empty")
    timeout_ms = optional(raw_step, "timeout_ms", int, where, 30_000)
    if timeout_ms < 1:
        raise ValidationError(f"{where}.timeout_ms: must be >= 1")
    queue = optional(raw_step, "queue", str, where, DEFAULT_QUEUE)
    if not QUEUE_NAME.fullmatch(queue):
        raise ValidationError(
            f"{where}.queue: {queue!r} must be 1 to 100 letters, digits, '_' or '-'"
        )
    heartbeat_ms = optional(raw_step, "heartbeat_timeout_ms", int, where, None)
    if heartbeat_ms is not None and not 1 <= heartbeat_ms < timeout_ms:
        raise ValidationError(
            f"{where}.heartbeat_timeout_ms: must be >= 1 and shorter than timeout_ms ({timeout_ms})"
        )
    return StepDef(
        name=require(raw_step, "name", str, where),
        step_type=require(raw_step, "type", str, where),
        depends_on=tuple(deps),
        retry=parse_retry(raw_step.get("retry", {}), f"{where}.retry"),
        timeout_ms=timeout_ms,
        queue=queue,
        heartbeat_timeout_ms=heartbeat_ms,
        schedule_to_start_ms=_bound(raw_step, "schedule_to_start_ms", where),
        schedule_to_close_ms=_bound(raw_step, "schedule_to_close_ms", where),
        concurrency=_parse_concurrency(raw_step, where),
        rate_limit=_parse_rate_limit(raw_step, where),
        version=_version(raw_step, where),
    )


def _version(raw_step: Mapping[str, Any], where: str) -> int | None:  # (core/versions.py)
    version: int | None = optional(raw_step, "version", int, where, None)
    if version is not None and not 1 <= version <= MAX_STEP_VERSION:
        raise ValidationError(f"{where}.version: must be 1 to {MAX_STEP_VERSION}")
    return version


def require(obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in obj:
        raise ValidationError(f"{where}: missing required field {key!r}")
    value = obj[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValidationError(f"{where}.{key}: expected {_kind_name(kind)}, got {value!r}")
    return value


def optional(
    obj: Mapping[str, Any], key: str, kind: type | tuple[type, ...], where: str, default: Any
) -> Any:
    if key not in obj:
        return default
    return require(obj, key, kind, where)


def _kind_name(kind: type | tuple[type, ...]) -> str:
    if isinstance(kind, tuple):
        return " or ".join(k.__name__ for k in kind)
    return kind.__name__


def check_keys(obj: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ValidationError(f"{where}: unknown field(s) {', '.join(unknown)}")


def parse_retry(raw: Any, where: str) -> RetryPolicy:
    if not isinstance(raw, dict):
        raise ValidationError(f"{where}: expected an object")
    check_keys(raw, {"max_attempts", "backoff_ms", "backoff_multiplier", "max_backoff_ms"}, where)
    policy = RetryPolicy(
        max_attempts=optional(raw, "max_attempts", int, where, 3),
        backoff_ms=optional(raw, "backoff_ms", int, where, 100),
        backoff_multiplier=float(optional(raw, "backoff_multiplier", (int, float), where, 2.0)),
        max_backoff_ms=optional(raw, "max_backoff_ms", int, where, 60_000),
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


def _bound(raw_step: Mapping[str, Any], key: str, where: str) -> int | None:
    """An optional timeout of a task or map step (schedule-to-start, schedule-to-close)."""
    value = optional(raw_step, key, int, where, None)
    if value is not None and not 1 <= value <= MAX_TIMEOUT_MS:
        raise ValidationError(f"{where}.{key}: must be between 1 and {MAX_TIMEOUT_MS} (ten years)")
    return None if value is None else int(value)


def _limit_name(raw: Mapping[str, Any], where: str, step_type: str) -> str:
    name = optional(raw, "name", str, where, step_type)
    if not LIMIT_NAME.fullmatch(name):
        raise ValidationError(
            f"{where}.name: {name!r} must be 1 to 100 letters, digits, '_', '.', ':' or '-'"
            + (" (it defaults to the step's type: name the limit)" if name == step_type else "")
        )
    return str(name)


def _limit_count(raw: Mapping[str, Any], where: str) -> int:
    limit = require(raw, "limit", int, where)
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
    check_keys(raw, {"limit", "key", "name"}, where)
    key = concurrency_key(optional(raw, "key", str, where, ""), where)
    name = _limit_name(raw, where, str(raw_step.get("type", "")))
    return ConcurrencyLimit(name, _limit_count(raw, where), key)


def concurrency_key(path: str, where: str) -> tuple[str, ...]:
    """A concurrency limit's ``key`` as written (a dotted path in the run's input, ``$.``
    allowed before it; "" for none) as the limit holds it; ``where``: the limit's place."""
    key = tuple(path.removeprefix("$.").split(".")) if path else ()
    if any(not part for part in key):
        raise ValidationError(
            f"{where}.key: {path!r} is a dotted path in the input, e.g. 'customer.id'"
        )
    return key


def _parse_rate_limit(raw_step: Mapping[str, Any], where: str) -> StepRateLimit | None:
    raw = raw_step.get("rate_limit")
    if raw is None:
        return None
    where = f"{where}.rate_limit"
    if not isinstance(raw, dict):
        raise ValidationError(f"{where}: expected an object, e.g. {{'limit': 100, 'per_s': 60}}")
    check_keys(raw, {"limit", "per_s", "name"}, where)
    per_s = require(raw, "per_s", (int, float), where)
    per_ms = round(per_s * 1000)
    if not 1 <= per_ms <= MAX_BACKOFF_MS:
        raise ValidationError(f"{where}.per_s: must be between 0.001 and a week (604800)")
    name = _limit_name(raw, where, str(raw_step.get("type", "")))
    return StepRateLimit(name, _limit_count(raw, where), per_ms)


def _dependencies(raw_step: Mapping[str, Any], where: str) -> tuple[str, ...]:
    deps = optional(raw_step, "depends_on", list, where, [])
    if not all(isinstance(d, str) for d in deps):
        raise ValidationError(f"{where}.depends_on: expected a list of step names")
    if len(set(deps)) != len(deps):
        raise ValidationError(f"{where}.depends_on: a dependency is listed twice")
    return tuple(deps)


def _parse_wait(raw_step: Mapping[str, Any], where: str) -> StepDef:
    """A step that waits for a signal: no worker runs it, so it has no type, queue or
    heartbeat; its timeout is how long it waits (an attempt), its retry policy whether it
    waits again after one timed out (one attempt unless it says so)."""
    check_keys(
        raw_step,
        {"name", "kind", "signal", "depends_on", "retry", "timeout_ms", "on_timeout", "default"}
        | _DECIDE_KEYS,
        where,
    )
    signal = require(raw_step, "signal", str, where)
    if not SIGNAL_NAME.fullmatch(signal):
        raise ValidationError(
            f"{where}.signal: {signal!r} must be 1 to 100 letters, digits, '_', '.', ':' or '-',"
            " starting with a letter or digit"
        )
    if signal == "cancel":
        raise ValidationError(f"{where}.signal: 'cancel' cancels the run; wait for another name")
    timeout_ms = optional(raw_step, "timeout_ms", int, where, WAIT_TIMEOUT_MS)
    if timeout_ms < 1:
        raise ValidationError(f"{where}.timeout_ms: must be >= 1")
    return StepDef(
        name=require(raw_step, "name", str, where),
        step_type="",
        depends_on=_dependencies(raw_step, where),
        retry=parse_retry(raw_step.get("retry", {"max_attempts": 1}), f"{where}.retry"),
        timeout_ms=timeout_ms,
        kind=WAIT,
        signal=signal,
        **_on_timeout(raw_step, where),
    )


def _on_timeout(raw_step: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A wait step's ``on_timeout`` ("fail", the default, or "continue") and ``default`` (its
    output when it continues; null when absent), as StepDef's fields."""
    on_timeout = optional(raw_step, "on_timeout", str, where, ON_TIMEOUT_FAIL)
    if on_timeout not in (ON_TIMEOUT_FAIL, ON_TIMEOUT_CONTINUE):
        raise ValidationError(
            f"{where}.on_timeout: must be 'fail' or 'continue', not {on_timeout!r}"
        )
    if "default" not in raw_step:
        return {"on_timeout": on_timeout}
    if on_timeout != ON_TIMEOUT_CONTINUE:
        raise ValidationError(f"{where}.default: only a step with on_timeout 'continue' has one")
    default = raw_step["default"]
    if default is None:
        return {"on_timeout": on_timeout}
    try:
        text = orjson.dumps(default, option=orjson.OPT_SORT_KEYS).decode()
    except TypeError as not_json:  # (only from code: JSON documents hold JSON values)
        raise ValidationError(f"{where}.default: not JSON: {not_json}") from None
    if len(text) > MAX_DEFAULT_BYTES:
        raise ValidationError(f"{where}.default: at most {MAX_DEFAULT_BYTES} bytes of JSON")
    return {"on_timeout": on_timeout, "default_output": text}


def _parse_sleep(raw_step: Mapping[str, Any], where: str) -> StepDef:
    """A step that sleeps, costing no worker: for ``duration_ms``, or until the time its
    ``until`` selector finds in the run (one of the two); core/sleeps.py."""
    check_keys(
        raw_step, {"name", "kind", "depends_on", "duration_ms", "until"} | _DECIDE_KEYS, where
    )
    deps = _dependencies(raw_step, where)
    if ("duration_ms" in raw_step) == ("until" in raw_step):
        raise ValidationError(f"{where}: a sleep step has either duration_ms or until")
    duration = optional(raw_step, "duration_ms", int, where, None)
    if duration is not None and not 0 <= duration <= MAX_TIMEOUT_MS:
        raise ValidationError(
            f"{where}.duration_ms: must be between 0 and {MAX_TIMEOUT_MS} (ten years)"
        )
    until = None
    if "until" in raw_step:
        try:
            until = parse_selector(raw_step["until"])
        except BadSelector as bad:
            raise ValidationError(f"{where}.until: {bad}") from None
        if until.step is not None and until.step not in deps:
            raise ValidationError(
                f"{where}.until: {until.step!r} must be one of the steps it depends on"
            )
    return StepDef(
        name=require(raw_step, "name", str, where),
        step_type="",
        depends_on=deps,
        retry=RetryPolicy(max_attempts=1),
        kind=SLEEP,
        sleep_ms=duration,
        until=until,
    )


def _parse_map(raw_step: Mapping[str, Any], where: str, step: StepDef) -> StepDef:
    """A task step run once per item: where its items come from, how many, how many at once."""
    items_from = optional(raw_step, "items_from", str, where, None)
    if items_from is not None and items_from not in step.depends_on:
        raise ValidationError(
            f"{where}.items_from: {items_from!r} must be one of the steps it depends on"
        )
    max_items = optional(raw_step, "max_items", int, where, MAP_ITEMS)
    if not 1 <= max_items <= MAP_ITEMS_LIMIT:
        raise ValidationError(f"{where}.max_items: must be between 1 and {MAP_ITEMS_LIMIT}")
    parallelism = optional(raw_step, "parallelism", int, where, MAP_PARALLELISM)
    if not 1 <= parallelism <= MAP_PARALLELISM_LIMIT:
        raise ValidationError(f"{where}.parallelism: must be between 1 and {MAP_PARALLELISM_LIMIT}")
    return replace(
        step, kind=MAP, items_from=items_from, max_items=max_items, parallelism=parallelism
    )


def _parse_child(raw_step: Mapping[str, Any], where: str) -> StepDef:
    """A step that starts a child run of another workflow and ends as it does."""
    check_keys(
        raw_step,
        {"name", "kind", "workflow", "version", "input_from", "depends_on", "retry", "timeout_ms"}
        | _DECIDE_KEYS,
        where,
    )
    child = require(raw_step, "workflow", str, where)
    if not child or len(child) > 200:
        raise ValidationError(f"{where}.workflow: must be 1 to 200 characters")
    version = optional(raw_step, "version", int, where, None)
    if version is not None and version < 1:
        raise ValidationError(f"{where}.version: must be >= 1")
    deps = _dependencies(raw_step, where)
    input_from = optional(raw_step, "input_from", str, where, None)
    if input_from is not None and input_from not in deps:
        raise ValidationError(
            f"{where}.input_from: {input_from!r} must be one of the steps it depends on"
        )
    timeout_ms = optional(raw_step, "timeout_ms", int, where, CHILD_TIMEOUT_MS)
    if timeout_ms < 1:
        raise ValidationError(f"{where}.timeout_ms: must be >= 1")
    return StepDef(
        name=require(raw_step, "name", str, where),
        step_type="",
        depends_on=deps,
        retry=parse_retry(raw_step.get("retry", {"max_attempts": 1}), f"{where}.retry"),
        timeout_ms=timeout_ms,
        kind=WORKFLOW,
        child_workflow=child,
        child_version=version,
        input_from=input_from,
    )
