"""No task stops the worker, against the real broker and database: tasks that cannot be
decoded are dead-lettered, an output Postgres cannot store fails its attempt, a task for a
run that no longer exists is skipped without running, and the good runs beside them all
succeed."""

from __future__ import annotations

from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import Producer

from processor.client import start_runs
from processor.core.dead_letters import SOURCE_TOPIC
from processor.core.routing import TopicNames
from processor.core.step_task import StepTask
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.configs import producer_config
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow
from processor.worker import StepContext, sample_registry

from .instances import ProcessorThread, WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _task(**fields: Any) -> bytes:
    body = {
        "task_version": 1,
        "run_id": "no-such-run",
        "node": "n",
        "attempt": 1,
        "step_type": "fast",
        "deadline_ms": 2**42,
        "tier": "t1",
        **fields,
    }
    return orjson.dumps(body)


def test_no_task_stops_the_worker(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": "nul-output",
                "version": 1,
                "steps": [{"name": "only", "type": "nul", "retry": {"max_attempts": 1}}],
            }
        ),
    )
    registry = sample_registry()

    @registry.step("nul")
    def nul(ctx: StepContext) -> Any:
        return {"text": "a\x00b"}  # valid JSON, but jsonb cannot hold it

    names = TopicNames(settings.topic_prefix)
    poison = [
        b"not a task",
        _task(tier="t9"),  # the wakeup would go to a topic that does not exist
        _task(node="a\x00b"),  # Postgres cannot store the node's name
    ]
    producer = Producer(producer_config(settings, "test-poison-tasks"))
    for value in poison:
        producer.produce(names.steps, value=value, key=b"poison")
    # A valid task for a run that does not exist (deleted by gc, say): nothing to run it for.
    producer.produce(names.steps, value=StepTask("gone", "n", 1, "fast", 2**42).encode())
    assert producer.flush(30) == 0

    good = [f"good-{i}" for i in range(20)]
    start_runs(settings, "sample", good)
    start_runs(settings, "nul-output", ["nul-1"])
    processor: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(settings, registry)
    try:
        wait_for(lambda: count_terminal(pg, [*good, "nul-1"]) == 21, 90, "every run to end")
        wait_for(
            lambda: worker.worker.stats.skipped["run_gone"] == 1, 30, "the orphan task skipped"
        )
        assert worker.alive and worker.error is None
    finally:
        worker.stop()
    assert set(run_statuses(pg, good).values()) == {"succeeded"}
    assert run_statuses(pg, ["nul-1"]) == {"nul-1": "failed"}
    error = pg.execute(
        "SELECT error FROM eec_step_result WHERE run_id = 'nul-1' AND node_id = 'only'"
    ).fetchone()
    assert error is not None and "NUL" in error[0]
    letters = [d for d in read_dead_letters(settings) if d.header(SOURCE_TOPIC) == names.steps]
    assert sorted(d.value or b"" for d in letters) == sorted(poison)
    assert {d.reason for d in letters} == {"wrong_schema"} and worker.worker.dead_letters == 3
    # Three fast steps per good run, and the orphan never ran.
    assert worker.worker.stats.attempts[("fast", "succeeded")] == 3 * len(good)
    assert not processor.stats.errors
