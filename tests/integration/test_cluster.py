"""A three-broker Kafka cluster (infra/local.py with DUCTOR_LOCAL_KAFKA_BROKERS=3, on ports of
its own beside the tests' single broker): topics are created with three replicas and
min.insync.replicas 2, and the broker leading most of the wakeup and steps partitions is
SIGKILLed while runs flow, then started again on its data. Every run ends, no transition is
applied twice, no step runs more than the bound of a broker outage, no process exits."""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource  # type: ignore[attr-defined]

from infra.local import KafkaCluster, StopMode
from infra.local import Settings as InfraSettings
from processor.client import start_runs
from processor.core.routing import TopicNames
from processor.io.config import Settings
from processor.io.kafka import admin_config
from processor.io.runs_admin import register_workflow
from processor.io.topics import create_topics

from . import counted_steps
from .audit import assert_results_applied, assert_transitions_applied_once
from .conftest import count_terminal, run_statuses, wait_for
from .test_once_per_attempt import APP, _quad

pytestmark = pytest.mark.integration

RUNS = 1000
DOWN_S = 10.0
BASE_PORT = 29092  # node N on 29092 + 3 (N - 1) and the two ports after it


@pytest.fixture(scope="module")
def cluster() -> Iterator[KafkaCluster]:
    infra = InfraSettings.from_env()  # the tests' state directory: the jars are shared
    three = replace(
        infra,
        kafka_port=BASE_PORT,
        controller_port=BASE_PORT + 1,
        sasl_port=BASE_PORT + 2,
        kafka_brokers=3,
    )
    brokers = KafkaCluster(three)
    brokers.up()
    try:
        yield brokers
    finally:
        brokers.down(StopMode.KILL)  # (its data goes with the next `up`)


def _leaders(admin: AdminClient, topics: list[str]) -> Counter[int]:
    """How many partitions of ``topics`` each broker leads."""
    meta = admin.list_topics(timeout=10).topics
    return Counter(p.leader for t in topics for p in meta[t].partitions.values())


def test_the_leader_of_most_partitions_killed_under_load_loses_nothing_and_runs_no_step_twice(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any, cluster: KafkaCluster
) -> None:
    pg = audit
    on_cluster = replace(
        settings, bootstrap_servers=cluster.endpoint, topic_prefix=f"c-{uuid.uuid4().hex[:8]}"
    )
    create_topics(on_cluster)
    names = TopicNames(on_cluster.topic_prefix)
    admin = AdminClient(admin_config(on_cluster, "test-cluster"))
    meta = admin.list_topics(timeout=10).topics
    assert {len(p.replicas) for p in meta[names.steps].partitions.values()} == {3}
    resource = ConfigResource(ConfigResource.Type.TOPIC, names.steps)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["min.insync.replicas"].value == "2"

    counted_steps.install(pg)
    register_workflow(pg, _quad())
    processor = spawn(["process"], on_cluster, "process")
    worker = spawn(["worker", "--app", APP], on_cluster, "worker")
    wait_for(
        lambda: processor.owned_partitions() > 0 and worker.owned_partitions() > 0,
        60,
        "both members to own partitions",
    )
    tag = uuid.uuid4().hex[:6]
    run_ids = [f"cl-{tag}-{i}" for i in range(RUNS)]
    start_runs(on_cluster, "counted-quad", run_ids, {"sleep_ms": 5})

    def running() -> bool:
        for member in (processor, worker):
            assert member.proc.poll() is None, f"{member.log_path.name} exited"
        return True

    wait_for(lambda: running() and count_terminal(pg, run_ids) >= RUNS // 5, 120, "a fifth")
    busiest = _leaders(admin, [*names.wakeup_topics(), names.steps]).most_common(1)[0][0]
    cluster.kill_node(busiest)
    killed_at = time.monotonic()
    ended_at_kill = count_terminal(pg, run_ids)
    wait_for(lambda: running() and time.monotonic() - killed_at >= DOWN_S, 30, "the outage", 0.5)
    ended_while_down = count_terminal(pg, run_ids) - ended_at_kill
    cluster.restart_node(busiest, StopMode.KILL)
    wait_for(
        lambda: running() and count_terminal(pg, run_ids) == RUNS, 300, "every run to end", 0.5
    )
    assert ended_at_kill < RUNS, "every run ended before the broker was killed"
    assert ended_while_down > 0, "nothing ended while two brokers of three served"
    for member in (processor, worker):
        assert member.terminate() == 0, f"{member.log_path.name} did not stop cleanly"
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    assert_results_applied(pg, run_ids)
    assert_transitions_applied_once(pg)
    counts = counted_steps.executions(pg, f"cl-{tag}")
    extra = counted_steps.extra_executions(counts)
    print(
        f"broker {busiest} killed for {DOWN_S:.0f} s: {ended_while_down} runs ended meanwhile,"
        f" {extra} extra executions of {len(counts)} attempts"
    )
    assert extra <= 0.005 * len(counts), (extra, len(counts))
