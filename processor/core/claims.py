"""Whether a worker may run a step task it was handed: the claim's verdict.

Before a step function runs, the worker claims its attempt in Postgres
(io/postgres/step_attempts.py): one row per attempt, written before the function starts, counting
the executions begun. The claim statement takes the attempt only when running it is right; for every
task it did not
take, what it read says why, and this module turns that into a verdict. The rules, in order:

1. Claimed: run it. ``starts`` says which execution this is: more than 1 means an earlier one
   began on a worker that died. An attempt this very worker started, and that has no result,
   is its own claim too (the answer to an earlier claim was lost with its connection, and the
   claim was asked again): a worker never holds two deliveries of one attempt at once.
2. The run no longer exists (deleted by ``ductor gc``): nothing to run.
3. The attempt is no longer the node's dispatched one (it timed out, the run was cancelled or
   ended, a later attempt is in flight): stale, skipped. Unless the run is live and its row
   has never dispatched an attempt this far (the node's attempt is lower): the row lost the
   commit that dispatched it (a database crash with ``synchronous_commit`` off, a failover to
   a standby that had not received it) after its task was sent. Nothing else would wake the
   run before its surviving row's next deadline, so the task is skipped and its run woken: the
   processor ticks again from the row it has, and dispatches the attempt anew.
4. Its result is recorded (an earlier delivery ran it): not run again. If the worker that ran
   it is gone, the wakeup it owed may have been lost with it, so it is sent again.
5. A worker that is gone started it:
   - as often as an attempt may start (its step killed its process each time, say): the
     attempt fails, saying the worker died running it, instead of another crash; the retry
     policy decides what comes next;
   - less often: it is a *rerun*, taken only by a claim of its own (``reruns``) and run in a
     child process of its own (worker/flow.py), so that a step that kills its process again
     takes only that child down: its attempt fails, and no other task nor the worker goes
     with it. (The dead worker's claims ahead of its free slots come back as reruns too: a
     claim is the start mark; they run beside the other tasks, each in its child.)
6. Otherwise someone else holds it: a live worker runs it (the task was redelivered after a
   rebalance), or a claim raced this one, or this worker may not yet judge who is gone (it
   just came back from an outage of its own). The task waits and is claimed again a moment
   later; it never runs twice at once.

Pure: the database gave the facts, this gives the verdict.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class ClaimVerdict(StrEnum):
    RUN = "run"
    RUN_GONE = "run_gone"  # skipped: the run no longer exists
    SUPERSEDED = "superseded"  # skipped: not the node's dispatched attempt any more
    AHEAD = "ahead"  # skipped, its run woken: its row lost the commit that dispatched it
    RECORDED = "recorded"  # skipped: its result is recorded already
    RESEND = "resend"  # skipped, its wakeup sent again: recorded by a worker that is gone
    DIED = "died"  # not run: its worker died running it as often as allowed; the attempt fails
    RERUN = "rerun"  # started by a worker that died: claimed again as a rerun, run in a child
    HELD = "held"  # not yet: someone else holds it; claimed again shortly


# The verdicts that end the task without running it (and without a result of its own).
SKIPPED = frozenset(
    {
        ClaimVerdict.RUN_GONE,
        ClaimVerdict.SUPERSEDED,
        ClaimVerdict.AHEAD,
        ClaimVerdict.RECORDED,
        ClaimVerdict.RESEND,
    }
)


class ClaimFacts(NamedTuple):
    """What the claim statement read and did for one task."""

    run_exists: bool
    current: bool  # the run is live and the node's dispatched attempt is this one
    ahead: bool  # the run is live and its node's attempt is lower: the row never dispatched it
    recorded: bool  # a result of this attempt is recorded
    starts: int | None  # executions begun before this claim (None: never started)
    starter_alive: bool  # the worker that last started it is alive (false when none did)
    mine: bool  # this worker started it
    claimed_starts: int | None  # this claim took it: the execution it begins (None: not taken)


def verdict(facts: ClaimFacts, max_starts: int, may_judge: bool) -> ClaimVerdict:
    """The verdict for one task (see the module's rules). ``max_starts``: how many
    executions an attempt may begin in all; ``may_judge``: whether this worker may take a
    silent worker for gone (it has had no outage of its own lately)."""
    if facts.claimed_starts is not None:
        return ClaimVerdict.RUN
    if not facts.run_exists:
        return ClaimVerdict.RUN_GONE
    if not facts.current:
        return ClaimVerdict.AHEAD if facts.ahead else ClaimVerdict.SUPERSEDED
    if facts.mine and not facts.recorded:
        return ClaimVerdict.RUN
    if facts.recorded:
        if facts.starter_alive or not may_judge:
            return ClaimVerdict.RECORDED
        return ClaimVerdict.RESEND
    if facts.starts is not None and not facts.starter_alive and may_judge:
        return ClaimVerdict.DIED if facts.starts >= max_starts else ClaimVerdict.RERUN
    return ClaimVerdict.HELD


def died_reason(starts: int) -> str:
    """The error of an attempt whose worker died running it every time it started."""
    times = "once" if starts == 1 else f"{starts} times"
    return (
        f"the worker running this step died ({times}, the step's own process included):"
        " not started again; see the worker's crash-reruns setting"
    )
