"""Every metric and label the Grafana dashboard and the Prometheus alerting rules name is served
by a real `ductor process` and a real `ductor worker` on their /metrics, once they have done
each kind of work they watch: ticks committed, a run fighting an outside writer (conflicts, a
requeue, a livelock force-fail), a record that is not JSON and a run changed out of band
(dead letters, a quarantine, an error), latencies and lag, runs started and ended; steps run
and a stale task skipped."""

from __future__ import annotations

import contextlib
import uuid
from dataclasses import replace
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

from processor.core.envelope import Wakeup
from processor.core.routing import TIERS, TopicNames
from processor.core.step_task import StepTask
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.clients import produce
from processor.io.kafka.configs import producer_config
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow
from tests.promql import all_queries, problems

from .contention import OutsideWriter
from .runs import run_statuses
from .samples import now_ms, produce_wakeups, sample_workflow
from .scrape import free_port, scrape, values
from .waiting import wait_for

pytestmark = pytest.mark.integration

RUNS = 16  # committed ticks: the end-to-end histogram samples one in 8
LIMITED = parse_workflow(
    {
        "name": "dashboard-limited",
        "version": 1,
        "steps": [
            {"name": "only", "type": "fast", "concurrency": {"limit": 1, "name": "one-at-a-time"}}
        ],
    }
)


def _quarantine_reason(pg: psycopg.Connection[Any], run_id: str) -> str | None:
    row = pg.execute(
        "SELECT reason FROM eec_run_quarantine WHERE run_id = %s", (run_id,)
    ).fetchone()
    return None if row is None else row[0]


def test_every_name_in_the_dashboard_and_the_alerts_is_exported(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Any
) -> None:
    settings = replace(settings, livelock_requeues=1, metrics_port=free_port())
    names = TopicNames(settings.topic_prefix)
    tag = uuid.uuid4().hex[:6]
    good = [f"dash-{tag}-{i}" for i in range(RUNS)]
    fought, tampered = f"fought-{tag}", f"tampered-{tag}"
    insert_runs(pg, sample_workflow(), [(r, {}) for r in [*good, fought, tampered]], "t1")
    # Three runs behind a limit of one: two wait for it, and are let in (limit metrics).
    register_workflow(pg, LIMITED)
    limited = [f"limited-{tag}-{i}" for i in range(3)]
    insert_runs(pg, LIMITED, [(r, {}) for r in limited], "t1")
    # Changed outside the processor: a checksum mismatch (dead letter, quarantine, error).
    pg.execute(
        "UPDATE eec_workflow_run SET state_checksum = 'changed-by-hand' WHERE run_id = %s",
        (tampered,),
    )
    # Every commit of this one loses a version race: conflicts, a requeue, a livelock.
    writer = OutsideWriter(settings.pg_dsn, fought)
    try:
        wait_for(lambda: writer.writes > 0, 10, "the outside writer to start")
        child = spawn(["process"], settings, "dashboards")
        topic = names.wakeup("t1")
        produce_wakeups(
            settings,
            [
                (topic, Wakeup(run_id, "start", produced_at=now_ms()), None)
                for run_id in [*good, fought, tampered, *limited]
            ],
        )
        producer = Producer(producer_config(settings, "test-garbage"))
        produce(producer, topic, b"\x00 not JSON {", b"garbage")
        assert producer.flush(30) == 0, "the broker did not acknowledge the garbage record"
        wait_for(
            lambda: set(run_statuses(pg, good).values()) == {"running"},
            60,
            "the good runs' first ticks to commit",
        )
        wait_for(
            lambda: run_statuses(pg, [fought])[fought] == "failed", 60, "the livelock force-fail"
        )
        wait_for(
            lambda: (_quarantine_reason(pg, tampered) or "").startswith("checksum_mismatch"),
            60,
            "the tampered run's quarantine",
        )
        # A worker runs the good runs' steps, and skips a task whose deadline has passed.
        worker_settings = replace(settings, metrics_port=free_port())
        worker = spawn(["worker"], worker_settings, "dashboards-worker")
        stale = StepTask(good[0], "fetch", 9, "fast", deadline_ms=1).encode()
        produce(producer, names.steps, stale, good[0].encode())
        assert producer.flush(30) == 0
        wait_for(
            lambda: set(run_statuses(pg, [*good, *limited]).values()) == {"succeeded"},
            60,
            "the good runs to succeed",
        )
    finally:
        writer.stop()

    queries = all_queries()
    missing: list[str] = []

    def complete() -> bool:
        missing[:] = problems(
            queries, scrape(settings.metrics_port), scrape(worker_settings.metrics_port)
        )
        return not missing

    # The deadline passing is reported by the assertion below, with what is still missing.
    with contextlib.suppress(pytest.fail.Exception):
        wait_for(complete, 60, "every metric the dashboard and the rules name")
    assert missing == [], "\n".join(missing)

    # The work that made them, as the metrics count it.
    exposition = scrape(settings.metrics_port)
    ticks = values(exposition, "ductor_ticks_total")
    assert ticks[(("ductor_outcome", "committed"),)] >= RUNS
    assert values(exposition, "ductor_conflicts_total")[()] > 0
    assert values(exposition, "ductor_requeues_total") == {(("ductor_delay_rung_ms", "100"),): 1}
    assert values(exposition, "ductor_force_fails_total") == {(("ductor_reason", "livelock"),): 1}
    # The tampered run's every wakeup record is dead-lettered: its start, and a re-wake should
    # the due sweep find it before its quarantine landed (a slow start under load). It is
    # quarantined once.
    letters = values(exposition, "ductor_dead_letters_total")
    mismatches = letters.pop((("ductor_reason", "checksum_mismatch"),), 0)
    assert letters == {(("ductor_reason", "not_json"),): 1}
    assert mismatches >= 1
    assert values(exposition, "ductor_quarantined_total") == {
        (("ductor_reason", "checksum_mismatch"),): 1
    }
    # An error each time the run was met: a re-wake that met the processor in one batch with
    # the start wakeup is one error and two dead letters.
    errors = values(exposition, "ductor_errors_total")
    assert set(errors) == {(("error_type", "checksum_mismatch"),)}
    assert 1 <= errors[(("error_type", "checksum_mismatch"),)] <= mismatches
    workflow = ("ductor_workflow", sample_workflow().name)
    # The fought run never started (its commits all lost) and ended force-failed; the
    # tampered one was never ticked.
    behind = ("ductor_workflow", LIMITED.name)
    assert values(exposition, "ductor_runs_started_total") == {(workflow,): RUNS, (behind,): 3}
    assert values(exposition, "ductor_runs_ended_total") == {
        (("ductor_status", "succeeded"), workflow): RUNS,
        (("ductor_status", "failed"), workflow): 1,
        (("ductor_status", "succeeded"), behind): 3,
    }
    limit = (("ductor_limit", "one-at-a-time"),)
    assert values(exposition, "ductor_limit_refused_total")[limit] >= 2
    assert values(exposition, "ductor_limit_wait_duration_milliseconds_count") == {limit: 2}
    assert values(exposition, "ductor_ready") == {(): 1}
    partitions = values(exposition, "ductor_partitions_assigned")[()]
    assert partitions == (
        len(names.wakeup_topics()) * settings.wakeup_partitions
        + len(names.delay_topics()) * settings.delay_partitions
        + settings.wakeup_partitions  # the requests topic, partitioned like the wakeups
    )
    assert child.terminate() == 0

    exposition = scrape(worker_settings.metrics_port)
    executions = values(exposition, "ductor_worker_step_attempts_total")
    assert executions[(("ductor_outcome", "succeeded"), ("ductor_step_type", "fast"))] >= RUNS
    assert values(exposition, "ductor_worker_skipped_total") == {
        (("ductor_reason", "deadline"),): 1
    }
    assert values(exposition, "ductor_ready") == {(): 1}
    assert values(exposition, "ductor_partitions_assigned") == {
        (): len(TIERS) * settings.step_partitions
    }  # a topic per tier
    assert worker.terminate() == 0
