"""The step task: what the coordinator sends to the workers on the steps topic.

A task names one attempt of one step, the attempts of the step's dependencies whose outputs it
reads (``dep_attempts``) and, when they are at hand and small, the data itself (``data``: the
run's input and those outputs). The format, one JSON object:

    {"task_version": 1, "run_id": ..., "node": ..., "attempt": 1, "step_type": ...,
     "deadline_ms": ..., "tier": "t1",
     "timeout_ms": 30000,                                    # start-to-close
     "start_by_ms": ..., "close_by_ms": ...,                 # only when the step bounds them
     "heartbeat_timeout_ms": 5000,                           # only when the step declares one
     "dep_attempts": {"fetch": 1},                           # dependency -> attempt that succeeded
     "data": {"input": {...}, "deps": {"fetch": {...}}},     # inline; null: the worker fetches
     "item": {"from": "fetch", "index": 3},                  # an item of a map step (version 2)
     "step_version": 2}                                      # its function's version (version 3)

The data is inline only when its encoded JSON is at most ``MAX_INLINE_DATA_BYTES``; otherwise
``data`` is null and the worker reads the run's input and those outputs from Postgres in one
query per batch (docs/operations/steps.md, "How the data travels", says why the bound is what
it is).

Timeouts. A task with ``timeout_ms`` is judged by Temporal's three timeouts (core/tick.py,
rule 4): the worker runs it for at most ``timeout_ms`` from the moment it starts it (its
deadline is its start plus that, ``close_by_ms`` at the latest), whatever the task waited in
its queue, and takes it only until ``start_by_ms`` (its schedule-to-start and schedule-to-close
bounds; absent: no bound). Its ``deadline_ms`` is its dispatch plus its timeout: what a worker
from before start-to-close took for its deadline, skipping the task once it passed. Such a
worker, given tasks by a coordinator that counts timeouts from their start, skips those that
waited in their queue longer than their timeout, and the coordinator, which never saw them
started, waits for them: upgrade the workers first.

``task_version`` stays 1: ``dep_attempts``, ``data``, ``heartbeat_timeout_ms`` and the
timeouts are optional additions. A worker from
before them ignores fields it does not know and runs the task as before, and a worker from
after them reads a task without them (from an older coordinator) as "fetch everything", finding
the dependencies in the run's definition and state. Coordinators and workers can so be
upgraded in any order. The version is for changes an older worker must not run: a map step's
item (``item``: which list, the run's input when ``from`` is null, and which element of it)
is version 2, which a worker from before map steps dead-letters instead of running it without
its item (upgrade the workers before the workflows that map). A task whose run pinned its
step type's function at a version other than 1 (``step_version``: core/versions.py) is version
3 (with or without an item): a worker from before versions has only version 1 of each
function, and must not run it with that one (upgrade the workers before deploying a version
2). A task at version 1 has no ``step_version`` and stays version 1 or 2, which every worker
runs with its version 1 function, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import orjson

from processor.core.envelope import MAX_ATTEMPT
from processor.core.shapes import AttemptRef
from processor.core.task_fields import check_fields, check_timeouts, task_step_version
from processor.core.workflow_def import ValidationError

STEP_TASK_VERSION = 1
MAP_ITEM_TASK_VERSION = 2  # a task with ``item``
STEP_VERSION_TASK_VERSION = 3  # a task with ``step_version`` (and, maybe, ``item``)
_TASK_VERSIONS = (STEP_TASK_VERSION, MAP_ITEM_TASK_VERSION, STEP_VERSION_TASK_VERSION)

# The largest ``data`` a task carries inline: the encoded JSON of the run's input and the
# dependencies' outputs. Inline data goes through the coordinator's commit (the outbox row)
# and costs it about 25 us per KiB; a worker's fetch costs a few tens of us per task, paid by
# the workers and the database, not the coordinator. 2 KiB keeps the common small input
# inline and every larger one off the coordinator's path.
MAX_INLINE_DATA_BYTES = 2 * 1024

NO_DEPS: Mapping[str, Any] = MappingProxyType({})

# (dependency, its attempt that succeeded), in the step's depends_on order.
DepAttempts = tuple[AttemptRef, ...]


class AttemptKey(NamedTuple):
    """One attempt of one step of one run: what a result, a start and a task are keyed by."""

    run_id: str
    node: str
    attempt: int


class MapItem(NamedTuple):
    """Which item of a map step a task is: element ``position`` of the run's input (``source``
    None) or of the output of dependency ``source``."""

    source: str | None
    position: int


class StepData(NamedTuple):
    """What a step reads besides its own identity: the run's input, and the outputs of the
    step's dependencies by step name (read-only)."""

    input: Any
    deps: Mapping[str, Any] = NO_DEPS

    def to_json(self) -> dict[str, Any]:
        return {"input": self.input, "deps": dict(self.deps)}


def step_data(run_input: Any, deps: Mapping[str, Any]) -> StepData:
    """``StepData(run_input, MappingProxyType(deps))``, made as ``tuple.__new__`` makes it: a
    NamedTuple's own constructor is Python code, also in the compiled build, and a worker makes
    one per task that reads its data."""
    return tuple.__new__(StepData, (run_input, MappingProxyType(deps)))


@dataclass(frozen=True)
class StepTask:
    run_id: str
    node: str
    attempt: int
    step_type: str
    deadline_ms: int
    tier: str = "t1"  # the run's tier: the worker's wakeup goes back on it
    # The dependencies whose outputs the step reads, each with its attempt that succeeded.
    # None: a task from a coordinator older than data flow, which did not say.
    dep_attempts: DepAttempts | None = None
    # The run's input and the dependencies' outputs, when the coordinator had them at hand;
    # carried inline only up to MAX_INLINE_DATA_BYTES (``encode``). None: the worker fetches.
    data: StepData | None = None
    # The step's heartbeat timeout (core/workflow.py), None when it declares none.
    heartbeat_timeout_ms: int | None = None
    # The item it runs, for an item of a map step.
    item: MapItem | None = None
    # Start-to-close (ms): how long it may run from its start (None: a task from a
    # coordinator before it, whose ``deadline_ms`` is the deadline). ``start_by_ms``: it is
    # not taken after this (schedule-to-start or -to-close); ``close_by_ms``: it ends by this
    # whenever it started (schedule-to-close). Epoch ms, in the reader's clock once decoded.
    timeout_ms: int | None = None
    start_by_ms: int | None = None
    close_by_ms: int | None = None
    # The version of its step type's function it runs (its run's pin: core/versions.py).
    step_version: int = 1

    # Written out: compiled in the compiled build (the decorator's is interpreted Python, ~20 x
    # dearer), and one is built per task dispatched and per task a worker reads.
    # tests/unit/test_dataclass_inits.py holds it to its fields.
    def __init__(
        self,
        run_id: str,
        node: str,
        attempt: int,
        step_type: str,
        deadline_ms: int,
        tier: str = "t1",
        dep_attempts: DepAttempts | None = None,
        data: StepData | None = None,
        heartbeat_timeout_ms: int | None = None,
        item: MapItem | None = None,
        timeout_ms: int | None = None,
        start_by_ms: int | None = None,
        close_by_ms: int | None = None,
        step_version: int = 1,
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "step_type", step_type)
        object.__setattr__(self, "deadline_ms", deadline_ms)
        object.__setattr__(self, "tier", tier)
        object.__setattr__(self, "dep_attempts", dep_attempts)
        object.__setattr__(self, "data", data)
        object.__setattr__(self, "heartbeat_timeout_ms", heartbeat_timeout_ms)
        object.__setattr__(self, "item", item)
        object.__setattr__(self, "timeout_ms", timeout_ms)
        object.__setattr__(self, "start_by_ms", start_by_ms)
        object.__setattr__(self, "close_by_ms", close_by_ms)
        object.__setattr__(self, "step_version", step_version)

    @property
    def key(self) -> AttemptKey:
        # tuple.__new__: a NamedTuple's own constructor is Python code, also compiled.
        return tuple.__new__(AttemptKey, (self.run_id, self.node, self.attempt))

    def encode(self) -> bytes:
        return encode_task(
            self.run_id,
            self.node,
            self.attempt,
            self.step_type,
            self.deadline_ms,
            self.tier,
            self.dep_attempts,
            self.data,
            self.heartbeat_timeout_ms,
            self.item,
            self.timeout_ms,
            self.start_by_ms,
            self.close_by_ms,
            self.step_version,
        )

    def taken_until_ms(self) -> int | None:
        """The last moment (epoch ms) a worker may take it: its ``start_by_ms`` (None: no
        bound), or the deadline of a task from before start-to-close."""
        return self.deadline_ms if self.timeout_ms is None else self.start_by_ms

    def deadline_from(self, start_ms: int) -> int:
        """Its deadline (epoch ms) once it started at ``start_ms``: the start plus its
        timeout, ``close_by_ms`` at the latest (a task from before start-to-close: its
        ``deadline_ms``)."""
        if self.timeout_ms is None:
            return self.deadline_ms
        deadline = start_ms + self.timeout_ms
        return deadline if self.close_by_ms is None else min(deadline, self.close_by_ms)


def encode_task(
    run_id: str,
    node: str,
    attempt: int,
    step_type: str,
    deadline_ms: int,
    tier: str,
    dep_attempts: DepAttempts | None,
    data: StepData | None,
    heartbeat_timeout_ms: int | None = None,
    item: MapItem | None = None,
    timeout_ms: int | None = None,
    start_by_ms: int | None = None,
    close_by_ms: int | None = None,
    step_version: int = 1,
) -> bytes:
    """A task's record value, from its fields (what ``StepTask.encode`` writes; the tick calls
    it directly, one per dispatch, without building the object)."""
    if step_version != 1:
        task_version = STEP_VERSION_TASK_VERSION
    else:
        task_version = STEP_TASK_VERSION if item is None else MAP_ITEM_TASK_VERSION
    body: dict[str, Any] = {
        "task_version": task_version,
        "run_id": run_id,
        "node": node,
        "attempt": attempt,
        "step_type": step_type,
        "deadline_ms": deadline_ms,
        "tier": tier,
    }
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
        if start_by_ms is not None:
            body["start_by_ms"] = start_by_ms
        if close_by_ms is not None:
            body["close_by_ms"] = close_by_ms
    if heartbeat_timeout_ms is not None:
        body["heartbeat_timeout_ms"] = heartbeat_timeout_ms
    if dep_attempts is not None:
        body["dep_attempts"] = dict(dep_attempts)
        body["data"] = inline_data(data)
    if item is not None:
        body["item"] = {"from": item.source, "index": item.position}
    if step_version != 1:
        body["step_version"] = step_version
    return orjson.dumps(body)


def inline_data(data: StepData | None) -> orjson.Fragment | None:
    """``data`` encoded, if it is small enough to travel inline (None: the worker fetches)."""
    if data is None:
        return None
    encoded = orjson.dumps(data.to_json())
    if len(encoded) > MAX_INLINE_DATA_BYTES:
        return None
    return orjson.Fragment(encoded)  # written into the task as it is: encoded once


def decode_step_task(value: bytes | None, clock_offset_ms: int = 0) -> StepTask:
    """Parse a step task or raise ValidationError saying what is wrong. Its deadline, in the
    clock of the coordinator that wrote it, is moved by ``clock_offset_ms`` into the reader's
    (the bounds are checked on the deadline as written)."""
    raw, version = _task_object(value)
    # Each field is read and checked before the task is built: a compiled build (mypyc)
    # checks a field's type as the object is made, so a wrong one must be refused first (and
    # the checks below take Any for that reason).
    try:
        run_id, node, attempt = raw["run_id"], raw["node"], raw["attempt"]
        step_type, deadline_ms = raw["step_type"], raw["deadline_ms"]
    except KeyError as missing:
        raise ValidationError(f"step task is missing {missing.args[0]!r}") from None
    if clock_offset_ms and type(deadline_ms) is int:
        deadline_ms -= clock_offset_ms
    tier = raw.get("tier", "t1")
    dep_attempts = _dep_attempts(raw.get("dep_attempts"))
    data = _data(raw.get("data"))
    beat = raw.get("heartbeat_timeout_ms")
    item = _item(raw.get("item"), version)
    versioned = version == STEP_VERSION_TASK_VERSION
    step_version = task_step_version(raw.get("step_version"), versioned)
    timeout_ms = raw.get("timeout_ms")
    start_by, close_by = raw.get("start_by_ms"), raw.get("close_by_ms")
    check_fields(run_id, node, step_type, tier, attempt, deadline_ms, clock_offset_ms)
    check_timeouts(beat, timeout_ms, start_by, close_by)
    if clock_offset_ms:  # in the reader's clock, as the deadline
        start_by = None if start_by is None else start_by - clock_offset_ms
        close_by = None if close_by is None else close_by - clock_offset_ms
    return StepTask(
        run_id,
        node,
        attempt,
        step_type,
        deadline_ms,
        tier,
        dep_attempts,
        data,
        beat,
        item,
        timeout_ms,
        start_by,
        close_by,
        step_version,
    )


def _task_object(value: bytes | None) -> tuple[dict[str, Any], int]:
    """The task's JSON object and its version, or ValidationError."""
    if value is None:
        raise ValidationError("step task has no value")
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"step task is not JSON: {exc}") from None
    version = raw.get("task_version") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or type(version) is not int or version not in _TASK_VERSIONS:
        raise ValidationError(
            f"step task must be an object with task_version {STEP_TASK_VERSION},"
            f" {MAP_ITEM_TASK_VERSION} or {STEP_VERSION_TASK_VERSION}"
        )
    return raw, version


def _item(raw: Any, version: int) -> MapItem | None:
    if raw is None:
        if version == MAP_ITEM_TASK_VERSION:
            raise ValidationError("step task: a version 2 task is a map's item, and has none")
        return None
    if not isinstance(raw, dict) or set(raw) != {"from", "index"}:
        raise ValidationError("step task: item must be an object with from and index")
    source, index = raw["from"], raw["index"]
    if source is not None and (not isinstance(source, str) or "\x00" in source):
        raise ValidationError("step task: item.from must be a step name or null")
    if type(index) is not int or not 0 <= index < 1_000_000:
        raise ValidationError("step task: item.index must be a list index")
    return MapItem(source, index)


def _dep_attempts(raw: Any) -> DepAttempts | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValidationError("step task: dep_attempts must be an object of step names")
    for name, attempt in raw.items():
        # The names and attempts go into the worker's fetch query.
        if "\x00" in name:
            raise ValidationError("step task: a NUL character, which Postgres cannot store")
        if type(attempt) is not int or not 1 <= attempt <= MAX_ATTEMPT:
            raise ValidationError(f"step task: dep_attempts.{name} must be an attempt number")
    return tuple(raw.items())


def _data(raw: Any) -> StepData | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or set(raw) != {"input", "deps"}:
        raise ValidationError("step task: data must be an object with input and deps")
    if not isinstance(raw["deps"], dict):
        raise ValidationError("step task: data.deps must be an object of step outputs")
    return step_data(raw["input"], raw["deps"])
