"""The client's failures: ``ClientError`` (a RuntimeError) and one subclass for each
refusal a caller may tell apart, each with a one-sentence message."""

from __future__ import annotations

from processor.core.outcomes import DeadLetterReason
from processor.io.postgres.runs_admin import ExistingRun, RunResult


class ClientError(RuntimeError):
    """An operation that could not be done; the message says why, in one sentence."""


class RunNotFound(ClientError, LookupError):
    """There is no run with this id."""


class RunNotFinished(ClientError):
    """The run had not ended when the wait was over; ``result`` is where it stood then."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


class StartNotAnnounced(ClientError):
    """The runs were created, but the broker did not take their start wakeups: they start
    anyway, once a processor's overdue sweep finds them (``DUCTOR_SWEEP_GRACE_S`` after their
    creation, plus a sweep interval). ``inserted``: the ids created by this call."""

    def __init__(self, message: str, inserted: list[str]) -> None:
        super().__init__(message)
        self.inserted = inserted


class InvalidArgument(ClientError, ValueError):
    """A call refused for what it asks before anything was written: a name or an id of the
    wrong length, a tier, a policy or a signal name that does not exist, tags of the wrong
    shape, a limit out of range (the HTTP API answers it 400)."""


class InvalidInput(ClientError, ValueError):
    """A start refused because its input does not match the workflow's input schema; the
    message says where it is wrong. Nothing was written."""


class OutOfBounds(ClientError, ValueError):
    """A value refused before anything was written because Ductor cannot store it: a run's
    input or a signal's payload beyond the bounds of stored JSON (nested deeper than 64 levels,
    larger than 1 MiB, a NUL character, a lone surrogate, an integer beyond 64 bits, something
    that is not JSON), or an id that holds a NUL or a lone surrogate (docs/requests.md#bounds).
    The message names the path: ``the input at $.a[0]... is nested deeper than 64 levels``."""


class ReservedRunId(ClientError, ValueError):
    """A start refused because its run id has the shape of an id only Ductor derives (a
    schedule's run ``NAME@TIME``, a child run ``PARENT/STEP#N``: docs/requests.md#reserved-run-ids).
    Nothing was written."""


class SignalRefused(ClientError, ValueError):
    """A signal refused before anything was written because it cannot land
    (core/landing.py): ``reason`` is ``run_ended`` (the run has ended: a signal can change it
    no more) or ``unknown_signal`` (no wait step of the run's workflow waits for that name: a
    typo), the dead-letter reason the same signal gets on the requests topic."""

    def __init__(self, message: str, reason: DeadLetterReason) -> None:
        super().__init__(message)
        self.reason = reason


class RunExists(ClientError):
    """A start refused because its run id exists already: under another workflow, with
    another input (no policy), or at all (``IfExists.FAIL``). ``existing``: each run refused;
    ``inserted``: the ids of the same call that were created (and woken) all the same."""

    def __init__(self, message: str, existing: list[ExistingRun], inserted: list[str]) -> None:
        super().__init__(message)
        self.existing = existing
        self.inserted = inserted

    @property
    def run_id(self) -> str:
        return self.existing[0].run_id


class RetryRefused(ClientError):
    """The run cannot be retried: it is not failed, or its row cannot be used."""


class UpgradeRefused(ClientError):
    """The run's versions cannot be moved: it is not running or failed, or its row cannot be
    used, or it kept changing."""
