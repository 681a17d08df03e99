"""What becomes of each request from ``ductor.requests`` (core/requests.py) once the database
has answered it: the answers the request statement gives (io/postgres/request_store.py), and the
plan each answer makes, carried out by the one executor like any other.

A start that created its run, or found the same start done before (a duplicate, or a
redelivery after a crash), sends the run's start wakeup: the run's first tick is a wakeup like
any other, and a wakeup for a run already started is a no-op tick. A signal recorded for a run
wakes it. A signal for a run that does not exist yet is kept (it may race its start) and the
record is done; the start that creates the run takes it. What cannot be honoured is a dead
letter with the record's original bytes.
"""

from __future__ import annotations

from typing import NamedTuple

from processor.core.decide import reject
from processor.core.envelope import Wakeup
from processor.core.outcomes import DeadLetterReason, Outcome
from processor.core.plans import Plan, Produce, Rules, Send
from processor.core.records import Inbound


class Created(NamedTuple):
    """The start created its run, on wakeup tier ``tier``."""

    tier: str


class StartedBefore(NamedTuple):
    """The same start (workflow and input) made the run before: it is woken again."""

    tier: str


class Refused(NamedTuple):
    """The request cannot be honoured: a conflicting start, an unknown workflow."""

    reason: DeadLetterReason
    detail: str


class Signalled(NamedTuple):
    """The signal is recorded for its run (``new``: by this request, not before)."""

    tier: str
    new: bool


class Kept(NamedTuple):
    """No run has the signal's run id yet: the signal is kept for its start (``new``: by this
    request, not before)."""

    new: bool


RequestAnswer = Created | StartedBefore | Refused | Signalled | Kept


def request_plan(
    record: Inbound, run_id: str, answer: RequestAnswer, now_ms: int, rules: Rules
) -> Plan:
    """The plan for a request record the database answered."""
    if isinstance(answer, Refused):
        return reject(record, answer.reason, answer.detail, rules)
    if isinstance(answer, Kept):
        return Plan(run_id, Outcome.ACCEPTED if answer.new else Outcome.DUPLICATE)
    written = isinstance(answer, Created) or (isinstance(answer, Signalled) and answer.new)
    reason = "signal" if isinstance(answer, Signalled) else "start"
    wakeup = Wakeup(run_id=run_id, reason=reason, produced_at=now_ms)
    send = Send(
        rules.names.wakeup(answer.tier),
        wakeup.key(),
        wakeup.encode(),
        by_run=run_id,
        attributes=(("ductor.request", reason),),
    )
    return Plan(run_id, Outcome.ACCEPTED if written else Outcome.DUPLICATE, Produce((send,)))


__all__ = [
    "Created",
    "Kept",
    "Refused",
    "RequestAnswer",
    "Signalled",
    "StartedBefore",
    "request_plan",
]
