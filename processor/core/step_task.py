"""The step task: what the coordinator sends to the workers on the steps topic."""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from processor.core.envelope import MAX_ATTEMPT, MAX_EPOCH_MS
from processor.core.model import ValidationError
from processor.core.routing import TIERS

STEP_TASK_VERSION = 1


@dataclass(frozen=True)
class StepTask:
    run_id: str
    node: str
    attempt: int
    step_type: str
    deadline_ms: int
    tier: str = "t1"  # the run's tier: the worker's wakeup goes back on it

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "task_version": STEP_TASK_VERSION,
                "run_id": self.run_id,
                "node": self.node,
                "attempt": self.attempt,
                "step_type": self.step_type,
                "deadline_ms": self.deadline_ms,
                "tier": self.tier,
            }
        )


def decode_step_task(value: bytes | None) -> StepTask:
    """Parse a step task or raise ValidationError saying what is wrong."""
    if value is None:
        raise ValidationError("step task has no value")
    try:
        raw = orjson.loads(value)
    except orjson.JSONDecodeError as exc:
        raise ValidationError(f"step task is not JSON: {exc}") from None
    version = raw.get("task_version") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or type(version) is not int or version != STEP_TASK_VERSION:
        raise ValidationError(f"step task must be an object with task_version {STEP_TASK_VERSION}")
    try:
        task = StepTask(
            run_id=raw["run_id"],
            node=raw["node"],
            attempt=raw["attempt"],
            step_type=raw["step_type"],
            deadline_ms=raw["deadline_ms"],
            tier=raw.get("tier", "t1"),
        )
    except KeyError as exc:
        raise ValidationError(f"step task is missing {exc.args[0]!r}") from None
    if not all(isinstance(v, str) for v in (task.run_id, task.node, task.step_type, task.tier)):
        raise ValidationError("step task: run_id, node, step_type and tier must be strings")
    if not all(
        isinstance(v, int) and not isinstance(v, bool) for v in (task.attempt, task.deadline_ms)
    ):
        raise ValidationError("step task: attempt and deadline_ms must be integers")
    # Bounded as wakeups are: every value here goes into a row or a topic name.
    if any("\x00" in v for v in (task.run_id, task.node, task.step_type)):
        raise ValidationError("step task: a NUL character, which Postgres cannot store")
    if task.tier not in TIERS:
        raise ValidationError(f"step task: tier must be one of {', '.join(TIERS)}")
    if not (1 <= task.attempt <= MAX_ATTEMPT and 0 <= task.deadline_ms <= MAX_EPOCH_MS):
        raise ValidationError("step task: attempt or deadline_ms out of range")
    return task
