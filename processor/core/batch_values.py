"""What the batch protocol (core/batch.py) and its driver (engine/stage.py) say to each other:
the requests it yields, the answer a failed request gets, and the outcome it returns.

Each request names one thing the database stage does today, with what it needs; the driver
answers it with the value its statement returned (written beside each request), or with
``Failed`` when the statement raised. Only the driver can tell what an error means (the one
classifier, io/postgres/db_errors.py): it says so in ``Failed.failure``, so the protocol decides
what to do without knowing any database library.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple

from processor.core.model import Loaded
from processor.core.plans import Commit, ForceFailWrite, Plan
from processor.core.run_tally import RunTally
from processor.core.shapes import OutboxKey, RunRef

Acknowledged = tuple[OutboxKey, ...]  # outbox rows to delete
RunTiers = tuple[RunRef, ...]  # runs to wake
# The compiled build looks a dataclass field's bare type name up in this module's globals, where
# a builtin is not (``error: Exception`` raised KeyError at import): fields name this alias.
Error = Exception


class Failure(Enum):
    """What a failed request's error means for the batch."""

    LOST = "lost"  # the connection failed under it: a write's outcome is unknown
    DATABASE = "database"  # the database's (down, a timeout, a deadlock): the batch's own
    ROW = "row"  # refused for what a row holds: one run's, found by halving the batch
    UNFORESEEN = "unforeseen"  # no database error at all (a bug, an encoding): one run's too


# The failures one run of the batch makes: another run would not meet them.
ITEM_FAILURES = frozenset({Failure.ROW, Failure.UNFORESEEN})


@dataclass(frozen=True, slots=True)
class Failed:
    """The answer to a request whose statement (or fault point) raised ``error``."""

    error: Error
    failure: Failure


# -- the requests, each with the answer it expects ------------------------------------------


@dataclass(frozen=True, slots=True)
class MeetServer:
    """Open the connection if need be and compare its server's start with the last one met
    (engine/recent_commits.py). Answer: the runs to wake again (``RunTiers``)."""


@dataclass(frozen=True, slots=True)
class LoadRuns:
    """Step 1: load the runs. Answer: ``(runs by id, Postgres's time of the load in ms)``."""

    run_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LoadLimits:
    """What the batch's limited dispatches are decided on (the ``tick`` fault point follows
    it). Answer: ``LimitInputs``."""

    run_ids: tuple[str, ...]
    loaded: Mapping[str, Loaded]


@dataclass(frozen=True, slots=True)
class CommitRuns:
    """Step 3: the one conditional UPDATE, deleting the acknowledged outbox rows with it.
    Answer: ``(committed run ids, run ids whose row another transaction held)``."""

    commits: tuple[Commit, ...]
    acknowledged: Acknowledged


@dataclass(frozen=True, slots=True)
class ReadBack:
    """The commit's answer was lost with its connection: read the rows back on a new one.
    Answer: the run ids whose commit landed (a set)."""

    commits: tuple[Commit, ...]


@dataclass(frozen=True, slots=True)
class NoteCommitted:
    """The commit answered: the ``after_commit`` fault point, and the runs remembered for a
    restart of the database (engine/recent_commits.py). Answer: None."""

    committed: frozenset[str]
    runs: RunTiers


@dataclass(frozen=True, slots=True)
class WakeWaiters:
    """The waiters of the limits whose slots the commit freed (a count per limit key).
    Answer: ``RunTiers`` to wake."""

    freed: Counter[str]


@dataclass(frozen=True, slots=True)
class ProbeDecide:
    """The ``decide`` fault point for one run (asked only when it is armed). Answer: None."""

    run_id: str


@dataclass(frozen=True, slots=True)
class WriteForceFail:
    """The terminal write of a livelocked run. Answer: ``ForceFailWritten``."""

    write: ForceFailWrite


@dataclass(frozen=True, slots=True)
class ForceFailWritten:
    """What a force-fail's write came to: whether it was written (the run had not moved
    since it was loaded), and the limit slots it gave back, a count per limit key (their
    oldest waiters are woken, as a commit's freed slots are)."""

    written: bool
    freed: Counter[str]


class QuarantineFlag(NamedTuple):
    """A run to flag, why, and the version its row had when that was found (None: unknown,
    the run made a statement fail)."""

    run_id: str
    why: str
    version: int | None


@dataclass(frozen=True, slots=True)
class FlagQuarantine:
    """Flag runs whose rows cannot be used. Answer: the run ids newly flagged (a set)."""

    flags: tuple[QuarantineFlag, ...]


@dataclass(frozen=True, slots=True)
class DeleteOutbox:
    """Delete acknowledged outbox rows on their own (no commit carries them). Answer: None."""

    acknowledged: Acknowledged


Request = (
    MeetServer
    | LoadRuns
    | LoadLimits
    | CommitRuns
    | ReadBack
    | NoteCommitted
    | WakeWaiters
    | ProbeDecide
    | WriteForceFail
    | FlagQuarantine
    | DeleteOutbox
)


# -- the outcomes ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ReadBackResult:
    """A commit whose answer was lost with its connection, resolved by reading it back."""

    error: Error
    not_landed: frozenset[str]


@dataclass(frozen=True, slots=True)
class Decided:
    """The batch was decided: one plan per run, in the order of its runs.

    ``unacknowledged``: outbox rows whose deletion did not land (a commit lost with its
    connection), to delete with the next stage. ``isolated``: exceptions nobody foresaw, each
    isolated to its run (or to a side request), for the loop to count and log. ``runs``: the
    runs its commits started and ended (only commits that landed count)."""

    plans: tuple[Plan, ...]
    replay: RunTiers  # the database restarted: the runs committed just before, to wake again
    isolated: tuple[tuple[str, Exception], ...]
    runs: RunTally
    unacknowledged: Acknowledged
    commits_sent: int  # commits sent (a lost race counts)
    read_back: ReadBackResult | None
    force_fail_errors: Mapping[str, Exception]  # by run id: its force-fail could not be written
    quarantined: tuple[Plan, ...]  # plans whose run this stage flagged
    quarantine_error: Exception | None  # the flags could not be written (written when met again)
    limit_wakes: RunTiers  # waiters of limits whose slots the commits freed
    limit_waited: tuple[tuple[str, int], ...]  # (limit name, ms) each waiter let in waited
    limit_refused: tuple[str, ...]  # a limit name per dispatch a full limit held back


@dataclass(frozen=True, slots=True)
class Undecided:
    """The database failed the batch (unreachable, a timeout), or something that is no run's
    own did: nothing was decided, and the batch is retried whole. What its statements did
    before (a half of a split batch commits on its own) is reported all the same."""

    error: Error
    replay: RunTiers
    isolated: tuple[tuple[str, Exception], ...]
    runs: RunTally
    unacknowledged: Acknowledged  # every row it was given: their deletion did not happen


BatchOutcome = Decided | Undecided


__all__ = [
    "ITEM_FAILURES",
    "Acknowledged",
    "BatchOutcome",
    "CommitRuns",
    "Decided",
    "DeleteOutbox",
    "Failed",
    "Failure",
    "FlagQuarantine",
    "LoadLimits",
    "LoadRuns",
    "MeetServer",
    "NoteCommitted",
    "ProbeDecide",
    "QuarantineFlag",
    "ReadBack",
    "ReadBackResult",
    "Request",
    "RunTiers",
    "Undecided",
    "WakeWaiters",
    "WriteForceFail",
]
