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
  force-failed through the terminal path (``force_fail_write``), conditioned on its loaded
  row; the same write cancels its children in flight and wakes its parent (a child).

Pure: the shell loads the run and writes the outcome.
"""

from __future__ import annotations

from typing import NamedTuple

from processor.core.decide import force_fail_write
from processor.core.model import Loaded, LoadedRun
from processor.core.outcomes import ForceFailReason
from processor.core.plans import ForceFailWrite
from processor.core.routing import TopicNames
from processor.core.tick import tick_run


class Leave(NamedTuple):
    """Not stuck (it moved, ended or cannot be read): nothing to do."""


class Wake(NamedTuple):
    """A tick would move it: wake it on its tier."""

    tier: str


class Fail(NamedTuple):
    """Nothing can move it: make ``write`` (it applies only if the row still has the loaded
    checksum; ``workflow``: what the run counts as once it ended, core/run_tally.py)."""

    write: ForceFailWrite
    workflow: str


StuckVerdict = Leave | Wake | Fail


def judge_stuck(
    run: Loaded | None, selected_seq: int, now_ms: int, names: TopicNames
) -> StuckVerdict:
    """``names``: the topics of the wakeups a force-fail produces (its children's, its
    parent's)."""
    if not isinstance(run, LoadedRun) or not run.checksum_ok or run.state.seq != selected_seq:
        return Leave()  # gone, unreadable (the commit path quarantines it), or it moved
    if tick_run(run, now_ms).progressed:
        return Wake(run.tier)
    write = force_fail_write(run, ForceFailReason.STUCK, now_ms, names)
    if write is None:  # it ended
        return Leave()
    return Fail(write, run.wf.name)
