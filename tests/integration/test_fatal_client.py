"""A Kafka client that reports a fatal error never works again (librdkafka says so): the
service stops with exit code 4 for its supervisor to start a fresh process, instead of running
on without a working consumer. Forced with static membership: a second member with the same
``group.instance.id`` (classic protocol) fences the first."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import pytest

from processor.io.config.settings import Settings
from processor.io.runtime.exit_codes import EXIT_KAFKA_FATAL

from .waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", ["process", "worker"])
def test_a_member_fenced_by_another_with_its_instance_id_exits_for_its_supervisor(
    settings: Settings, spawn: Any, command: str
) -> None:
    static = replace(
        settings,
        group_protocol="classic",
        kafka_extra={**settings.kafka_extra, "group.instance.id": f"dup-{uuid.uuid4().hex[:6]}"},
    )
    first = spawn([command], static, f"{command}-first")
    wait_for(lambda: first.owned_partitions() > 0, 60, "the first member to own partitions")
    second = spawn([command], static, f"{command}-second")
    wait_for(lambda: first.proc.poll() is not None, 90, "the fenced member to stop")
    assert first.proc.returncode == EXIT_KAFKA_FATAL, f"log in {first.log_path}"
    assert any(
        str(line.get("msg", "")).startswith("fatal Kafka client error")
        for line in first.log_lines()
    )
    wait_for(lambda: second.owned_partitions() > 0, 60, "the second member to own partitions")
    assert second.terminate() == 0
