"""The data of the pure core: workflow definitions, run state, step results, and the checksum.

Everything here is a frozen value with no I/O. Parsing from JSON raises ``ValidationError`` with
a message that names the offending field; serialising is canonical (sorted keys), so the
checksum of a state is the same wherever it is computed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import InitVar, dataclass, field, replace
from enum import StrEnum
from functools import cached_property
from graphlib import CycleError, TopologicalSorter
from typing import Any, NamedTuple

import orjson


class ValidationError(ValueError):
    """Input that cannot be accepted; the message says what is wrong and where."""


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        # Identity with module globals, not `in` a set: hashing an enum member runs Python
        # code, and so does reading one from its class (the tick asks this for every run).
        return self is _SUCCEEDED or self is _FAILED or self is _CANCELLED


TERMINAL_STATUSES = frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED})
_SUCCEEDED, _FAILED, _CANCELLED = RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED


class NodeStatus(StrEnum):
    PENDING = "pending"  # not dispatched yet (dependencies unmet)
    DISPATCHED = "dispatched"  # attempt `attempt` sent to the workers, waiting for its result
    RETRY_WAIT = "retry_wait"  # attempt `attempt` failed; the next one is due at `due_ms`
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # out of attempts
    CANCELLED = "cancelled"  # the run ended before this node finished


_NODE_STATUSES = {s.value: s for s in NodeStatus}
_RUN_STATUSES = {s.value: s for s in RunStatus}

# ---------------------------------------------------------------------------------------------
# Workflow definitions


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


@dataclass(frozen=True)
class StepDef:
    name: str
    step_type: str
    depends_on: tuple[str, ...] = ()
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    timeout_ms: int = 30_000


@dataclass(frozen=True)
class WorkflowOutput:
    """What a succeeded run stores as its output (``eec_workflow_run.output``): the output of
    one step (``step``), or a mapping of names to steps' outputs (``fields``, in order)."""

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

    @property
    def key(self) -> tuple[str, int]:
        return (self.name, self.version)

    @cached_property
    def step_map(self) -> dict[str, StepDef]:
        """Steps by name (computed once per definition; definitions are immutable)."""
        return {s.name: s for s in self.steps}

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
    _check_keys(raw, {"name", "version", "steps", "description", "output"}, "workflow")
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
        _check_keys(raw_step, {"name", "type", "depends_on", "retry", "timeout_ms"}, where)
        deps = _optional(raw_step, "depends_on", list, where, [])
        if not all(isinstance(d, str) for d in deps):
            raise ValidationError(f"{where}.depends_on: expected a list of step names")
        if len(set(deps)) != len(deps):
            raise ValidationError(f"{where}.depends_on: a dependency is listed twice")
        if not _require(raw_step, "type", str, where):
            raise ValidationError(f"{where}.type: must not be empty")
        timeout_ms = _optional(raw_step, "timeout_ms", int, where, 30_000)
        if timeout_ms < 1:
            raise ValidationError(f"{where}.timeout_ms: must be >= 1")
        steps.append(
            StepDef(
                name=_require(raw_step, "name", str, where),
                step_type=_require(raw_step, "type", str, where),
                depends_on=tuple(deps),
                retry=parse_retry(raw_step.get("retry", {}), f"{where}.retry"),
                timeout_ms=timeout_ms,
            )
        )
    _check_graph(steps)
    output = _parse_output(raw["output"], steps) if "output" in raw else None
    return WorkflowDef(name=name, version=version, steps=tuple(steps), output=output)


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
    return WorkflowOutput(fields=tuple(raw.items()))


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
        "steps": [
            {
                "name": s.name,
                "type": s.step_type,
                "depends_on": list(s.depends_on),
                "retry": {
                    "max_attempts": s.retry.max_attempts,
                    "backoff_ms": s.retry.backoff_ms,
                    "backoff_multiplier": s.retry.backoff_multiplier,
                    "max_backoff_ms": s.retry.max_backoff_ms,
                },
                "timeout_ms": s.timeout_ms,
            }
            for s in wf.steps
        ],
    }
    if wf.output is not None:  # absent otherwise: definitions from before outputs are unchanged
        raw["output"] = wf.output.to_json()
    return raw


# ---------------------------------------------------------------------------------------------
# Run state


class NodeState(NamedTuple):
    """One node of a run's state. A NamedTuple (immutable, compared and hashed in C, made
    without a field-by-field __init__): every loaded run has one per step."""

    status: NodeStatus = NodeStatus.PENDING
    attempt: int = 0  # the attempt in flight or last finished; 0 = never dispatched
    due_ms: int | None = None  # DISPATCHED: deadline; RETRY_WAIT: when the next attempt is due
    error: str | None = None
    # Attempts made before the run was last resumed by `ductor runs retry` (core/resume.py):
    # attempt numbers go on from there, and the retry policy counts only the attempts after.
    attempts_before: int = 0

    def to_json(self) -> dict[str, Any]:
        # The member itself: a StrEnum is its value, and orjson writes it as such (`.value`
        # is a Python-level property call, once per node of every run loaded or committed).
        out: dict[str, Any] = {"status": self.status, "attempt": self.attempt}
        if self.due_ms is not None:
            out["due_ms"] = self.due_ms
        if self.error is not None:
            out["error"] = self.error
        if self.attempts_before:  # written only when set: older states keep their checksum
            out["attempts_before"] = self.attempts_before
        return out

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> NodeState:
        due = raw.get("due_ms")
        # A dict lookup, not NodeStatus(...): this runs for every node of every loaded run.
        return NodeState(
            _NODE_STATUSES[raw["status"]],
            int(raw["attempt"]),
            None if due is None else int(due),
            raw.get("error"),
            int(raw.get("attempts_before", 0)),
        )


@dataclass(frozen=True)
class RunState:
    """What a committed tick writes: the canonical state the checksum covers."""

    status: RunStatus
    nodes: tuple[tuple[str, NodeState], ...]  # in definition order; a tuple keeps it hashable
    seq: int = 0
    reason: str | None = None

    def node(self, name: str) -> NodeState:
        for n, s in self.nodes:
            if n == name:
                return s
        raise KeyError(name)

    def node_map(self) -> dict[str, NodeState]:
        return dict(self.nodes)

    def with_nodes(self, nodes: Mapping[str, NodeState]) -> RunState:
        return replace(self, nodes=tuple((n, nodes[n]) for n, _ in self.nodes))

    def nodes_json(self) -> dict[str, Any]:
        return {n: s.to_json() for n, s in self.nodes}

    def next_due_ms(self) -> int | None:
        """The earliest deadline or retry time: when the run must be woken even if nothing comes."""
        if self.status.terminal:
            return None
        dues = [s.due_ms for _, s in self.nodes if s.due_ms is not None]
        return min(dues) if dues else None


def initial_state(wf: WorkflowDef) -> RunState:
    return RunState(status=RunStatus.PENDING, nodes=tuple((s.name, NodeState()) for s in wf.steps))


def state_checksum(state: RunState) -> str:
    """SHA-256 over the canonical JSON of the state (status, nodes, seq, reason)."""
    return row_checksum(state.status, state.nodes_json(), state.seq, state.reason)


def row_checksum(status: str, nodes: Mapping[str, Any], seq: int, reason: str | None) -> str:
    """The checksum of a row's state as stored (``nodes`` as ``node_states`` holds it): the
    same as ``state_checksum`` of the state it decodes to, without decoding it first. Any key
    the processor would not have written changes it."""
    canonical = orjson.dumps(
        {"status": status, "nodes": nodes, "seq": seq, "reason": reason},
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(canonical).hexdigest()[:32]


def state_from_row(
    status: str, node_states: Mapping[str, Any], seq: int, reason: str | None, wf: WorkflowDef
) -> RunState:
    """Rebuild a state from its row, in the definition's node order."""
    nodes = []
    for step in wf.steps:
        raw = node_states.get(step.name)
        nodes.append((step.name, NodeState() if raw is None else NodeState.from_json(raw)))
    # A dict lookup, not RunStatus(...) (the enum's call runs Python code): once per loaded run.
    return RunState(status=_RUN_STATUSES[status], nodes=tuple(nodes), seq=seq, reason=reason)


# ---------------------------------------------------------------------------------------------
# Inputs of a tick besides the state


class StepOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, order=True)
class StepResult:
    node: str
    attempt: int
    outcome: StepOutcome
    error: str | None = None


class SignalKind(StrEnum):
    CANCEL = "cancel"


@dataclass(frozen=True)
class LoadedRun:
    """A run as loaded from the store, with everything its tick may read."""

    run_id: str
    wf: WorkflowDef
    state: RunState
    version: int
    tier: str
    results: tuple[StepResult, ...] = ()
    signals: frozenset[SignalKind] = frozenset()
    stored_checksum: str = ""
    # The run's input, when the load carried it (a pending run's, if small): what its first
    # dispatches carry inline. None: not loaded (the workers fetch it).
    input: RunInput | None = None
    # Whether the loader found the stored checksum right for the row as stored (row_checksum);
    # when not given, it is checked against the state here.
    verified: InitVar[bool | None] = None
    # False when the row was changed out of band: its checksum does not match its state.
    # Computed once here (it hashes the state), not at every use.
    checksum_ok: bool = field(init=False)

    def __post_init__(self, verified: bool | None) -> None:
        if verified is None:
            verified = self.stored_checksum == state_checksum(self.state)
        object.__setattr__(self, "checksum_ok", verified)

    @property
    def workflow(self) -> tuple[str, int]:
        return self.wf.key


class RunInput(NamedTuple):
    """A run's input as loaded (a wrapper: the input itself may be JSON null)."""

    value: Any


class UnknownWorkflow(LookupError):
    """A run row names a workflow version that is not registered."""


class UnreadableRun(ValueError):
    """A run row whose state does not parse (changed out of band)."""


# What loading one run id can give: the run, or why it cannot be ticked (absent: no such run).
Loaded = LoadedRun | UnknownWorkflow | UnreadableRun
