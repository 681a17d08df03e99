"""The fields of a step task (core/step_task.py) its decoder checks on their own: the names,
the attempt and deadline, the timeouts and the version of the function it runs, each one's type
and bounds, ``ValidationError`` naming what is wrong.
"""

from __future__ import annotations

from typing import Any

from processor.core.envelope import MAX_ATTEMPT, MAX_EPOCH_MS
from processor.core.routing import TIERS
from processor.core.workflow_def import MAX_STEP_VERSION, ValidationError


def check_fields(
    run_id: Any, node: Any, step_type: Any, tier: Any, attempt: Any, deadline_ms: Any, offset: int
) -> None:
    """The names strings that can be stored, the attempt and the deadline (moved by
    ``offset`` into the reader's clock; checked as written) integers in range."""
    if not all(isinstance(v, str) for v in (run_id, node, step_type, tier)):
        raise ValidationError("step task: run_id, node, step_type and tier must be strings")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (attempt, deadline_ms)):
        raise ValidationError("step task: attempt and deadline_ms must be integers")
    # Bounded as wakeups are: every value here goes into a row or a topic name.
    if any("\x00" in v for v in (run_id, node, step_type)):
        raise ValidationError("step task: a NUL character, which Postgres cannot store")
    if tier not in TIERS:
        raise ValidationError(f"step task: tier must be one of {', '.join(TIERS)}")
    written_deadline_ms = deadline_ms + offset
    if not (1 <= attempt <= MAX_ATTEMPT and 0 <= written_deadline_ms <= MAX_EPOCH_MS):
        raise ValidationError("step task: attempt or deadline_ms out of range")


def check_timeouts(beat: Any, timeout_ms: Any, start_by: Any, close_by: Any) -> None:
    if beat is not None and (type(beat) is not int or not 1 <= beat <= MAX_EPOCH_MS):
        raise ValidationError("step task: heartbeat_timeout_ms must be a positive integer")
    if timeout_ms is not None and (
        type(timeout_ms) is not int or not 1 <= timeout_ms <= MAX_EPOCH_MS
    ):
        raise ValidationError("step task: timeout_ms must be a positive integer")
    for bound in (start_by, close_by):
        if bound is not None and (type(bound) is not int or not 0 <= bound <= MAX_EPOCH_MS):
            raise ValidationError("step task: start_by_ms and close_by_ms must be epoch ms")


def task_step_version(raw: Any, versioned: bool) -> int:
    """The version of the function a task runs: 1 unless a version 3 task (``versioned``)
    says, 2 or more."""
    if not versioned:
        if raw is not None:
            raise ValidationError("step task: step_version comes only with task_version 3")
        return 1
    if type(raw) is not int or not 2 <= raw <= MAX_STEP_VERSION:
        raise ValidationError(
            f"step task: a version 3 task's step_version must be 2 to {MAX_STEP_VERSION}"
        )
    return raw
