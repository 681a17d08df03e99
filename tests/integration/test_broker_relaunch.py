"""A broker that will not start on its data, forced: its log dir's lock is held by this
process, so every launch on it exits at once, as a broker whose predecessor still holds the
directory does. `restart` launches it a second time, and starts it when the second launch can
take the lock; when neither can, the outage fixture's `ensure_running` keeps the log dir aside
and starts a new empty broker, so one broken restart fails one test, not every test after it.

Each test runs a broker of its own (its own state directory and ports, the shared jars), never
the tests' shared one.
"""

from __future__ import annotations

import fcntl
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewTopic,
    ScramMechanism,
    UserScramCredentialDeletion,
)

from infra.local import KAFKA_SASL_USER, KAFKA_VERSION, InfraError, Kafka, State, StopMode
from infra.local import Settings as InfraSettings
from processor.io.config.settings import Settings
from processor.tools.local_infra import LocalInfra
from processor.tools.waiting import eventually

from .restarts import local_infra_for

pytestmark = pytest.mark.integration

LOCK_REFUSED = "Failed to acquire lock"  # what the broker logs when its log dir is taken


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Kafka]:
    """A single broker in a state directory of its own, on free ports, with the jars of the
    shared install; killed afterwards."""
    shared = InfraSettings.from_env()
    (tmp_path / f"kafka-{KAFKA_VERSION}").symlink_to(shared.infra_dir / f"kafka-{KAFKA_VERSION}")
    port, controller, sasl = _free_ports(3)
    kafka = Kafka(
        replace(
            shared,
            infra_dir=tmp_path,
            kafka_port=port,
            controller_port=controller,
            sasl_port=sasl,
            kafka_brokers=1,
        )
    )
    kafka.up()
    try:
        yield kafka
    finally:
        kafka.down(StopMode.KILL)


def _topics(kafka: Kafka) -> set[str]:
    admin = AdminClient({"bootstrap.servers": kafka.endpoint})
    return {t for t in admin.list_topics(timeout=30).topics if not t.startswith("__")}


def _create(kafka: Kafka, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.endpoint})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=30)


class _HeldLock:
    """This process's lock on a stopped broker's log dir, as a broker holding it would."""

    def __init__(self, kafka: Kafka) -> None:
        self._file = (kafka.data_dir / ".lock").open("a")
        fcntl.lockf(self._file, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def release(self) -> None:
        fcntl.lockf(self._file, fcntl.LOCK_UN)
        self._file.close()


def _refusals(kafka: Kafka) -> int:
    log = kafka.log_dir / "server.log"
    return log.read_text(errors="replace").count(LOCK_REFUSED) if log.exists() else 0


def test_a_launch_refused_its_log_dir_is_followed_by_a_second_that_starts_on_the_data(
    own_broker: Kafka,
) -> None:
    _create(own_broker, "kept")
    own_broker.down()
    lock = _HeldLock(own_broker)
    refused_before = _refusals(own_broker)

    def release_after_the_first_refusal() -> None:
        eventually(lambda: _refusals(own_broker) > refused_before, 60, 0.02)
        lock.release()

    releaser = threading.Thread(target=release_after_the_first_refusal, daemon=True)
    releaser.start()
    own_broker.restart()
    releaser.join()
    assert _refusals(own_broker) > refused_before, "the first launch was not refused its dir"
    assert own_broker.status().state is State.RUNNING
    assert "kept" in _topics(own_broker)  # started on its data, not afresh


def test_a_broker_no_launch_can_start_on_its_data_is_replaced_and_its_dir_kept(
    own_broker: Kafka, settings: Settings
) -> None:
    _create(own_broker, "kept")
    own_broker.down()
    lock = _HeldLock(own_broker)
    shared = local_infra_for(settings)
    infra = LocalInfra(own_broker, shared.postgres)
    try:
        with pytest.raises(InfraError) as refused:
            infra.ensure_running()
    finally:
        lock.release()
    message = str(refused.value)
    assert "would not start on its data" in message
    assert "launch 1:" in message and "launch 2:" in message, message
    kept = own_broker.run_dir / "failed"
    assert str(kept) in message
    assert own_broker.status().state is State.RUNNING
    assert "kept" not in _topics(own_broker)  # a new empty broker
    assert any(p.name.startswith("kept-") for p in (kept / "data").iterdir())
    assert LOCK_REFUSED in (kept / "logs" / "server.log").read_text(errors="replace")


def test_a_restart_whose_sasl_user_is_refused_writes_it_again(own_broker: Kafka) -> None:
    """Seen in CI: restarted on its data after a whole test run, the broker refused the SCRAM
    user while its plaintext listener served. Forced here by deleting the user: the restart
    writes it again, and the SASL listener answers."""
    admin = AdminClient({"bootstrap.servers": own_broker.endpoint})
    gone = UserScramCredentialDeletion(KAFKA_SASL_USER, ScramMechanism.SCRAM_SHA_512)
    for future in admin.alter_user_scram_credentials([gone]).values():
        future.result(30)
    assert own_broker.probe_sasl(5.0) is not None  # refused now
    own_broker.restart()
    assert own_broker.probe_sasl(10.0) is None
