"""A dead worker's queued tasks move to another worker in seconds, on the real services
(processor/tools/failover.py measures it; docs/operations/workers.md#membership-and-failover
gives the figures): the workers' group holds the workers' own session timeout
(DUCTOR_WORKER_SESSION_TIMEOUT_MS), and a named worker (DUCTOR_WORKER_NAME, a static member)
that a supervisor starts again takes its partitions back: at once under the classic protocol,
without the surviving worker being given anything; under the consumer protocol once the broker
lets its name go, without exiting meanwhile. Every run succeeds in each case. The figures are
printed, not asserted (the machine's load decides the last tenths)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType  # type: ignore[attr-defined]

from processor.io.config.settings import Settings
from processor.io.kafka.configs import admin_config
from processor.io.kafka.worker_group import SESSION_TIMEOUT
from processor.tools.failover import Failover, measure

pytestmark = pytest.mark.integration


def _group_session_ms(settings: Settings, group: str) -> int:
    admin = AdminClient(admin_config(settings, "test-failover"))
    resource = ConfigResource(ResourceType.GROUP, group)
    configs = admin.describe_configs([resource])[resource].result(10)
    return int(configs[SESSION_TIMEOUT].value)


def _every_run_succeeded(figures: Failover) -> None:
    print("\n".join(figures.lines()))
    assert figures.queued > 0  # the killed worker had tasks waiting
    assert (figures.succeeded, figures.failed) == (figures.runs, 0)


def test_a_killed_workers_tasks_move_to_another_worker_after_the_workers_session(
    settings: Settings, tmp_path: Path
) -> None:
    figures = measure(settings, tmp_path, runs=40)
    _every_run_succeeded(figures)
    assert figures.survivor_assignments >= 1  # the survivor took the dead worker's partitions
    # The broker waited the workers' session timeout, not its own (10 s here, 45 s by default).
    assert _group_session_ms(settings, figures.group) == settings.worker_session_timeout_ms


def test_a_named_worker_started_again_takes_its_partitions_back_at_once_classic(
    settings: Settings, tmp_path: Path
) -> None:
    classic = replace(settings, group_protocol="classic")
    figures = measure(classic, tmp_path, runs=40, named=True, restart=True)
    _every_run_succeeded(figures)
    assert figures.restarted_assigned
    assert figures.survivor_assignments == 0  # no rebalance: the name's partitions came back


def test_a_named_worker_started_again_waits_for_its_name_without_exiting_consumer(
    settings: Settings, tmp_path: Path
) -> None:
    figures = measure(settings, tmp_path, runs=40, named=True, restart=True)
    _every_run_succeeded(figures)
    # It waited out the broker's refusal of its name (fatal for its client), then joined.
    assert figures.restarted_assigned
