"""Triggers: the records of a team's own topic, mapped to start or signal requests without
glue code (docs/requests.md#triggers). A trigger names its source topic, what each record does
(start a run of a workflow, or signal one), where the run id comes from (a JSON path into the
value, a header, the key, or the record's position), where the input comes from (a JSON path,
the whole value by default), and an optional filter on one field.

Mapping a record is pure and never raises on what the record holds: a record is a request
(joining the request statement as one read from ``ductor.requests`` would), ``Filtered``
(done, nothing to do), or ``Rejected`` with its dead-letter reason.

The stored form (``eec_trigger.definition``) is the JSON ``Trigger.to_json`` writes;
``parse_trigger`` reads it back and is what ``ductor triggers create`` checks a new one with.

A trigger's definition is its scope (``trigger_scope``, core/scopes.py): it starts its one
workflow or sends its one signal, to run ids under its prefix; a signal trigger must have a
prefix (one stored without, from before that rule, cannot be read, and is not followed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, NamedTuple

import orjson

from processor.core.bounds import json_problem, literal_problem, text_problem
from processor.core.envelope import MAX_RUN_ID_LENGTH, Rejected
from processor.core.model import SignalKind
from processor.core.outcomes import DeadLetterReason
from processor.core.records import Inbound
from processor.core.requests import (
    MAX_NAME_LENGTH,
    MAX_WORKFLOW_VERSION,
    Request,
    SignalRequest,
    StartRequest,
)
from processor.core.routing import TIERS
from processor.core.run_ids import reserved_problem
from processor.core.scopes import Scope
from processor.core.workflow_def import SIGNAL_NAME

TRIGGER_VERSION = 1
ACTIONS = ("start", "signal")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
# A JSON path, the subset a trigger needs: $ alone, or $ then .name or [index] steps.
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]|\[\"([^\"]*)\"\]")

PathStep = str | int
_MISSING = object()


@dataclass(frozen=True)
class JsonPath:
    """A path into a JSON document: ``$``, ``$.order.id``, ``$.items[0]``, ``$["a b"]``."""

    text: str
    steps: tuple[PathStep, ...]

    def pick(self, document: Any) -> Any:
        """The value at the path, or ``_MISSING``."""
        for step in self.steps:
            if isinstance(step, int):
                if not isinstance(document, list) or step >= len(document):
                    return _MISSING
            elif not isinstance(document, dict) or step not in document:
                return _MISSING
            document = document[step]
        return document


def parse_path(text: str) -> JsonPath:
    """A JSON path, or ValueError saying what is wrong with it."""
    if not text.startswith("$"):
        raise ValueError(f"a JSON path starts with $ (as in $.order.id), not {text!r}")
    steps: list[PathStep] = []
    at = 1
    while at < len(text):
        match = _STEP.match(text, at)
        if match is None:
            raise ValueError(
                f"cannot read the JSON path {text!r} from {text[at:]!r}: a step is .name,"
                ' [index] or ["name"]'
            )
        name, index, quoted = match.groups()
        steps.append(int(index) if index is not None else (name or quoted or ""))
        at = match.end()
    return JsonPath(text, tuple(steps))


WHOLE_VALUE = parse_path("$")


@dataclass(frozen=True)
class RunIdFrom:
    """Where a record's run id comes from: ``value`` (a JSON path), ``header`` (its name),
    ``key``, or ``position`` (the trigger's name, the partition and the offset: one run per
    record, the same again when the record is read again)."""

    kind: str
    path: JsonPath | None = None
    header: str = ""

    @property
    def text(self) -> str:
        if self.kind == "value":
            assert self.path is not None
            return self.path.text
        return f"header:{self.header}" if self.kind == "header" else self.kind


def parse_run_id_from(text: str) -> RunIdFrom:
    if text in ("key", "position"):
        return RunIdFrom(text)
    if text.startswith("header:"):
        name = text.removeprefix("header:")
        if not name:
            raise ValueError("header: needs the header's name, as in header:order-id")
        return RunIdFrom("header", header=name)
    if text.startswith("$"):
        return RunIdFrom("value", path=parse_path(text))
    raise ValueError(
        f"the run id comes from a JSON path ($.order_id), header:NAME, key or position,"
        f" not {text!r}"
    )


@dataclass(frozen=True)
class Filter:
    """Only records whose value has ``equals`` at ``path`` are mapped."""

    path: JsonPath
    equals: Any


@dataclass(frozen=True)
class Trigger:
    name: str
    topic: str
    action: str  # "start" or "signal"
    run_id: RunIdFrom
    workflow: str = ""  # a start's workflow
    workflow_version: int | None = None  # a start's version; its latest when None
    tier: str = "t1"  # a start's wakeup tier
    signal: str = SignalKind.CANCEL.value  # a signal's name
    run_id_prefix: str = ""
    input: JsonPath = WHOLE_VALUE  # a start's input, a signal's payload
    filter: Filter | None = None
    # Where each partition's reading starts when the group has no offset for it yet: the end
    # of the topic when the trigger was created (records written since are all seen); a
    # partition not named (added later, or --from-beginning) from its first record. Not part
    # of the definition: the same trigger created again later is the same trigger.
    start_offsets: tuple[tuple[int, int], ...] = ()

    def start_offset(self, partition: int) -> int | None:
        """Where a partition without a committed offset starts (None: its beginning)."""
        return dict(self.start_offsets).get(partition)

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "trigger_version": TRIGGER_VERSION,
            "topic": self.topic,
            "action": self.action,
            "run_id": self.run_id.text,
            "input": self.input.text,
        }
        if self.action == "start":
            body |= {"workflow": self.workflow, "tier": self.tier}
            if self.workflow_version is not None:
                body["workflow_version"] = self.workflow_version
        else:
            body["signal"] = self.signal
        if self.run_id_prefix:
            body["run_id_prefix"] = self.run_id_prefix
        if self.filter is not None:
            body["filter"] = {"path": self.filter.path.text, "equals": self.filter.equals}
        return body


_FIELDS = frozenset(
    {
        "trigger_version",
        "topic",
        "action",
        "run_id",
        "input",
        "workflow",
        "workflow_version",
        "tier",
        "signal",
        "run_id_prefix",
        "filter",
    }
)


def parse_trigger(name: str, raw: Any, start_offsets: tuple[tuple[int, int], ...] = ()) -> Trigger:
    """A trigger from its stored form, or ValueError saying what to fix."""
    raw = _trigger_object(name, raw)
    topic = raw.get("topic")
    if not isinstance(topic, str) or not topic:
        raise ValueError("a trigger names its source topic")
    action = raw.get("action")
    if action not in ACTIONS:
        raise ValueError(f"action must be one of {', '.join(ACTIONS)}")
    run_id = parse_run_id_from(_text(raw, "run_id", "position"))
    prefix = _text(raw, "run_id_prefix", "")
    if len(prefix) >= MAX_RUN_ID_LENGTH or "\x00" in prefix:
        raise ValueError("run_id_prefix is too long or holds a NUL")
    fields: dict[str, Any] = {"input": parse_path(_text(raw, "input", "$"))}
    if action == "start":
        fields |= _start_fields(raw)
    else:
        fields["signal"] = _signal_field(raw)
        if run_id.kind == "position":
            raise ValueError("a signal trigger takes its run id from the record, not its position")
        _require_signal_scope(prefix)
    if "filter" in raw:
        fields["filter"] = _filter(raw["filter"])
    return Trigger(
        name, topic, action, run_id, run_id_prefix=prefix, start_offsets=start_offsets, **fields
    )


def _trigger_object(name: str, raw: Any) -> dict[str, Any]:
    """``raw`` once its name, its fields and its version are known to be a trigger's."""
    if not _NAME.match(name):
        raise ValueError(
            f"a trigger's name is 1 to 100 letters, digits, '.', '_' or '-', not {name!r}"
        )
    if not isinstance(raw, dict):
        raise ValueError("a trigger is a JSON object")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise ValueError(f"unknown trigger field(s): {', '.join(sorted(unknown))}")
    if raw.get("trigger_version") != TRIGGER_VERSION:
        raise ValueError(f"trigger_version must be {TRIGGER_VERSION}")
    return raw


def _start_fields(raw: dict[str, Any]) -> dict[str, Any]:
    """A start trigger's own fields: the workflow (and version) it starts, on which tier."""
    workflow = raw.get("workflow")
    if not isinstance(workflow, str) or not 1 <= len(workflow) <= MAX_NAME_LENGTH:
        raise ValueError("a start trigger names its workflow")
    version = raw.get("workflow_version")
    if version is not None and (
        type(version) is not int or not 1 <= version <= MAX_WORKFLOW_VERSION
    ):
        raise ValueError("workflow_version must be a positive integer")
    tier = raw.get("tier", "t1")
    if tier not in TIERS:
        raise ValueError(f"tier must be one of {', '.join(TIERS)}")
    return {"workflow": workflow, "workflow_version": version, "tier": tier}


def _signal_field(raw: dict[str, Any]) -> str:
    """A signal trigger's signal: cancel, or the name a wait step waits for."""
    signal = raw.get("signal", SignalKind.CANCEL.value)
    if not isinstance(signal, str) or not SIGNAL_NAME.fullmatch(signal):
        raise ValueError(
            "signal must be cancel or the name of a signal a wait step waits for (1 to 100"
            " letters, digits, '_', '.', ':' or '-')"
        )
    return signal


def _filter(given: Any) -> Filter:
    if not isinstance(given, dict) or set(given) != {"path", "equals"}:
        raise ValueError('a filter is {"path": "$.field", "equals": VALUE}')
    return Filter(parse_path(str(given["path"])), given["equals"])


def _require_signal_scope(prefix: str) -> None:
    """A signal trigger reaches only the runs under its prefix: without one, whoever writes
    its topic could signal (cancel, approve) every run there is."""
    if not prefix:
        raise ValueError(
            "a signal trigger needs a run-id prefix (--run-id-prefix): it may signal only the"
            " runs whose ids begin with it, not every run"
        )


def trigger_scope(trigger: Trigger) -> Scope:
    """What the trigger's records may ask for (core/scopes.py): its definition is its scope,
    the one workflow it starts or the one signal it sends, to run ids under its prefix."""
    door = f"trigger {trigger.name}"
    prefixes = (trigger.run_id_prefix,) if trigger.run_id_prefix else None
    if trigger.action == "start":
        return Scope(door, (trigger.workflow,), prefixes, ())
    return Scope(door, (), prefixes, (trigger.signal,))


def _text(raw: dict[str, Any], field: str, default: str) -> str:
    value = raw.get(field, default)
    if not isinstance(value, str):
        raise ValueError(f"{field} must be a string")
    return value


class Filtered(NamedTuple):
    """The record does not match the trigger's filter: done, nothing to do."""

    detail: str


def map_record(trigger: Trigger, record: Inbound, max_bytes: int) -> Request | Filtered | Rejected:
    """What a record of the trigger's topic asks for."""
    value = record.value
    if value is None:
        return _wrong("the record has no value (tombstone)")
    if len(value) > max_bytes:
        return Rejected(DeadLetterReason.OVERSIZE, f"{len(value)} bytes > {max_bytes}")
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        return Rejected(DeadLetterReason.NOT_JSON, f"value is not JSON: {exc}")
    if trigger.filter is not None:
        found = trigger.filter.path.pick(document)
        if found is _MISSING or found != trigger.filter.equals:
            return Filtered(f"{trigger.filter.path.text} is not {trigger.filter.equals!r}")
    run_id = _run_id(trigger, record, document)
    if isinstance(run_id, Rejected):
        return run_id
    data = trigger.input.pick(document)
    if data is _MISSING:
        return _wrong(f"the value has nothing at {trigger.input.text} (the trigger's input)")
    # The same bounds as a request's (core/bounds.py), as read and as written.
    problem = json_problem(data) or literal_problem(value, trigger.input.pick)
    if problem is not None:
        name = f"the input ({trigger.input.text} of the value)"
        return Rejected(DeadLetterReason.OUT_OF_BOUNDS, problem.describe(name))
    return _request(trigger, record, run_id, data)


def _request(trigger: Trigger, record: Inbound, run_id: str, data: Any) -> Request | Rejected:
    """What the trigger asks for of run ``run_id`` with ``data``: a start or a signal."""
    if trigger.action == "start":
        reserved = reserved_problem(run_id)
        if reserved is not None:
            return Rejected(DeadLetterReason.RESERVED_RUN_ID, reserved)
        return StartRequest(run_id, trigger.workflow, trigger.workflow_version, data, trigger.tier)
    signal_id = f"{trigger.name}:{record.tp[1]}:{record.offset}"
    return SignalRequest(run_id, trigger.signal, signal_id, data)


def _run_id(trigger: Trigger, record: Inbound, document: Any) -> str | Rejected:
    source = trigger.run_id
    found: Any
    if source.kind == "position":
        found = f"{trigger.name}:{record.tp[1]}:{record.offset}"
    elif source.kind == "key":
        found = _utf8(record.key)
    elif source.kind == "header":
        values = [v for k, v in record.headers if k == source.header]
        found = _utf8(values[-1]) if values else _MISSING
    else:
        assert source.path is not None
        found = source.path.pick(document)
        if type(found) is int:
            found = str(found)
    if not isinstance(found, str) or not found:
        return _wrong(f"the record has no run id at {source.text} (a non-empty string)")
    run_id = trigger.run_id_prefix + found
    if len(run_id) > MAX_RUN_ID_LENGTH:
        return _wrong(f"the run id at {source.text} is longer than {MAX_RUN_ID_LENGTH}")
    problem = text_problem(run_id, MAX_RUN_ID_LENGTH)
    if problem is not None:
        return Rejected(DeadLetterReason.OUT_OF_BOUNDS, f"the run id {problem}")
    return run_id


def _utf8(raw: bytes | None) -> Any:
    if raw is None:
        return _MISSING
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return _MISSING


def _wrong(detail: str) -> Rejected:
    return Rejected(DeadLetterReason.WRONG_SCHEMA, detail)
