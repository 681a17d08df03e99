"""The chaos run's hostile records, kind by kind (``KINDS``), each with the dead-letter reason
it must get (processor/tools/chaos_hostile.py writes them, chaos_hostile_check.py checks
what became of them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import orjson

from processor.core.outcomes import DeadLetterReason

MAP_WORKFLOW = "chaos-map"
APPROVAL = "approved"  # the one signal the scope lets through: the map run's wait step's
_DEPTH = 300  # what crash-looped every processor once (issue 40)
_PAST_READERS = 1030  # deeper than orjson reads (1,024 levels)
_OVERSIZE = 70_000  # characters: past DUCTOR_MAX_RECORD_BYTES' default (64 KiB)


@dataclass(frozen=True)
class Target:
    """What a hostile record is written about: its number, a chaos run that exists (started
    by the feeder: it may have ended), and the run's prefixes."""

    n: int
    live: str
    topic_prefix: str
    map_id: str

    @property
    def prefix(self) -> str:
        return f"{self.topic_prefix}-"


@dataclass(frozen=True)
class Kind:
    name: str
    reason: DeadLetterReason
    build: Callable[[Target], tuple[str, bytes]]  # (key, value)


def nest(depth: int, leaf: bytes = b"1") -> bytes:
    return b"[" * depth + leaf + b"]" * depth


def _start(run_id: str, workflow: str, run_input: bytes = b"{}") -> bytes:
    """A start request written by hand (``run_input``: raw JSON, however hostile)."""
    return (
        b'{"request_version":1,"kind":"start","run_id":'
        + orjson.dumps(run_id)
        + b',"workflow":'
        + orjson.dumps(workflow)
        + b',"input":'
        + run_input
        + b"}"
    )


def _signal(run_id: str, name: str, signal_id: str, payload: bytes = b"{}") -> bytes:
    return (
        b'{"request_version":1,"kind":"signal","run_id":'
        + orjson.dumps(run_id)
        + b',"name":'
        + orjson.dumps(name)
        + b',"signal_id":'
        + orjson.dumps(signal_id)
        + b',"payload":'
        + payload
        + b"}"
    )


def _own(t: Target, what: str) -> str:
    """A run id under the map run's prefix (in the scope) that no start creates."""
    return f"{t.map_id}-{what}-{t.n}"


def _deep_start(t: Target) -> tuple[str, bytes]:
    key = _own(t, "deep")
    return key, _start(key, MAP_WORKFLOW, nest(_DEPTH))


def _deep_signal(t: Target) -> tuple[str, bytes]:
    return t.live, _signal(t.live, APPROVAL, f"deep-{t.n}", nest(_DEPTH))


def _deeper_start(t: Target) -> tuple[str, bytes]:
    key = _own(t, "deeper")
    return key, _start(key, MAP_WORKFLOW, nest(_PAST_READERS))


def _nul_run_id(t: Target) -> tuple[str, bytes]:
    return t.live, _start(t.live, MAP_WORKFLOW).replace(b'"run_id":"', b'"run_id":"\\u0000', 1)


def _huge_integer(t: Target) -> tuple[str, bytes]:
    return t.live, _signal(t.live, APPROVAL, f"big-{t.n}", b'{"n":123456789012345678901234567890}')


def _lone_surrogate(t: Target) -> tuple[str, bytes]:
    key = _own(t, "surrogate")
    return key, _start(key, MAP_WORKFLOW, b'"\\ud800"')


def _not_json(t: Target) -> tuple[str, bytes]:
    return t.live, b"\xff\xfe{" + str(t.n).encode()


def _wrong_schema(t: Target) -> tuple[str, bytes]:
    return t.live, b'{"request_version":1,"kind":"stop","run_id":' + orjson.dumps(t.live) + b"}"


def _oversize(t: Target) -> tuple[str, bytes]:
    key = _own(t, "big")
    return key, _start(key, MAP_WORKFLOW, orjson.dumps("x" * _OVERSIZE))


def _schedule_id(t: Target) -> tuple[str, bytes]:
    key = f"{t.prefix}nightly@2030-01-01T00:00:00Z"
    return key, _start(key, MAP_WORKFLOW)


def _child_id(t: Target) -> tuple[str, bytes]:
    key = f"{t.live}/fetch#1"
    return key, _start(key, MAP_WORKFLOW)


def _colliding(t: Target) -> tuple[str, bytes]:
    return t.live, _start(t.live, MAP_WORKFLOW, orjson.dumps({"collide": t.n}))


def _forged_cancel(t: Target) -> tuple[str, bytes]:
    return t.live, _signal(t.live, "cancel", f"forged-{t.n}")


def _forged_map_cancel(t: Target) -> tuple[str, bytes]:
    return t.map_id, _signal(t.map_id, "cancel", f"forged-{t.n}")


def _forged_approval(t: Target) -> tuple[str, bytes]:
    key = f"other-team-{t.n}"
    return key, _signal(key, APPROVAL, f"forged-{t.n}")


def _forged_start(t: Target) -> tuple[str, bytes]:
    key = f"{t.prefix}forged-{t.n}"
    return key, _start(key, "chaos-sample")


def _stray_approval(t: Target) -> tuple[str, bytes]:
    return t.live, _signal(t.live, APPROVAL, f"stray-{t.n}", b'{"by":"mallory"}')


_OOB, _NOT_JSON = DeadLetterReason.OUT_OF_BOUNDS, DeadLetterReason.NOT_JSON
_NOT_ALLOWED, _RESERVED = DeadLetterReason.NOT_ALLOWED, DeadLetterReason.RESERVED_RUN_ID

# Each kind with the reason it must be refused for, written in this order, in turn.
KINDS: tuple[Kind, ...] = (
    Kind("start nested 300 levels", _OOB, _deep_start),
    Kind("signal nested 300 levels", _OOB, _deep_signal),
    Kind("start nested past what orjson reads", _NOT_JSON, _deeper_start),
    Kind("run id with a NUL", _OOB, _nul_run_id),
    Kind("integer past 64 bits", _OOB, _huge_integer),
    Kind("lone surrogate", _NOT_JSON, _lone_surrogate),
    Kind("not JSON", _NOT_JSON, _not_json),
    Kind("wrong schema", DeadLetterReason.WRONG_SCHEMA, _wrong_schema),
    Kind("oversize", DeadLetterReason.OVERSIZE, _oversize),
    Kind("a schedule's run id", _RESERVED, _schedule_id),
    Kind("a child's run id of a chaos run", _RESERVED, _child_id),
    Kind("a chaos run's own id", DeadLetterReason.CONFLICTING_START, _colliding),
    Kind("forged cancel of a chaos run", _NOT_ALLOWED, _forged_cancel),
    Kind("forged cancel of the map run", _NOT_ALLOWED, _forged_map_cancel),
    Kind("forged approval outside the prefixes", _NOT_ALLOWED, _forged_approval),
    Kind("forged start of another workflow", _NOT_ALLOWED, _forged_start),
    Kind("approval of a run that waits for none", DeadLetterReason.UNKNOWN_SIGNAL, _stray_approval),
)
