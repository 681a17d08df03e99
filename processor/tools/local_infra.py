"""Restart or crash the local Kafka and Postgres on their data, for outage tests and the chaos
run.

Built on infra/local.py: the same code as `infra/local.py restart|kill`, so it is importable
only from a checkout of the repository, where `make` and the tests run; the package does not
ship infra/ (processor/tools/checkout.py says why). The services must be the ones
infra/local.py runs for the environment (DUCTOR_INFRA_DIR, DUCTOR_LOCAL_*_PORT) and the ones
the settings point at; otherwise ``local_services`` refuses, so nothing ever restarts a broker
or a database it was not given.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import psycopg

from infra.local import InfraError, Kafka, KafkaCluster, Postgres, State, StopMode
from infra.local import Settings as InfraSettings
from processor.io.config.settings import Settings


class NotLocalServices(Exception):
    """The settings' services are not the ones infra/local.py runs here (the message says
    why): they must not be restarted."""


class LocalInfra:
    """The local Kafka and Postgres, as infra/local.py runs them. Each method returns how
    long the service was unavailable (from the stop to answering again), in seconds."""

    def __init__(self, kafka: Kafka, postgres: Postgres) -> None:
        self.kafka = kafka
        self.postgres = postgres

    def restart_kafka(self, keep_data: bool = True, mode: StopMode = StopMode.FAST) -> float:
        """Stop the broker by ``mode`` and start it again: on its log dir (topics, records
        and offsets kept), or with ``keep_data=False`` as a new empty cluster (`up`)."""
        started = time.monotonic()
        if keep_data:
            self.kafka.restart(mode)
        else:
            self.kafka.down(mode)
            self.kafka.up()
        return time.monotonic() - started

    def kill_kafka(self) -> None:
        """SIGKILL the broker and leave it down; ``start_kafka`` brings it back on its data."""
        self.kafka.down(StopMode.KILL)

    def start_kafka(self) -> float:
        started = time.monotonic()
        self.kafka.restart()  # nothing to stop: starts it on its log dir
        return time.monotonic() - started

    def restart_postgres(self, mode: StopMode = StopMode.IMMEDIATE) -> float:
        """`pg_ctl restart -m <mode>`; after immediate or kill the server recovers from WAL."""
        started = time.monotonic()
        self.postgres.restart(mode)
        return time.monotonic() - started

    def kill_postgres(self) -> None:
        self.postgres.down(StopMode.KILL)

    def start_postgres(self) -> float:
        started = time.monotonic()
        self.postgres.up()
        return time.monotonic() - started

    def with_broker(self, node: Kafka) -> LocalInfra:
        """The same services, but the broker outages stop ``node`` (one of a local cluster,
        ``three_brokers``) instead of the single broker."""
        return LocalInfra(node, self.postgres)

    def ensure_running(self) -> None:
        """Bring back whatever was left down, on its data. A broker that will not start on
        its data is replaced by a new empty one (its log dir kept aside), so the tests after
        this one have a broker; the InfraError then says so, for the test that left it."""
        if self.postgres.status().state is not State.RUNNING:
            self.postgres.restart()
        if self.kafka.status().state is State.RUNNING:
            return
        try:
            self.kafka.restart()
        except InfraError as exc:
            kept = self.kafka.start_afresh()
            raise InfraError(
                f"the broker would not start on its data, so a new empty one runs in its "
                f"place (the old log dir and logs are in {kept}):\n{exc}"
            ) from exc


def local_services(settings: Settings) -> LocalInfra:
    """The services infra/local.py runs, if they are the ones ``settings`` use and they run;
    NotLocalServices otherwise."""
    if os.environ.get("DUCTOR_INFRA", "local") != "local":
        raise NotLocalServices(
            "restarting services needs the local infra (DUCTOR_INFRA is not local)"
        )
    infra = InfraSettings.from_env()
    kafka, postgres = Kafka(infra), Postgres(infra)
    dsn = psycopg.conninfo.conninfo_to_dict(settings.pg_dsn)
    if settings.bootstrap_servers != kafka.endpoint or str(dsn.get("port")) != str(infra.pg_port):
        raise NotLocalServices(
            f"the services ({settings.bootstrap_servers}, {settings.pg_dsn_redacted}) "
            "are not the ones infra/local.py runs here; not restarting them"
        )
    for svc in (kafka, postgres):
        if svc.status().state is not State.RUNNING:
            raise NotLocalServices(
                f"{svc.name} is not running under infra/local.py ({infra.infra_dir})"
            )
    return LocalInfra(kafka, postgres)


CLUSTER_PORT = 29092  # node N on 29092 + 3 (N - 1) and the two ports after it


@contextmanager
def three_brokers() -> Iterator[KafkaCluster]:
    """A local three-broker cluster for the block (beside the single broker, in the same
    state directory, so the jars are shared), on ports of its own; killed afterwards."""
    infra = InfraSettings.from_env()
    cluster = KafkaCluster(
        replace(
            infra,
            kafka_port=CLUSTER_PORT,
            controller_port=CLUSTER_PORT + 1,
            sasl_port=CLUSTER_PORT + 2,
            kafka_brokers=3,
        )
    )
    cluster.up()
    try:
        yield cluster
    finally:
        cluster.down(StopMode.KILL)
