"""What the pure core knows of a run as loaded: its step results, signals, what the workers
recorded of its attempts, its parent, and the run itself (``LoadedRun``, everything its tick
may read), or why it cannot be ticked. Its state is core/run_state.py's;
workflow definitions are core/workflow.py's.

Everything here is a frozen value with no I/O.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from enum import StrEnum
from typing import Any, NamedTuple

from processor.core.deadlines import RunDeadline
from processor.core.run_state import (
    RunState,
    state_checksum,
)
from processor.core.selectors import Selected
from processor.core.shapes import WorkflowKey
from processor.core.versions import ServedVersions
from processor.core.workflow_def import WorkflowDef

__all__ = [
    "Loaded",
    "LoadedRun",
    "ParentLink",
    "RunInput",
    "SignalKind",
    "Started",
    "Starts",
    "StepOutcome",
    "StepResult",
    "UnknownWorkflow",
    "UnreadableRun",
]


class StepOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"


@dataclass(frozen=True, order=True)
class StepResult:
    node: str
    attempt: int
    outcome: StepOutcome
    error: str | None = None
    # False: the step declared the failure final (NonRetryable); the node fails at once.
    retryable: bool = True
    # The length of a succeeded output that is a list (None otherwise): the items of a map
    # step that maps over it.
    length: int | None = None

    def __init__(
        self,
        node: str,
        attempt: int,
        outcome: StepOutcome,
        error: str | None = None,
        retryable: bool = True,
        length: int | None = None,
    ) -> None:
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "error", error)
        object.__setattr__(self, "retryable", retryable)
        object.__setattr__(self, "length", length)


class Started(NamedTuple):
    """What the workers recorded of the execution of a node's attempt in flight
    (``eec_step_attempt``), as the tick judges its timeouts by (core/tick.py, rule 4): when it
    started (the worker's claim, or its start when that came later; epoch ms, Postgres's
    clock), the last heartbeat recorded (None: none), and whether its worker records
    heartbeats at all (one from before they were recorded does not: its heartbeat timeout is
    then the worker's alone)."""

    attempt: int
    started_ms: int
    beat_ms: int | None = None
    beats_recorded: bool = True


# The starts a load found for a run's nodes whose deadline had passed: (node, what was
# recorded), for those a worker started. None: not loaded (no deadline had passed).
Starts = tuple[tuple[str, Started], ...]


class ParentLink(NamedTuple):
    """A child run's parent (core/children.py): the run, and the step and attempt whose
    result the child's end is."""

    run_id: str
    node: str
    attempt: int


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
    # A pending run's start time (epoch ms) when it was started for later (a delayed start, a
    # schedule's fire): it does not start before it (core/tick.py, rule 2). None: at once.
    not_before_ms: int | None = None
    # The run's named signals (what wait steps wait for), (name, signal id) in the order
    # they were received.
    named: tuple[tuple[str, str], ...] = ()
    # Set on a child run (a workflow step's): whose end it is; its own end wakes that run.
    parent: ParentLink | None = None
    # The length of the run's input when it is a list (the items of a map step over it).
    input_length: int | None = None
    # What the workers recorded of the executions of its dispatched nodes whose deadline had
    # passed when it was loaded (core/tick.py, rule 4); None: none had passed (not loaded).
    starts: Starts | None = None
    # What the selectors of its steps not yet started found (a sleep's ``until``, a
    # condition's), (selector's text, value); one absent: its source output is not recorded
    # or it was not read; None: none was read (io/postgres/selected.py).
    selected: tuple[tuple[str, Selected], ...] | None = None
    # When a live run must have ended (core/deadlines.py); None: it has no deadline.
    deadline: RunDeadline | None = None
    # Whether the loader found the stored checksum right for the row as stored (row_checksum);
    # when not given, it is checked against the state here.
    verified: InitVar[bool | None] = None
    # A pending run's: the newest version of each step type the live workers serve, what its
    # start pins (core/versions.py); None: not read (a running run's pins are its own).
    served: ServedVersions | None = None
    # False when the row was changed out of band: its checksum does not match its state.
    # Computed once here (it hashes the state), not at every use.
    checksum_ok: bool = field(init=False)

    def __init__(
        self,
        run_id: str,
        wf: WorkflowDef,
        state: RunState,
        version: int,
        tier: str,
        results: tuple[StepResult, ...] = (),
        signals: frozenset[SignalKind] = frozenset(),
        stored_checksum: str = "",
        input: RunInput | None = None,
        not_before_ms: int | None = None,
        named: tuple[tuple[str, str], ...] = (),
        parent: ParentLink | None = None,
        input_length: int | None = None,
        starts: Starts | None = None,
        selected: tuple[tuple[str, Selected], ...] | None = None,
        deadline: RunDeadline | None = None,
        verified: bool | None = None,
        served: ServedVersions | None = None,
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "wf", wf)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "version", version)
        object.__setattr__(self, "tier", tier)
        object.__setattr__(self, "results", results)
        object.__setattr__(self, "signals", signals)
        object.__setattr__(self, "stored_checksum", stored_checksum)
        object.__setattr__(self, "input", input)
        object.__setattr__(self, "not_before_ms", not_before_ms)
        object.__setattr__(self, "named", named)
        object.__setattr__(self, "parent", parent)
        object.__setattr__(self, "input_length", input_length)
        object.__setattr__(self, "starts", starts)
        object.__setattr__(self, "selected", selected)
        object.__setattr__(self, "deadline", deadline)
        object.__setattr__(self, "served", served)
        if verified is None:
            verified = stored_checksum == state_checksum(state)
        object.__setattr__(self, "checksum_ok", verified)

    @property
    def workflow(self) -> WorkflowKey:
        return self.wf.key

    def with_selected(self, selected: tuple[tuple[str, Selected], ...]) -> LoadedRun:
        """This run, with what its steps' selectors found (a second read of the load)."""
        return self._with(selected, self.served)

    def with_served(self, served: ServedVersions) -> LoadedRun:
        """This run, with the versions live workers serve (a pending run's start pins them)."""
        return self._with(self.selected, served)

    def _with(
        self, selected: tuple[tuple[str, Selected], ...] | None, served: ServedVersions | None
    ) -> LoadedRun:
        """This run with the load's later reads: the checksum's verdict is carried over, not
        computed again (it hashes the state)."""
        return LoadedRun(
            self.run_id,
            self.wf,
            self.state,
            self.version,
            self.tier,
            self.results,
            self.signals,
            self.stored_checksum,
            self.input,
            self.not_before_ms,
            self.named,
            self.parent,
            self.input_length,
            self.starts,
            selected,
            self.deadline,
            self.checksum_ok,
            served,
        )


class RunInput(NamedTuple):
    """A run's input as loaded (a wrapper: the input itself may be JSON null)."""

    value: Any


class UnknownWorkflow(LookupError):
    """A run row names a workflow version that is not registered. ``version``: the row's
    ``db_record_version`` when it was loaded (None when no row was read)."""

    def __init__(self, message: str, version: int | None = None) -> None:
        super().__init__(message)
        self.version = version


class UnreadableRun(ValueError):
    """A run row whose state does not parse (changed out of band); ``version`` as above."""

    def __init__(self, message: str, version: int | None = None) -> None:
        super().__init__(message)
        self.version = version


# What loading one run id can give: the run, or why it cannot be ticked (absent: no such run).
Loaded = LoadedRun | UnknownWorkflow | UnreadableRun
