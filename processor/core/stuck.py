"""What the watchdog does with a run its stuck sweep found (no transition for longer than
``DUCTOR_STUCK_AFTER_S``, no deadline or retry time ahead): fail it only if nothing can move it.

A run can sit without a transition for reasons that are not its own: its step ended while no
processor could read the result's wakeup (every processor down, or a backlog longer than the
threshold), or its start wakeup was lost. Failing it then would throw away a recorded result.
So the run is ticked first, with everything recorded for it, at the sweep's time:

- it moved since the sweep selected it (its seq is another): not stuck, left alone;
- the tick would change it (a recorded result applies, a deadline passed, a pending run starts):
  it is woken on its own tier, and the processor that owns it ticks it as usual;
- the tick changes nothing: nothing recorded, no deadline, nothing can move it. Stuck: it is
  force-failed through the terminal path (``force_fail``), conditioned on its loaded row.

Pure: the shell loads the run and writes the outcome.
"""

from __future__ import annotations

from typing import NamedTuple

from processor.core.model import Loaded, LoadedRun, RunState
from processor.core.outcomes import ForceFailReason
from processor.core.tick import force_fail, tick_run


class Leave(NamedTuple):
    """Not stuck (it moved, ended or cannot be read): nothing to do."""


class Wake(NamedTuple):
    """A tick would move it: wake it on its tier."""

    tier: str


class Fail(NamedTuple):
    """Nothing can move it: write ``state`` if the row still has ``loaded_checksum``
    (``workflow``: what the run counts as once it ended, core/run_tally.py)."""

    loaded_checksum: str
    state: RunState
    workflow: str


StuckVerdict = Leave | Wake | Fail


def judge_stuck(run: Loaded | None, selected_seq: int, now_ms: int) -> StuckVerdict:
    if not isinstance(run, LoadedRun) or not run.checksum_ok or run.state.seq != selected_seq:
        return Leave()  # gone, unreadable (the commit path quarantines it), or it moved
    if tick_run(run, now_ms).progressed:
        return Wake(run.tier)
    failed = force_fail(run.state, ForceFailReason.STUCK)
    if failed is None:  # it ended
        return Leave()
    return Fail(run.stored_checksum, failed, run.wf.name)
