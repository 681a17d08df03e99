"""Authenticated Kafka, for real: a processor and a worker reach the local broker through its
SASL_PLAINTEXT listener with SCRAM-SHA-512 credentials (created by infra/local.py) and runs
succeed; with a wrong password `ductor process` and `ductor worker` stop at once with exit
code 2 and one sentence on stderr. No log line of any of them contains the password."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from infra.local import KAFKA_SASL_PASSWORD, Kafka
from infra.local import Settings as InfraSettings
from processor.client import start_runs
from processor.io.config.settings import Settings

from .children import Spawned, child_env
from .runs import run_statuses
from .samples import REPO
from .waiting import wait_for

pytestmark = pytest.mark.integration


def _local_kafka(settings: Settings) -> Kafka:
    """The broker infra/local.py runs here, which must be the one the tests use."""
    if os.environ.get("DUCTOR_INFRA", "local") != "local":
        pytest.skip("the SASL listener is set up by the local infra (DUCTOR_INFRA is not local)")
    kafka = Kafka(InfraSettings.from_env())
    if settings.bootstrap_servers != kafka.endpoint:
        pytest.skip(
            f"the tests' broker ({settings.bootstrap_servers}) is not the one infra/local.py "
            f"runs here ({kafka.endpoint}), so its SASL listener is unknown"
        )
    problem = kafka.probe_sasl(timeout=10)
    if problem:
        pytest.fail(
            f"{problem}; the local broker was started without it: `infra/local.py down kafka`"
            " and `infra/local.py up kafka` start one with the SASL listener"
        )
    return kafka


def _through_sasl(settings: Settings, kafka: Kafka, password: str) -> Settings:
    return replace(
        settings,
        bootstrap_servers=kafka.sasl_endpoint,
        kafka_extra={
            key: str(value)
            for key, value in kafka.sasl_client_config(password).items()
            if key != "bootstrap.servers"
        },
    )


def test_a_processor_and_a_worker_run_workflows_through_the_sasl_listener(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    kafka = _local_kafka(settings)
    sasl = _through_sasl(settings, kafka, KAFKA_SASL_PASSWORD)
    processor = spawn(["process"], sasl, "processor")
    worker = spawn(["worker", "--threads", "4"], sasl, "worker")
    run_ids = [f"sasl-{uuid.uuid4().hex[:8]}-{i}" for i in range(20)]
    start_runs(sasl, "sample", run_ids)  # the start wakeups go through the SASL listener too
    wait_for(
        lambda: set(run_statuses(pg, run_ids).values()) == {"succeeded"},
        120,
        "the 20 runs to succeed through the SASL listener",
        interval=0.25,
    )
    assert processor.terminate() == 0
    assert worker.terminate() == 0
    stats = processor.final_stats()
    assert stats["ticks"]["committed"] >= len(run_ids) and not stats["errors"], stats
    for child in (processor, worker):
        text = child.log_path.read_bytes()
        assert text, f"{child.log_path} is empty"
        assert KAFKA_SASL_PASSWORD.encode() not in text, f"the password is in {child.log_path}"


@pytest.mark.parametrize("command", ["process", "worker"])
def test_wrong_credentials_stop_at_once_with_one_sentence_and_exit_code_2(
    settings: Settings, command: str
) -> None:
    kafka = _local_kafka(settings)
    wrong = f"not-the-password-{uuid.uuid4().hex[:8]}"
    env = child_env(_through_sasl(settings, kafka, wrong))
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "processor", command],
        env=env,
        cwd=REPO,
        capture_output=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - started
    stderr = done.stderr.decode()
    assert done.returncode == 2, stderr
    assert elapsed < 10, f"took {elapsed:.1f} s"
    assert stderr.count("\n") == 1 and stderr.startswith("ductor: "), stderr
    assert "refused to authenticate this client as user 'ductor'" in stderr, stderr
    assert "SCRAM-SHA-512" in stderr and kafka.sasl_endpoint in stderr, stderr
    assert wrong not in stderr + done.stdout.decode()
