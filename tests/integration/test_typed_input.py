"""A workflow that declares its input (``input_schema``) refuses a start whose input does not
match, saying where it is wrong, before anything is written: `ductor start` with exit 2, the
Python client with ``InvalidInput``, and a start record from Kafka (`ductor start --via kafka`,
an upstream producer) as an ``invalid_input`` dead letter with its bytes. A matching input
runs, and its steps read it as the workflow's model."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import psycopg
import pytest

from processor import StepContext, StepRegistry
from processor.client import InvalidInput, start_run
from processor.core.routing import TopicNames
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow

from .children import run_ductor
from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

SCHEMA = {
    "type": "object",
    "required": ["order_id", "items"],
    "properties": {
        "order_id": {"type": "string", "minLength": 1},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
            },
        },
    },
}
GOOD = {"order_id": "17", "items": [{"sku": "book", "qty": 2}]}
BAD = {"order_id": "18", "items": [{"sku": "book", "qty": 0}]}
WHERE = "at $.items[0].qty: 0 is less than the minimum of 1"


def _registry() -> StepRegistry:
    registry = StepRegistry()

    @registry.step("count_items")
    def count_items(ctx: StepContext) -> dict[str, Any]:
        order = ctx.input_as(dict)
        return {"order": order["order_id"], "qty": sum(i["qty"] for i in order["items"])}

    return registry


def test_an_input_off_the_schema_is_refused_at_every_door_and_a_good_one_runs(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    name = f"typed-{uuid.uuid4().hex[:6]}"
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": name,
                "version": 1,
                "input_schema": SCHEMA,
                "steps": [{"name": "count", "type": "count_items"}],
                "output": "count",
            }
        ),
    )
    refusal = f"the input does not match the input_schema of workflow {name!r} v1 {WHERE}"

    started = run_ductor(
        settings, "start", name, "--run-id", "typed-cli", "--input", orjson.dumps(BAD).decode()
    )
    assert (started.returncode, started.stdout, started.stderr) == (2, "", f"ductor: {refusal}\n")
    with pytest.raises(InvalidInput) as info:
        start_run(settings, name, "typed-client", BAD)
    assert str(info.value) == refusal
    assert run_statuses(pg, ["typed-cli", "typed-client"]) == {}, "a refused start wrote a row"

    processor_thread(settings)
    via_kafka = run_ductor(
        settings,
        "start",
        name,
        "--run-id",
        "typed-kafka",
        "--input",
        orjson.dumps(BAD).decode(),
        "--via",
        "kafka",
    )
    assert via_kafka.returncode == 0, via_kafka.stderr  # (the processor decides)
    wait_for(lambda: len(read_dead_letters(settings)) == 1, 60, "the start's dead letter")
    [letter] = read_dead_letters(settings)
    assert (letter.reason, letter.key, letter.detail) == ("invalid_input", b"typed-kafka", refusal)
    assert letter.source_topic == TopicNames(settings.topic_prefix).requests
    assert orjson.loads(letter.value or b"")["input"] == BAD

    good = run_ductor(
        settings, "start", name, "--run-id", "typed-good", "--input", orjson.dumps(GOOD).decode()
    )
    assert good.returncode == 0, good.stderr
    worker = WorkerThread(settings, _registry())
    try:
        wait_for(lambda: count_terminal(pg, ["typed-good"]) == 1, 60, "the good run to end")
    finally:
        worker.stop()
    shown = run_ductor(settings, "result", "typed-good")
    assert (shown.returncode, orjson.loads(shown.stdout)) == (0, {"order": "17", "qty": 2})
    assert set(run_statuses(pg, ["typed-cli", "typed-client", "typed-kafka"])) == set()
