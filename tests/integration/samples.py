"""The repository's sample workflow (every test's workflow, registered by the ``pg``
fixture) and the wakeups that start its runs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import orjson
from confluent_kafka import Producer

from processor.core.envelope import Wakeup
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "schemas" / "workflows" / "sample.json"


def sample_workflow() -> WorkflowDef:
    return parse_workflow(orjson.loads(SAMPLE.read_bytes()))


def now_ms() -> int:
    return int(time.time() * 1000)


def produce_wakeups(settings: Settings, records: Sequence[tuple[str, Wakeup, int | None]]) -> None:
    """Produce (topic, wakeup, partition) records and wait until the broker has them all."""
    producer = Producer(producer_config(settings, "test-producer"))
    for topic, wakeup, partition in records:
        produce(producer, topic, wakeup.encode(), wakeup.key(), partition)
    assert producer.flush(30) == 0, "the broker did not acknowledge the test records"
