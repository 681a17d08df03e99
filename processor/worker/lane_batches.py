"""What the worker's database lanes (database.py) make of what they are handed: the claims
lane's batch of requests gathered by kind, a task's key as a statement's parameters, and a
result as the row that stores it."""

from __future__ import annotations

from typing import Any

from processor.core.model import StepOutcome
from processor.io.postgres.step_data import StepResultRow
from processor.worker.messages import (
    CheckCurrent,
    ClaimReruns,
    ClaimTasks,
    ReportExecutions,
    Request,
    StorePermit,
    ToRecord,
    Unclaim,
)
from processor.worker.steps import storable_text
from processor.worker.tasks import Task


def gather_claims(batch: list[Request]) -> tuple[int, dict[str, list[Any]]]:
    """The claims lane's requests by kind (claim, rerun, check, unclaim, report), and the
    highest start permit asked, with a claim or alone."""
    permit = 0
    kinds: dict[str, list[Any]] = {}
    for request in batch:
        if isinstance(request, ClaimTasks):
            kinds.setdefault("claim", []).extend(request.tasks)
            permit = max(permit, request.permit)
        elif isinstance(request, StorePermit):
            permit = max(permit, request.through)
        elif isinstance(request, ClaimReruns):
            kinds.setdefault("rerun", []).extend(request.tasks)
        elif isinstance(request, CheckCurrent):
            kinds.setdefault("check", []).extend(request.tasks)
        elif isinstance(request, Unclaim):
            kinds.setdefault("unclaim", []).extend(request.tasks)
        elif isinstance(request, ReportExecutions):
            kinds.setdefault("report", []).extend(request.reports)
    return permit, kinds


def claim_ids(task: Task) -> dict[str, object]:
    run_id, node, attempt = task.key
    return {"run_id": run_id, "node": node, "attempt": attempt}


def result_row(result: ToRecord) -> StepResultRow:
    outcome = result.outcome
    run_id, node, attempt = result.task.key
    return StepResultRow(
        run_id,
        node,
        attempt,
        outcome.outcome,
        outcome.output,
        None if outcome.error is None else storable_text(outcome.error),
        outcome.retryable,
        result.ended,
        result.details,
        outcome.error_type,
        outcome.traceback,
        dict(result.tags) if result.tags and outcome.outcome is StepOutcome.SUCCEEDED else None,
    )
