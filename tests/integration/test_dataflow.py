"""Data between steps and a run's declared output, on the real broker and database: a step
sees the run's input and its dependencies' outputs (carried inline, or fetched by the worker
when too large or not at hand), and a succeeded run stores its output, a failed one none."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Consumer, Producer

from processor.client import start_runs
from processor.core.routing import TopicNames
from processor.core.step_task import MAX_INLINE_DATA_BYTES, StepTask
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.kafka.configs import producer_config
from processor.io.kafka.topics import create_topics
from processor.io.postgres.workflows import register_workflow

from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

# A diamond of steps that each return what they were given (the sample "echo" step), but for
# "left", which fails its first two attempts (the sample "flaky" step): its dependents must
# read the output of the attempt that succeeded.
DIAMOND: dict[str, Any] = {
    "name": "diamond",
    "version": 1,
    "steps": [
        {"name": "prepare", "type": "echo"},
        {
            "name": "left",
            "type": "flaky",
            "depends_on": ["prepare"],
            "retry": {"max_attempts": 4, "backoff_ms": 20},
        },
        {"name": "right", "type": "echo", "depends_on": ["prepare"]},
        {"name": "join", "type": "echo", "depends_on": ["left", "right"]},
    ],
    "output": {"joined": "join", "prepared": "prepare"},
}


def _register(pg: psycopg.Connection[Any], raw: dict[str, Any]) -> WorkflowDef:
    wf = parse_workflow(raw)
    register_workflow(pg, wf)
    return wf


def _outputs(pg: psycopg.Connection[Any], run_id: str) -> dict[str, Any]:
    """Each step's output, from the attempt its node state says succeeded."""
    rows = pg.execute(
        "SELECT s.node_id, s.output FROM eec_step_result s JOIN eec_workflow_run r USING (run_id)"
        " WHERE s.run_id = %s AND s.attempt = (r.node_states -> s.node_id ->> 'attempt')::int",
        (run_id,),
    ).fetchall()
    return dict(rows)


def _run_output(pg: psycopg.Connection[Any], run_id: str) -> Any:
    row = pg.execute("SELECT output FROM eec_workflow_run WHERE run_id = %s", (run_id,)).fetchone()
    assert row is not None
    return row[0]


def _step_tasks(settings: Settings, count: int) -> list[dict[str, Any]]:
    """The first ``count`` step tasks the coordinator sent, as JSON objects."""
    consumer = Consumer(
        {
            **settings.kafka_common(),
            "group.id": f"tasks-{uuid.uuid4().hex[:6]}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TopicNames(settings.topic_prefix).steps])
    tasks: list[dict[str, Any]] = []

    def read() -> bool:
        for message in consumer.consume(100, 0.2):
            if message.error() is None:
                tasks.append(orjson.loads(message.value() or b""))
        return len(tasks) >= count

    try:
        wait_for(read, 30, f"{count} step tasks on the steps topic")
    finally:
        consumer.close()
    return tasks


def _finish(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any, run_ids: list[str]
) -> WorkerThread:
    processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 60, "the runs to end")
    finally:
        worker.stop()
    return worker


def test_steps_see_the_run_input_and_their_dependencies_outputs(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    _register(pg, DIAMOND)
    run_input = {"order": 7, "items": ["a", "b"]}
    start_runs(settings, "diamond", ["small"], run_input)
    worker = _finish(settings, pg, processor_thread, ["small"])
    assert run_statuses(pg, ["small"]) == {"small": "succeeded"}

    out = _outputs(pg, "small")
    assert out["prepare"] == {"node": "prepare", "input": run_input, "deps": {}}
    assert out["left"] == {"succeeded_on_attempt": 3}
    assert out["right"] == {
        "node": "right",
        "input": run_input,
        "deps": {"prepare": out["prepare"]},
    }
    # The output of left's third attempt, the one that succeeded (its first two failed).
    assert out["join"] == {
        "node": "join",
        "input": run_input,
        "deps": {"left": {"succeeded_on_attempt": 3}, "right": out["right"]},
    }
    # The declared output, written when the run succeeded.
    assert _run_output(pg, "small") == {"joined": out["join"], "prepared": out["prepare"]}

    # The first step's task carried the input (the first tick has it at hand); the others named
    # the attempts to read, and the worker fetched them.
    tasks = {(t["node"], t["attempt"]): t for t in _step_tasks(settings, 6)}
    assert tasks[("prepare", 1)]["data"] == {"input": run_input, "deps": {}}
    assert tasks[("join", 1)]["data"] is None
    assert tasks[("join", 1)]["dep_attempts"] == {"left": 3, "right": 1}
    assert worker.worker.fetched == 5  # left x3, right, join


def test_data_above_the_bound_is_fetched_and_a_single_step_output_stored(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    raw = {
        "name": "big",
        "version": 1,
        "steps": [
            {"name": "first", "type": "echo"},
            {"name": "second", "type": "echo", "depends_on": ["first"]},
        ],
        "output": "second",
    }
    _register(pg, raw)
    run_input = {"blob": "x" * (MAX_INLINE_DATA_BYTES + 100)}
    start_runs(settings, "big", ["large"], run_input)
    worker = _finish(settings, pg, processor_thread, ["large"])
    assert run_statuses(pg, ["large"]) == {"large": "succeeded"}

    out = _outputs(pg, "large")
    assert out["first"] == {"node": "first", "input": run_input, "deps": {}}
    assert out["second"] == {"node": "second", "input": run_input, "deps": {"first": out["first"]}}
    assert _run_output(pg, "large") == out["second"]
    tasks = _step_tasks(settings, 2)
    assert [t["data"] for t in tasks] == [None, None]  # too large to carry: both fetched
    assert worker.worker.fetched == 2


def test_a_failed_run_stores_no_output(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    raw = {
        "name": "doomed",
        "version": 1,
        "steps": [
            {"name": "ok", "type": "echo"},
            {"name": "bad", "type": "fail", "depends_on": ["ok"], "retry": {"max_attempts": 1}},
        ],
        "output": {"ok": "ok"},
    }
    _register(pg, raw)
    start_runs(settings, "doomed", ["doomed-1"], {"n": 1})
    _finish(settings, pg, processor_thread, ["doomed-1"])
    assert run_statuses(pg, ["doomed-1"]) == {"doomed-1": "failed"}
    assert _run_output(pg, "doomed-1") is None


def test_a_task_from_an_older_coordinator_gets_its_data_from_the_run(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """A rolling upgrade: a task without ``dep_attempts`` or ``data`` (as coordinators wrote
    them before data flow) is run with the data the run's definition and state point at."""
    # "join" runs on a queue no worker serves here: the coordinator's own task for it waits
    # there, and the task in the old format stands in for it on the queue the worker serves.
    held = {**DIAMOND, "name": "diamond-held"}
    held["steps"] = [
        {**step, "queue": "unserved"} if step["name"] == "join" else step
        for step in DIAMOND["steps"]
    ]
    _register(pg, held)
    create_topics(settings, queues=["unserved"])
    start_runs(settings, "diamond-held", ["old"], {"v": 1})
    processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: _node(pg, "old", "join") == ("dispatched", 1), 60, "join to be dispatched")
        out = _outputs(pg, "old")
        old_task = StepTask("old", "join", 1, "echo", 2**42, "t1")
        assert set(orjson.loads(old_task.encode())) == {
            "task_version",
            "run_id",
            "node",
            "attempt",
            "step_type",
            "deadline_ms",
            "tier",
        }
        producer = Producer(producer_config(settings, "old-coordinator"))
        producer.produce(TopicNames(settings.topic_prefix).steps, old_task.encode(), b"old")
        assert producer.flush(30) == 0
        wait_for(lambda: count_terminal(pg, ["old"]) == 1, 60, "the run to end")
    finally:
        worker.stop()
    assert run_statuses(pg, ["old"]) == {"old": "succeeded"}
    assert _outputs(pg, "old")["join"] == {
        "node": "join",
        "input": {"v": 1},
        "deps": {"left": out["left"], "right": out["right"]},
    }


def _node(pg: psycopg.Connection[Any], run_id: str, node: str) -> tuple[str, int] | None:
    row = pg.execute(
        "SELECT node_states -> %s ->> 'status', (node_states -> %s ->> 'attempt')::int"
        " FROM eec_workflow_run WHERE run_id = %s",
        (node, node, run_id),
    ).fetchone()
    return None if row is None else (row[0], row[1])
