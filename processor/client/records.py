"""What the client's operations return: frozen records, one per operation."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StartedRun:
    run_id: str
    created: bool  # False: a run with this id existed already (starting is idempotent)


@dataclass(frozen=True)
class SignalSent:
    signal_id: str
    new: bool  # False: a signal with this id was already recorded (and is not sent twice)


@dataclass(frozen=True)
class RetriedRun:
    run_id: str
    steps: tuple[str, ...]  # the steps that run again (all but the succeeded ones)
    seq: int  # the run's transition seq after the resume


@dataclass(frozen=True)
class BulkAction:
    """What a bulk cancel or retry found and did: the runs the filter matched among those the
    action applies to, the ones acted on (none in a dry run), and those refused with why."""

    matched: tuple[str, ...]
    acted: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = ()
