"""A run's state: its status and its nodes' (``RunState``, what a committed tick writes), how
it is stored (``node_states``) and read back, and its checksum. The rest of what a tick reads
of a run (its results, signals, the loaded run) is core/model.py's.

Everything here is a frozen value with no I/O; serialising is canonical (sorted keys), so the
checksum of a state is the same wherever it is computed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, NamedTuple

import orjson

from processor.core.workflow_def import FAILURE_NODE, ON_FAILURE_NODE, WorkflowDef, undo_node


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
    # Ready, but a limit of its step is full (core/limits.py): attempt `attempt` + 1 starts
    # once it is let in; `due_ms` is when to look again should no freed slot wake the run.
    LIMIT_WAIT = "limit_wait"
    SUCCEEDED = "succeeded"
    FAILED = "failed"  # out of attempts
    CANCELLED = "cancelled"  # the run ended before this node finished
    # Never started, and never will: its condition was false, or its dependencies were all
    # skipped (core/skips.py). Ended, like succeeded, for the steps after it; it has no output.
    SKIPPED = "skipped"


_NODE_STATUSES = {s.value: s for s in NodeStatus}
_RUN_STATUSES = {s.value: s for s in RunStatus}

# ---------------------------------------------------------------------------------------------
# Run state


class NodeState(NamedTuple):
    """One node of a run's state. A NamedTuple (immutable, compared and hashed in C, made
    without a field-by-field __init__): every loaded run has one per step."""

    status: NodeStatus = NodeStatus.PENDING
    attempt: int = 0  # the attempt in flight or last finished; 0 = never dispatched
    # DISPATCHED: deadline; RETRY_WAIT: when the next attempt is due; LIMIT_WAIT: when to
    # look at its limit again
    due_ms: int | None = None
    error: str | None = None
    # Attempts made before the run was last resumed by `ductor runs retry` (core/resume.py):
    # attempt numbers go on from there, and the retry policy counts only the attempts after.
    attempts_before: int = 0
    # DISPATCHED, a step with a schedule-to-start bound: when the attempt in flight was
    # dispatched (epoch ms), what its wait in the queue is counted from (core/tick.py, rule 4).
    since_ms: int | None = None
    # A step with a schedule-to-close bound: when its first attempt since the run was last
    # resumed was dispatched, what the whole step is counted from; kept through its retries.
    first_ms: int | None = None
    # SUCCEEDED, a step with a compensation (core/sagas.py): the ``seq`` of the transition
    # that applied its success, what orders its run's saga (the last done, undone first).
    done_seq: int | None = None

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
        if self.since_ms is not None:  # (so are these: only steps with those bounds have them)
            out["since_ms"] = self.since_ms
        if self.first_ms is not None:
            out["first_ms"] = self.first_ms
        if self.done_seq is not None:
            out["done_seq"] = self.done_seq
        return out

    @staticmethod
    def from_json(raw: Mapping[str, Any]) -> NodeState:
        due = raw.get("due_ms")
        since, first = raw.get("since_ms"), raw.get("first_ms")
        done = raw.get("done_seq")
        # A dict lookup, not NodeStatus(...): this runs for every node of every loaded run.
        return node_state(
            _NODE_STATUSES[raw["status"]],
            int(raw["attempt"]),
            None if due is None else int(due),
            raw.get("error"),
            int(raw.get("attempts_before", 0)),
            None if since is None else int(since),
            None if first is None else int(first),
            None if done is None else int(done),
        )


def node_state(
    status: NodeStatus = NodeStatus.PENDING,
    attempt: int = 0,
    due_ms: int | None = None,
    error: str | None = None,
    attempts_before: int = 0,
    since_ms: int | None = None,
    first_ms: int | None = None,
    done_seq: int | None = None,
) -> NodeState:
    """``NodeState(...)``, made as ``tuple.__new__`` makes it: a NamedTuple's own constructor
    is Python code, also in the compiled build (there 330 ns against 140), and the tick makes
    several per run."""
    return tuple.__new__(
        NodeState, (status, attempt, due_ms, error, attempts_before, since_ms, first_ms, done_seq)
    )


class MapProgress(NamedTuple):
    """A map step's items as its run's state counts them, once the step started: how many
    its list has, and how many were started (by index). An item started is, until it
    succeeded, a node of the state of its own (``step[i]``, at most ``parallelism`` of them);
    once it succeeded it leaves the state, and the commit records its applied attempt in a
    table of its own (``eec_map_item``): the state's size, and what each commit writes, do
    not grow with the list."""

    items: int
    started: int = 0


@dataclass(frozen=True)
class RunState:
    """What a committed tick writes: the canonical state the checksum covers."""

    status: RunStatus
    nodes: tuple[tuple[str, NodeState], ...]  # in definition order; a tuple keeps it hashable
    seq: int = 0
    reason: str | None = None
    # Each map step that started, with its progress (in definition order); written into its
    # node's entry of ``node_states`` (``items``, ``started``).
    maps: tuple[tuple[str, MapProgress], ...] = ()
    # The versions of its steps' functions it runs other than 1, (step, version) in
    # definition order (core/versions.py); written into its steps' entries (``version``).
    versions: tuple[tuple[str, int], ...] = ()

    # Written out (as below for StepResult and LoadedRun): the compiled build compiles it,
    # where the dataclass decorator's own is interpreted Python, ~20 x dearer; one of each is
    # built per loaded run. tests/unit/test_dataclass_inits.py holds each to its fields.
    def __init__(
        self,
        status: RunStatus,
        nodes: tuple[tuple[str, NodeState], ...],
        seq: int = 0,
        reason: str | None = None,
        maps: tuple[tuple[str, MapProgress], ...] = (),
        versions: tuple[tuple[str, int], ...] = (),
    ) -> None:
        object.__setattr__(self, "status", status)
        object.__setattr__(self, "nodes", nodes)
        object.__setattr__(self, "seq", seq)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "maps", maps)
        object.__setattr__(self, "versions", versions)

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
        out = {n: s.to_json() for n, s in self.nodes}
        for name, progress in self.maps:
            out[name] |= {"items": progress.items, "started": progress.started}
        for name, version in self.versions:
            out[name]["version"] = version
        return out

    def next_due_ms(self) -> int | None:
        """The earliest deadline or retry time: when the run must be woken even if nothing comes."""
        if self.status.terminal:
            return None
        dues = [s.due_ms for _, s in self.nodes if s.due_ms is not None]
        return min(dues) if dues else None


def initial_state(wf: WorkflowDef) -> RunState:
    return RunState(status=RunStatus.PENDING, nodes=tuple((s.name, node_state()) for s in wf.steps))


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
    """Rebuild a state from its row, in the definition's node order (a map step's items in
    the state right after it, by index)."""
    nodes = []
    maps = []
    versions = []
    items = items_in(node_states) if wf.has_maps else {}
    for step in wf.steps:
        raw = node_states.get(step.name)
        nodes.append((step.name, node_state() if raw is None else NodeState.from_json(raw)))
        if raw is not None and "version" in raw:
            versions.append((step.name, int(raw["version"])))
        if step.maps:
            window = items.get(step.name, [])
            nodes += [(name, NodeState.from_json(node_states[name])) for _, name in window]
            if raw is not None and "items" in raw:
                maps.append((step.name, MapProgress(int(raw["items"]), int(raw["started"]))))
            elif window:
                # Written before items left the state: every item is a node, started or not
                # (one never started is pending in the state, and started as it comes).
                maps.append((step.name, MapProgress(len(window), len(window))))
    if wf.compensates:  # a saga's nodes, in the order it runs them (core/sagas.py)
        saga = [FAILURE_NODE, ON_FAILURE_NODE] if wf.on_failure is not None else []
        saga += [undo_node(s) for s in undo_order(wf, dict(nodes))]
        nodes += [(n, NodeState.from_json(node_states[n])) for n in saga if n in node_states]
    # A dict lookup, not RunStatus(...) (the enum's call runs Python code): once per loaded run.
    return RunState(_RUN_STATUSES[status], tuple(nodes), seq, reason, tuple(maps), tuple(versions))


def undo_order(wf: WorkflowDef, nodes: Mapping[str, NodeState]) -> list[str]:
    """The steps a saga undoes (core/sagas.py), in the order it undoes them: each step with a
    compensation that succeeded, the last done first (by ``done_seq``; those done in the same
    transition, the later in the definition first)."""
    done = [
        (node.done_seq or 0, index, step.name)
        for index, step in enumerate(wf.steps)
        if step.compensate is not None and (node := nodes[step.name]).status is NodeStatus.SUCCEEDED
    ]
    return [name for _, _, name in sorted(done, reverse=True)]


def shown_nodes(
    state: RunState, recorded: Mapping[tuple[str, int], int]
) -> tuple[tuple[str, NodeState], ...]:
    """Every node of a run as `ductor inspect` shows it: the state's, each started map step
    followed by all its items by index: those in the state, those that succeeded and left it
    (``recorded``: (step, index) -> the attempt that succeeded, as the commits recorded
    them), and those not started yet (pending)."""
    if not state.maps:
        return state.nodes
    nodes = state.node_map()
    progress = dict(state.maps)
    items = {name for step in progress for _, name in items_in(nodes).get(step, ())}
    shown: list[tuple[str, NodeState]] = []
    for name, node in state.nodes:
        if name in items:
            continue  # shown with its map
        shown.append((name, node))
        if name in progress:
            for index in range(progress[name].items):
                item = f"{name}[{index}]"
                attempt = recorded.get((name, index))
                if item in nodes:
                    shown.append((item, nodes[item]))
                elif attempt is not None:
                    shown.append((item, node_state(NodeStatus.SUCCEEDED, attempt)))
                else:
                    shown.append((item, node_state()))
    return tuple(shown)


def items_in(nodes: Iterable[str]) -> dict[str, list[tuple[int, str]]]:
    """The map items among node names (``step[i]``), by step: (index, name), by index."""
    found: dict[str, list[tuple[int, str]]] = {}
    for name in nodes:
        if name.endswith("]"):
            cut = name.rindex("[")
            found.setdefault(name[:cut], []).append((int(name[cut + 1 : -1]), name))
    for window in found.values():
        window.sort()
    return found
