"""What the worker's loop and its helpers say to each other, one type per message.

The loop thread owns every task's state; the database lanes (database.py) and the step slots
(runners.py) run on threads of their own. The loop hands the lanes *requests* (claim these,
record those), and the lanes and the slots hand back *answers* through one queue, which the
loop drains each turn (flow.py). Both directions are typed values, so a unit test builds a
collaborator, collects what it asks for in a list and feeds it scripted answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

from processor.core.claims import ClaimVerdict
from processor.core.step_task import StepData
from processor.io.postgres.step_attempts import Report
from processor.io.postgres.step_data import MissingData
from processor.worker.steps import AttemptResult
from processor.worker.tasks import Task

# -- the requests, for the database lanes -------------------------------------------------------


class ToRecord(NamedTuple):
    """A result to record: the task, its outcome, whether the execution that gave it ended
    with it (False: it was given up while it still runs, or none ran), the details of its
    last heartbeat not recorded yet (JSON text), and the tags its step set on its run (a
    success's only: written with the result, in its statement)."""

    task: Task
    outcome: AttemptResult
    ended: bool = False
    details: str | None = None
    tags: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ClaimTasks:
    """Claim ``tasks`` (each numbered), raising the start permit to ``permit`` with them (0:
    the permit stays)."""

    tasks: list[Task]
    permit: int = 0


@dataclass(frozen=True)
class StorePermit:
    """Store the start permit (io/postgres/step_attempts.py): with the next claim, or alone."""

    through: int


@dataclass(frozen=True)
class ClaimReruns:
    """Claim attempts a worker that died had started, as reruns (core/claims.py)."""

    tasks: list[Task]


@dataclass(frozen=True)
class Unclaim:
    """Give back claims whose step never started (io/postgres/step_attempts.py)."""

    tasks: list[Task]


@dataclass(frozen=True)
class CheckCurrent:
    """Ask whether the attempts of long-running tasks still matter (answered: NotCurrent)."""

    tasks: list[Task]


@dataclass(frozen=True)
class ReportExecutions:
    """What the worker reports of its executions: late starts, heartbeats (with their
    details), ends (io/postgres/step_attempts.py)."""

    reports: list[Report]


@dataclass(frozen=True)
class RecordResults:
    """Record results (the results lane, committed durably)."""

    results: list[ToRecord]


# The claims lane's requests; RecordResults goes to the results lane.
ClaimsRequest = ClaimTasks | StorePermit | ClaimReruns | Unclaim | CheckCurrent | ReportExecutions
Request = ClaimsRequest | RecordResults


# -- the answers, read by the loop --------------------------------------------------------------


class TaskClaim(NamedTuple):
    """One task's claim: its verdict, which execution of its attempt it begins, its data (or
    why it has none) and the details of the last heartbeat an earlier execution recorded."""

    task: Task
    verdict: ClaimVerdict
    starts: int
    data: StepData | MissingData | None
    details: Any = None


@dataclass(frozen=True)
class Claimed:
    """Each task's verdict, in the order they were claimed."""

    tasks: list[TaskClaim]


@dataclass(frozen=True)
class Recorded:
    """Whether each result was recorded (False: its run is gone, or it cannot be stored)."""

    tasks: list[tuple[Task, bool]]


@dataclass(frozen=True)
class NotCurrent:
    """Running tasks whose attempt no longer matters (cancelled run, timed-out attempt)."""

    tasks: list[Task]


@dataclass(frozen=True)
class Permitted:
    """The worker's claims numbered up to ``through`` may start: the permit is stored."""

    through: int


class Ended(NamedTuple):
    """A step function ended (posted by its slot); no outcome: it did not start, its deadline
    passed while it waited."""

    task: Task
    outcome: AttemptResult | None
    started_ns: int
    ended_ns: int


class Over(NamedTuple):
    """The execution of an abandoned task is over (posted by its runner): its function
    returned at last, its child process was killed, or it never started."""

    task: Task


Answer = Claimed | Recorded | NotCurrent | Permitted
# Everything the loop's queue carries: the lanes' answers and the slots'.
News = Answer | Ended | Over
