"""Where a signal can land: whether a signal may be recorded for a run, decided by every door
that records one (``ductor signal`` and the client, the requests topic and the triggers, a
kept signal taken by its run's start or adopted by a sweep).

1. ``cancel`` lands on any run that has not ended.
2. Another name lands on a run that has not ended and whose workflow (the version the run was
   started on) has a wait step waiting for that name. A signal of another name would change
   nothing (core/tick.py reads only the names its wait steps wait for): refused as
   ``unknown_signal``, so that a typo (``aproved``) is said at once instead of leaving the
   run waiting for its week.
3. A run that has ended (succeeded, failed, cancelled) takes no signal: ``run_ended``.

The name is judged first: a name no step waits for is wrong whatever the run's state. A signal
recorded while its run is live belongs to the run: should the run end before a tick reads it
(its last step ended at that moment), it ends as it would have a moment earlier, as a signal
sent after a wait step ended changes nothing. A signal already recorded (its id) is answered as
recorded before, whatever the run became: sending it again is a retry, not a new signal.
"""

from __future__ import annotations

from typing import NamedTuple

from processor.core.model import SignalKind
from processor.core.outcomes import DeadLetterReason
from processor.core.run_state import RunStatus
from processor.core.workflow_def import WorkflowDef


class LandingRefusal(NamedTuple):
    """Why a signal cannot land: its dead-letter reason and a sentence."""

    reason: DeadLetterReason
    detail: str


def landing_problem(
    run_id: str, wf: WorkflowDef, status: RunStatus, name: str
) -> LandingRefusal | None:
    """Why signal ``name`` cannot be recorded for run ``run_id`` of ``wf`` in ``status``;
    None when it can."""
    if name != SignalKind.CANCEL.value and name not in wf.signals:
        return LandingRefusal(DeadLetterReason.UNKNOWN_SIGNAL, unknown_signal_detail(wf, name))
    if status.terminal:
        return LandingRefusal(
            DeadLetterReason.RUN_ENDED,
            f"run {run_id!r} has ended ({status.value}): a signal can change it no more",
        )
    return None


def unknown_signal_detail(wf: WorkflowDef, name: str) -> str:
    waited = sorted(wf.signals)
    if waited:
        expected = "it waits for " + ", ".join(repr(n) for n in waited) + " (or 'cancel')"
    else:
        expected = "it has no wait step: only 'cancel' can be sent to its runs"
    return (
        f"no step of workflow {wf.name!r} version {wf.version} waits for a signal named"
        f" {name!r}; {expected}"
    )
