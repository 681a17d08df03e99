"""Where a signal can land (core/landing.py): cancel on any live run, another name only on a
live run whose workflow waits for it, nothing on a run that has ended."""

from __future__ import annotations

import pytest

from processor.core.landing import landing_problem
from processor.core.outcomes import DeadLetterReason
from processor.core.run_state import RunStatus
from processor.core.workflow import parse_workflow

APPROVAL = parse_workflow(
    {
        "name": "orders",
        "version": 3,
        "steps": [
            {"name": "price", "type": "fast"},
            {"name": "approve", "kind": "wait", "signal": "approved", "depends_on": ["price"]},
            {"name": "recheck", "kind": "wait", "signal": "rechecked", "depends_on": ["price"]},
        ],
    }
)
TASKS = parse_workflow({"name": "plain", "version": 1, "steps": [{"name": "a", "type": "fast"}]})
LIVE = [RunStatus.PENDING, RunStatus.RUNNING]
ENDED = [RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED]


@pytest.mark.parametrize("status", LIVE)
def test_cancel_and_the_names_waited_for_land_on_a_live_run(status: RunStatus) -> None:
    for name in ("cancel", "approved", "rechecked"):
        assert landing_problem("o-1", APPROVAL, status, name) is None
    assert landing_problem("p-1", TASKS, status, "cancel") is None


@pytest.mark.parametrize("status", LIVE + ENDED)
def test_a_name_no_step_waits_for_is_refused_naming_those_that_are(status: RunStatus) -> None:
    refusal = landing_problem("o-1", APPROVAL, status, "aproved")
    assert refusal is not None and refusal.reason is DeadLetterReason.UNKNOWN_SIGNAL
    assert refusal.detail == (
        "no step of workflow 'orders' version 3 waits for a signal named 'aproved'; it waits"
        " for 'approved', 'rechecked' (or 'cancel')"
    )
    plain = landing_problem("p-1", TASKS, status, "approved")
    assert plain is not None and plain.reason is DeadLetterReason.UNKNOWN_SIGNAL
    assert plain.detail.endswith("it has no wait step: only 'cancel' can be sent to its runs")


@pytest.mark.parametrize("status", ENDED)
def test_nothing_lands_on_a_run_that_has_ended(status: RunStatus) -> None:
    for name in ("cancel", "approved"):
        refusal = landing_problem("o-1", APPROVAL, status, name)
        assert refusal is not None and refusal.reason is DeadLetterReason.RUN_ENDED
        assert refusal.detail == (
            f"run 'o-1' has ended ({status.value}): a signal can change it no more"
        )


def test_a_workflow_knows_the_names_its_wait_steps_wait_for() -> None:
    assert APPROVAL.signals == frozenset({"approved", "rechecked"})
    assert TASKS.signals == frozenset()
