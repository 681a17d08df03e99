"""Compensation (a saga) on the real services, every execution of the steps' code counted
(tests/integration/counted_steps.py): a three-step run whose third step fails for good runs
the compensations of its second and first steps, in that order, each once, with what they
undo, and ends failed with its compensation completed; a run cancelled mid-way compensates
only what succeeded and ends cancelled; a compensation that fails for good leaves the run
saying so, and the compensations after it never run; a run past its deadline is
compensated as a failed one is; a failure handler (``on_failure``) is given the failure
before the compensations run; a processor SIGKILLed while sagas run
is replaced and every saga finishes, nothing executed twice for one attempt.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor import client
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from . import counted_steps
from .audit import assert_transitions_applied_once
from .children import Spawned, run_ductor
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"
UNDO = {"type": "counted_undo", "retry": {"max_attempts": 2, "backoff_ms": 100}}
NAME = "saga_trip"
TRIP: dict[str, Any] = {
    "name": NAME,
    "version": 1,
    "steps": [
        {"name": "flight", "type": "counted", "compensate": UNDO},
        {"name": "hotel", "type": "counted", "depends_on": ["flight"], "compensate": UNDO},
        {"name": "car", "type": "counted", "depends_on": ["hotel"], "retry": {"max_attempts": 1}},
    ],
}
CAR_FAILS = {"by_node": {"car": {"fail_on": [1]}}}


def _services(settings: Settings, pg: psycopg.Connection[Any], spawn: Any) -> list[Spawned]:
    """The workflow registered, a processor and a worker of the counted steps, both joined."""
    counted_steps.install(pg)
    register_workflow(pg, parse_workflow(TRIP))
    processor = spawn(["process"], settings, "process")
    worker = spawn(["worker", "--app", APP, "--concurrency", "32"], settings, "worker")
    for child in (processor, worker):
        _joined(child)
    return [processor, worker]


def _joined(child: Spawned) -> None:
    wait_for(lambda: child.owned_partitions() > 0, 60, f"{child.log_path.stem} to join")


def _executed(pg: psycopg.Connection[Any], run_id: str) -> list[tuple[str, int]]:
    """The executions of the run's steps, (step, attempt), in the order they began."""
    rows = pg.execute(
        f"SELECT node, attempt FROM {counted_steps.LOG.table} WHERE run_id = %s"
        " ORDER BY started_at, id",
        (run_id,),
    ).fetchall()
    return [(n, a) for n, a in rows]


def _output(pg: psycopg.Connection[Any], run_id: str, node: str) -> Any:
    row = pg.execute(
        "SELECT output FROM eec_step_result WHERE run_id = %s AND node_id = %s"
        " AND outcome = 'succeeded'",
        (run_id, node),
    ).fetchone()
    assert row is not None, node
    return row[0]


def _ended(settings: Settings, run_id: str) -> client.RunResult:
    return client.wait_for_run(settings, run_id, 90)


def test_a_failed_run_undoes_its_steps_last_first_each_once_and_says_so(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    _services(settings, pg, spawn)
    run_id = f"saga-{uuid.uuid4().hex[:6]}"
    client.start_run(settings, NAME, run_id, CAR_FAILS)
    result = _ended(settings, run_id)
    assert result.status.value == "failed"
    assert result.failure_reason is not None and "'car' failed" in result.failure_reason
    assert result.compensation == "completed"
    assert _executed(pg, run_id) == [
        ("flight", 1),
        ("hotel", 1),
        ("car", 1),
        ("undo(hotel)", 1),
        ("undo(flight)", 1),
    ]
    # Each compensation was given the output of the step it undoes and the run's input.
    undone = _output(pg, run_id, "undo(hotel)")
    assert undone["undid"] == {"hotel": _output(pg, run_id, "hotel")}
    assert undone["input"] == CAR_FAILS
    shown = json.loads(run_ductor(settings, "inspect", run_id, "--output", "json").stdout)
    assert shown["compensation"] == {"outcome": "completed", "step": None, "error": None}
    text = run_ductor(settings, "inspect", run_id).stdout
    assert "compensation completed" in text
    assert "undo(flight)" in text and "undo(hotel)" in text
    refused = run_ductor(settings, "runs", "retry", run_id)
    assert refused.returncode != 0 and "ran its failure handler or compensations" in refused.stderr
    assert_transitions_applied_once(pg)


def test_a_run_cancelled_mid_way_compensates_only_what_succeeded(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    _services(settings, pg, spawn)
    run_id = f"saga-cancel-{uuid.uuid4().hex[:6]}"
    client.start_run(settings, NAME, run_id, {"by_node": {"hotel": {"sleep_ms": 3000}}})
    wait_for(lambda: ("hotel", 1) in _executed(pg, run_id), 30, "the hotel step to start")
    client.send_signal(settings, run_id)
    client.send_signal(settings, run_id)  # a second cancel changes nothing
    result = _ended(settings, run_id)
    assert result.status.value == "cancelled"
    assert result.compensation == "completed"
    # The hotel step was in flight: cancelled, not undone; the car step never ran.
    assert _executed(pg, run_id) == [("flight", 1), ("hotel", 1), ("undo(flight)", 1)]
    wait_for(
        lambda: (
            pg.execute(
                f"SELECT count(*) FROM {counted_steps.LOG.table}"
                " WHERE run_id = %s AND node = 'hotel' AND ended_at IS NOT NULL",
                (run_id,),
            ).fetchone()
            == (1,)
        ),
        30,
        "the hotel step's execution to end",
    )
    with pytest.raises(client.SignalRefused, match="has ended"):  # and one after the end
        client.send_signal(settings, run_id)
    assert _executed(pg, run_id)[-1] == ("undo(flight)", 1)
    assert client.get_run(settings, run_id).status.value == "cancelled"


def test_a_run_past_its_deadline_undoes_what_succeeded_then_ends_failed(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    _services(settings, pg, spawn)
    register_workflow(pg, parse_workflow(TRIP | {"name": "saga_late", "timeout_ms": 2_000}))
    run_id = f"saga-late-{uuid.uuid4().hex[:6]}"
    slow = {"by_node": {"hotel": {"sleep_ms": 4_000}, "undo(flight)": {"sleep_ms": 500}}}
    client.start_run(settings, "saga_late", run_id, slow)
    result = _ended(settings, run_id)
    assert result.status.value == "failed"
    assert result.failure_reason == "run deadline of 2000 ms passed"
    assert result.compensation == "completed"
    assert _executed(pg, run_id) == [("flight", 1), ("hotel", 1), ("undo(flight)", 1)]


def test_a_failure_handler_receives_the_failure_before_the_compensations_run(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    _services(settings, pg, spawn)
    handled = TRIP | {"name": "saga_handled", "on_failure": {"type": "counted_undo"}}
    register_workflow(pg, parse_workflow(handled))
    run_id = f"saga-handled-{uuid.uuid4().hex[:6]}"
    client.start_run(settings, "saga_handled", run_id, CAR_FAILS)
    result = _ended(settings, run_id)
    assert (result.status.value, result.compensation) == ("failed", "completed")
    assert _executed(pg, run_id)[2:] == [
        ("car", 1),
        ("on_failure", 1),
        ("undo(hotel)", 1),
        ("undo(flight)", 1),
    ]
    given = _output(pg, run_id, "on_failure")
    error = "StepFailed: attempt 1 fails, as its input says"
    assert given["undid"] == {
        "failure": {
            "reason": f"step 'car' failed after 1 attempt(s): {error}",
            "step": "car",
            "attempt": 1,
            "error": error,
        }
    }
    assert given["input"] == CAR_FAILS
    text = run_ductor(settings, "inspect", run_id).stdout
    assert "on_failure" in text and '"step":"car"' in text


def test_a_compensation_that_fails_for_good_leaves_the_run_saying_so(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    _services(settings, pg, spawn)
    run_id = f"saga-stuck-{uuid.uuid4().hex[:6]}"
    by_node = {"car": {"fail_on": [1]}, "undo(hotel)": {"fail_on": [1, 2]}}
    client.start_run(settings, NAME, run_id, {"by_node": by_node})
    result = _ended(settings, run_id)
    assert result.status.value == "failed"
    assert result.compensation == "failed"
    assert _executed(pg, run_id)[-2:] == [("undo(hotel)", 1), ("undo(hotel)", 2)]
    assert ("undo(flight)", 1) not in _executed(pg, run_id)  # the saga stopped there
    shown = client.inspect_run(settings, run_id)
    assert shown["compensation"]["outcome"] == "failed"
    assert shown["compensation"]["step"] == "hotel"
    assert "fails, as its input says" in shown["compensation"]["error"]
    statuses = {n["node"]: n["status"] for n in shown["nodes"]}
    assert statuses["undo(hotel)"] == "failed" and statuses["undo(flight)"] == "cancelled"


def test_a_processor_killed_mid_saga_is_replaced_and_every_saga_finishes_once(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    settings = replace(settings, sweep_grace_s=0.5)
    victim, _worker = _services(settings, pg, spawn)
    run_ids = [f"saga-kill-{uuid.uuid4().hex[:6]}-{i}" for i in range(12)]
    slow_undo = {"car": {"fail_on": [1]}, "undo(hotel)": {"sleep_ms": 1500}}
    for run_id in run_ids:
        client.start_run(settings, NAME, run_id, {"by_node": slow_undo})

    def in_sagas() -> bool:
        rows = pg.execute(
            f"SELECT count(DISTINCT run_id) FROM {counted_steps.LOG.table}"
            " WHERE run_id = ANY(%s) AND node = 'undo(hotel)'",
            (run_ids,),
        ).fetchone()
        return rows is not None and rows[0] >= 3

    wait_for(in_sagas, 60, "some runs to be in their sagas")
    assert count_terminal(pg, run_ids) < len(run_ids), "the kill must come mid-saga"
    victim.kill()  # SIGKILL: no shutdown, no flush, no offset commit
    replacement = spawn(["process"], settings, "replacement")
    wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 120, "every run to end", 0.5)
    assert set(run_statuses(pg, run_ids).values()) == {"failed"}
    for run_id in run_ids:
        assert client.get_run(settings, run_id).compensation == "completed"
        assert _executed(pg, run_id)[-2:] == [("undo(hotel)", 1), ("undo(flight)", 1)], run_id
    counts = counted_steps.executions(pg, "saga-kill-")
    assert counted_steps.extra_executions(counts) == 0
    assert {n for _, n, a in counts if a > 1} == set()  # no attempt lost to the kill
    assert replacement.terminate() == 0
    assert_transitions_applied_once(pg)
