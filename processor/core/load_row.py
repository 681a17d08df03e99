"""A run's row as the batched load returns it (io/postgres/store.py, ``_LOAD_SQL``), read by name,
and the loaded run built from it: what its tick may read, or why it cannot be ticked. Pure: the
shell reads the row and finds the run's definition, this decodes the rest.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from processor.core.deadlines import RunDeadline
from processor.core.model import (
    LoadedRun,
    ParentLink,
    RunInput,
    SignalKind,
    Started,
    Starts,
    StepOutcome,
    StepResult,
    UnreadableRun,
)
from processor.core.run_state import row_checksum, state_from_row
from processor.core.shapes import WorkflowKey
from processor.core.workflow_def import WorkflowDef


class LoadRow(NamedTuple):
    """One run as the load selects it, each field in the order of the statement's
    ``json_build_array`` (io/postgres/store.py), which builds this row and nothing else."""

    run_id: str
    workflow_name: str
    workflow_version: int
    status: str
    # jsonb: an object as the processor writes it, anything when written out of band (the
    # state then does not parse: loaded_run says so).
    node_states: Any
    seq: int  # last_transition_seq
    checksum: str  # state_checksum as stored
    version: int  # db_record_version
    reason: str | None  # failure_reason
    tier: str
    # A live run's step results: [node, attempt, outcome, error, retryable, length of a list
    # output] each; None when it has none (or is not live).
    results: list[list[Any]] | None
    # A live run's signals, [kind, signal id] in the order received; None: none.
    signals: list[list[str]] | None
    # A pending run's input, when small: [input] (the input may be JSON null); None: not loaded.
    input: list[Any] | None
    not_before_ms: int | None  # a pending run's start time (epoch ms)
    parent: list[Any] | None  # [run id, node, attempt] of a child run's parent
    input_length: int | None  # the length of a live run's input that is a list
    # What the workers recorded of its attempts whose due time passed: [node, attempt,
    # started_ms, beat_ms, reports] each; None: not loaded (none had passed).
    starts: list[list[Any]] | None
    # A live run's deadline, [epoch ms, timeout ms] (core/deadlines.py); None: it has none.
    deadline: list[int] | None = None

    @property
    def workflow(self) -> WorkflowKey:
        return (self.workflow_name, self.workflow_version)


_CANCEL = SignalKind.CANCEL.value
_CANCELLED, _NO_SIGNAL = frozenset({SignalKind.CANCEL}), frozenset[SignalKind]()


def loaded_run(row: LoadRow, wf: WorkflowDef) -> LoadedRun | UnreadableRun:
    """The run ``row`` holds, a run of ``wf``; UnreadableRun when its state does not parse
    (only an outside writer can leave such a row: it is reported like a checksum mismatch
    rather than let one row stop the batch)."""
    try:
        state = state_from_row(row.status, row.node_states, row.seq, row.reason, wf)
    except (KeyError, ValueError, TypeError) as unreadable:
        return UnreadableRun(
            f"run {row.run_id!r}: node_states cannot be read: {unreadable!r}", row.version
        )
    results = tuple(
        StepResult(r[0], r[1], StepOutcome(r[2]), r[3], r[4], r[5]) for r in (row.results or ())
    )
    received = row.signals or ()
    signals = _CANCELLED if any(k == _CANCEL for k, _ in received) else _NO_SIGNAL
    named = tuple((k, sid) for k, sid in received if k != _CANCEL)
    return LoadedRun(
        run_id=row.run_id,
        wf=wf,
        state=state,
        version=row.version,
        tier=row.tier,
        results=results,
        signals=signals,
        stored_checksum=row.checksum,
        verified=row.checksum == row_checksum(row.status, row.node_states, row.seq, row.reason),
        input=None if row.input is None else RunInput(row.input[0]),
        not_before_ms=row.not_before_ms,
        named=named,
        parent=None if row.parent is None else ParentLink(*row.parent),
        input_length=row.input_length,
        starts=None if row.starts is None else starts_of(row.starts),
        deadline=None if row.deadline is None else RunDeadline(*row.deadline),
    )


def starts_of(raw: list[list[Any]]) -> Starts:
    """The starts a load read, as the tick takes them."""
    return tuple(
        (node, Started(attempt, at, beat, reports)) for node, attempt, at, beat, reports in raw
    )
