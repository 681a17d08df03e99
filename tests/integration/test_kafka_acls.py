"""Kafka ACLs on the local broker's SASL listener, set as docs/operations/access.md's recipe
sets them (#kafka-acls): each principal may touch only what its part needs.

- Ductor's own principal (processors and workers) owns the topics of its prefix and the
  groups of its group id, and reads the team's topic its trigger follows: runs flow with
  nothing more, the processor and the worker running as that principal (not a super user).
- A team's principal may write its own topic, nothing else: its records become runs through
  the trigger, and its write to the requests topic (a forged cancel) is refused by the broker.
- An upstream service's principal may write the requests topic, nothing else: its starts
  become runs, and its write to a wakeup topic (a forged wakeup) is refused.

The local broker runs the KRaft authorizer open to everyone until an ACL exists, with the
principals the other tests use as super users (infra/local.py); the ACLs here name this test's
own topics, groups and principals, and are deleted afterwards with its users. A broker started
before the authorizer was configured fails the test with what to run.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)

from infra.local import Kafka
from processor.core.requests import SignalRequest, StartRequest
from processor.core.routing import TopicNames
from processor.io.config.settings import Settings
from processor.io.kafka.configs import admin_config, producer_config

from .children import Spawned, run_ductor
from .runs import run_statuses
from .test_sasl import _local_kafka
from .waiting import wait_for

pytestmark = pytest.mark.integration


@dataclass(frozen=True)
class Principal:
    user: str
    password: str

    @property
    def name(self) -> str:
        return f"User:{self.user}"


def recipe(
    prefix: str,
    group: str,
    ductor: Principal,
    team: Principal,
    team_topic: str,
    upstream: Principal,
) -> list[AclBinding]:
    """The ACLs of docs/operations/access.md#kafka-acls, for one deployment (``prefix``, ``group``),
    one team topic with a trigger, and one upstream service writing the requests topic."""

    def allow(kind: Any, name: str, pattern: Any, who: Principal, operation: Any) -> AclBinding:
        return AclBinding(kind, name, pattern, who.name, "*", operation, AclPermissionType.ALLOW)

    topic, group_kind = ResourceType.TOPIC, ResourceType.GROUP
    literal, prefixed = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    return [
        # Ductor: every topic of its prefix and every group of its group id (the workers'
        # is <group>-workers), and reading the team topics its triggers follow.
        allow(topic, f"{prefix}.", prefixed, ductor, AclOperation.ALL),
        allow(group_kind, group, prefixed, ductor, AclOperation.ALL),
        allow(topic, team_topic, literal, ductor, AclOperation.READ),
        # A team: its own topic only.
        allow(topic, team_topic, literal, team, AclOperation.WRITE),
        # An upstream service: the requests topic only.
        allow(topic, f"{prefix}.requests", literal, upstream, AclOperation.WRITE),
    ]


def _admin(settings: Settings) -> AdminClient:
    return AdminClient(admin_config(settings, "test-acls"))


def _acls(futures: dict[Any, Any]) -> None:
    """Wait for an ACL call; a broker without an authorizer (one started before infra/local.py
    configured it) refuses every one: the test fails saying what to run."""
    for future in futures.values():
        try:
            future.result(30)
        except KafkaException as exc:
            if exc.args[0].code() == KafkaError.SECURITY_DISABLED:
                pytest.fail(
                    "the local broker runs without an authorizer (it was started before"
                    " infra/local.py configured one): `infra/local.py down kafka` and"
                    " `infra/local.py up kafka` start one with it"
                )
            raise


def _everything_of(who: str) -> AclBindingFilter:
    any_name: Any = None  # a filter's None matches every name and host
    return AclBindingFilter(
        ResourceType.ANY,
        any_name,
        ResourcePatternType.ANY,
        who,
        any_name,
        AclOperation.ANY,
        AclPermissionType.ANY,
    )


def _through_sasl(settings: Settings, kafka: Kafka, who: Principal) -> Settings:
    config = kafka.sasl_client_config(who.password)
    extra = {k: str(v) for k, v in config.items() if k != "bootstrap.servers"}
    return replace(
        settings,
        bootstrap_servers=kafka.sasl_endpoint,
        kafka_extra={**extra, "sasl.username": who.user},
    )


@pytest.fixture
def principals(settings: Settings) -> Iterator[dict[str, Principal]]:
    """Three SCRAM users of this test's own, deleted afterwards with every ACL naming them
    (the broker's authorizer is tried first: nothing is made on a broker without one)."""
    _local_kafka(settings)  # skipped or failed here when the broker is not infra/local.py's
    admin = _admin(settings)
    tag = uuid.uuid4().hex[:8]
    made = {
        part: Principal(f"{part}-{tag}", f"{part}-password-{tag}")
        for part in ("ductor", "team", "upstream")
    }
    probe = AclBinding(
        ResourceType.TOPIC,
        f"{settings.topic_prefix}.probe",
        ResourcePatternType.LITERAL,
        made["team"].name,
        "*",
        AclOperation.READ,
        AclPermissionType.DENY,
    )
    _acls(admin.create_acls([probe]))
    sha512 = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(p.user, sha512, p.password.encode()) for p in made.values()
    ]
    try:
        for future in admin.alter_user_scram_credentials(upserts).values():
            future.result(30)
        yield made
    finally:
        _acls(admin.delete_acls([_everything_of(p.name) for p in made.values()]))
        deletions: list[UserScramCredentialAlteration] = [
            UserScramCredentialDeletion(p.user, ScramMechanism.SCRAM_SHA_512) for p in made.values()
        ]
        for future in admin.alter_user_scram_credentials(deletions).values():
            try:
                future.result(30)
            except KafkaException as exc:  # never made (the upsert failed)
                if exc.args[0].code() != KafkaError.RESOURCE_NOT_FOUND:
                    raise


def _write_as(settings: Settings, topic: str, key: str, value: bytes) -> KafkaError | None:
    """One record written with these settings' credentials (an idempotent producer, as ours
    are): None once the broker has it, else the error it gave."""
    delivered: list[KafkaError | None] = []
    producer = Producer({**producer_config(settings, "test-acls"), "message.timeout.ms": 15000})
    producer.produce(
        topic, value, key.encode(), on_delivery=lambda err, _msg: delivered.append(err)
    )
    producer.flush(30)
    assert len(delivered) == 1, "no delivery report within 30 s"
    return delivered[0]


def test_each_principal_reaches_only_what_the_recipe_gives_it(
    settings: Settings,
    pg: psycopg.Connection[Any],
    principals: dict[str, Principal],
    spawn: Callable[..., Spawned],
) -> None:
    kafka = _local_kafka(settings)
    names = TopicNames(settings.topic_prefix)
    team_topic = f"team-{settings.topic_prefix}.orders"  # the team's, outside Ductor's prefix
    admin = _admin(settings)
    ductor, team, upstream = principals["ductor"], principals["team"], principals["upstream"]
    acls = recipe(settings.topic_prefix, settings.group_id, ductor, team, team_topic, upstream)
    _acls(admin.create_acls(acls))
    as_team = _through_sasl(settings, kafka, team)
    as_upstream = _through_sasl(settings, kafka, upstream)
    for future in admin.create_topics([NewTopic(team_topic, 1, 1)]).values():
        future.result(30)
    try:
        # The team writes its own topic (once the broker knows its new user and ACLs) ...
        order = orjson.dumps({"order_id": "1"})
        wait_for(
            lambda: _write_as(as_team, team_topic, "1", order) is None,
            60,
            "the team's principal to write its own topic",
            interval=0.5,
        )
        # ... and nothing of Ductor's: a forged cancel, a forged start.
        forged = SignalRequest("order-1", "cancel", "forged").encode()
        refused = _write_as(as_team, names.requests, "order-1", forged)
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        start = StartRequest("order-1", "sample").encode()
        refused = _write_as(as_team, names.requests, "order-1", start)
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        # The upstream service writes the requests topic, and no wakeup topic.
        up = StartRequest("up-1", "sample").encode()
        assert _write_as(as_upstream, names.requests, "up-1", up) is None
        refused = _write_as(as_upstream, names.wakeup("t0"), "order-1", b"{}")
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
        refused = _write_as(as_upstream, team_topic, "2", orjson.dumps({"order_id": "2"}))
        assert refused is not None and refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

        # Ductor's principal runs everything with the recipe's ACLs alone.
        created = run_ductor(
            settings, "triggers", "create", "orders-in", "--topic", team_topic,
            "--workflow", "sample", "--run-id", "$.order_id", "--run-id-prefix", "order-",
            "--from-beginning",
        )  # fmt: skip
        assert created.returncode == 0, created.stderr
        as_ductor = _through_sasl(settings, kafka, ductor)
        processor = spawn(["process"], as_ductor, "processor")
        worker = spawn(["worker", "--threads", "2"], as_ductor, "worker")
        wait_for(
            lambda: (
                processor.running()
                and worker.running()
                and run_statuses(pg, ["order-1", "up-1"])
                == {"order-1": "succeeded", "up-1": "succeeded"}
            ),
            120,
            "the team's order and the upstream's start to succeed",
            interval=0.25,
        )
        assert processor.terminate() == 0
        assert worker.terminate() == 0
        stats = processor.final_stats()
        assert not stats["errors"], stats
        signals = pg.execute("SELECT count(*) FROM eec_run_signal").fetchone()
        assert signals == (0,), "a forged cancel reached a run"
    finally:
        for future in admin.delete_topics([team_topic]).values():
            future.result(30)
