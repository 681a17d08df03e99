"""A task a worker has no function for goes to a worker that has (core/handback.py decides,
worker/handback.py does it), without Kafka or Postgres."""

from __future__ import annotations

import time
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import KafkaError

from processor.cli.workers import unserved_lines
from processor.core.handback import (
    GRACE_S,
    HANDBACK_HEADER,
    RunHere,
    SendTo,
    Server,
    Wait,
    handback_value,
    parse_handback,
    route,
    task_hash,
)
from processor.core.routing import TopicNames
from processor.core.step_task import decode_step_task, encode_task
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.configs import worker_consumer_config
from processor.io.kafka.delivery import Delivery
from processor.io.postgres.worker_registry import Directory, LiveWorker
from processor.worker.handback import Foreign, Handback
from processor.worker.static_join import StaticJoin
from processor.worker.stats import WorkerStats

from .fakes import FakeMessage

TOPIC = "ductor.steps"
NAMES = TopicNames("ductor")


def server(
    instance_id: str,
    types: tuple[str, ...] = ("load",),
    partitions: dict[str, tuple[int, ...]] | None = None,
    live: bool = True,
    queues: tuple[str, ...] = ("default",),
) -> Server:
    held = {TOPIC: (0, 1)} if partitions is None else partitions
    return Server(instance_id, frozenset(queues), frozenset(types), held, live)


def go(servers: list[Server], waited_s: float = 0.0, task: int = 7) -> Any:
    return route(servers, "me", "default", "load", TOPIC, task, waited_s)


# -- where (core) ----------------------------------------------------------------------------


def test_a_task_goes_to_a_partition_of_a_live_worker_that_has_its_type() -> None:
    servers = [
        server("me", partitions={TOPIC: (5, 6)}),  # itself never
        server("other-types", types=("price",), partitions={TOPIC: (2, 3)}),
        server("other-queue", queues=("reports",), partitions={TOPIC: (4,)}),
        server("has-it", partitions={TOPIC: (0, 1)}),
    ]
    decisions = {go(servers, task=t) for t in range(20)}
    assert decisions == {SendTo(0, "has-it"), SendTo(1, "has-it")}  # spread over both


def test_the_partition_follows_the_tasks_own_hash() -> None:
    servers = [server("a", partitions={TOPIC: (0,)}), server("b", partitions={TOPIC: (3,)})]
    h = task_hash("run-1", "load", 1)
    assert go(servers, task=h) == go(list(reversed(servers)), task=h)
    assert task_hash("run-1", "load", 1) != task_hash("run-1", "load", 2)


def test_a_worker_with_it_but_no_partition_of_the_topic_is_waited_for_within_the_grace() -> None:
    starting = [server("has-it", partitions={"ductor.steps.default.t0": (0,)})]
    assert isinstance(go(starting), Wait)
    assert isinstance(go(starting, waited_s=GRACE_S), RunHere)


def test_a_worker_seen_lately_but_not_live_is_waited_for_within_the_grace() -> None:
    restarting = [server("has-it", live=False)]
    assert isinstance(go(restarting), Wait)
    late = go(restarting, waited_s=GRACE_S + 1)
    assert isinstance(late, RunHere) and "held a partition" in late.why


def test_without_a_worker_that_has_it_the_task_runs_here() -> None:
    decision = go([server("other", types=("price",))])
    assert isinstance(decision, RunHere)
    assert "'load'" in decision.why and "'default'" in decision.why
    assert isinstance(go([]), RunHere)


def test_the_header_reads_back_and_ignores_what_is_not_its() -> None:
    assert parse_handback(handback_value(3, 1_700_000_000_000)) == (3, 1_700_000_000_000)
    for garbage in (None, b"", b"x", b"1:", b"\xff:1"):
        assert parse_handback(garbage) is None


# -- how (the worker's shell) ----------------------------------------------------------------


class Sent:
    def __init__(self) -> None:
        self.records: list[tuple[str, bytes | None, bytes | None, int | None, Any]] = []
        self.reports: list[Any] = []

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None,
        on_delivery: Any,
        partition: int | None = None,
        headers: Any = None,
    ) -> None:
        self.records.append((topic, value, key, partition, headers))
        self.reports.append(on_delivery)


class Shell:
    """A Handback with a directory set by hand and a sender that keeps what it was given."""

    def __init__(self) -> None:
        self.sent = Sent()
        self.directory = Directory("g", 5.0)
        self.done: list[tuple[tuple[str, int], int]] = []
        self.here: list[Foreign] = []
        self.stats = WorkerStats()
        self.counts = self.stats.handed_back
        self.skipped = self.stats.skipped
        self.handback = Handback(
            NAMES,
            ("default",),
            "me",
            self.directory,
            Delivery(self.sent, Counter()),
            lambda tp, offset: self.done.append((tp, offset)),
            self.here.append,
            self.stats,
        )

    def show(self, *servers: Server) -> None:
        self.directory._servers = list(servers)
        self.directory.version += 1

    def take(self, offset: int = 4, headers: list[Any] | None = None, ahead_s: int = 60) -> None:
        value = encode_task(
            "run-1", "load", 1, "load", int(time.time() * 1000) + ahead_s * 1000, "t1", (), None
        )
        message = FakeMessage(TOPIC, offset, value, 2, b"run-1:1", headers or [])
        step = decode_step_task(value)
        self.handback.take(message, (TOPIC, 2), offset, step, [], None)  # type: ignore[arg-type]


def test_a_task_is_produced_again_to_a_worker_that_has_it_and_passes_once_delivered() -> None:
    shell = Shell()
    shell.show(server("has-it", partitions={TOPIC: (0,)}))
    shell.take(headers=[("traceparent", b"00-abc")])
    [(topic, value, key, partition, headers)] = shell.sent.records
    assert (topic, key, partition) == (TOPIC, b"run-1:1", 0)
    assert value is not None and b'"step_type":"load"' in value
    assert headers[0] == ("traceparent", b"00-abc")
    assert headers[1][0] == HANDBACK_HEADER and headers[1][1].startswith(b"1:")
    assert shell.done == []  # not before the broker has the copy
    shell.sent.reports[0](None, None)
    assert shell.done == [((TOPIC, 2), 4)]
    assert shell.counts == Counter({"load": 1})


def test_a_task_waits_for_the_directory_and_for_a_worker_that_starts() -> None:
    shell = Shell()
    shell.take()  # the directory was never read: it waits
    assert shell.handback.waiting == 1 and shell.sent.records == []
    shell.show(server("has-it", partitions={}))  # starting: no partition yet
    shell.handback.turn()
    assert shell.handback.waiting == 1 and shell.sent.records == []
    shell.show(server("has-it", partitions={TOPIC: (1,)}))
    shell.handback.turn()
    assert shell.handback.waiting == 0 and shell.sent.records[0][3] == 1


def test_a_task_handed_back_already_waits_for_a_directory_read_after_it_came() -> None:
    shell = Shell()
    shell.show(server("has-it", partitions={TOPIC: (1,)}))
    first_ms = int(time.time() * 1000) - 1000
    shell.take(headers=[(HANDBACK_HEADER, handback_value(2, first_ms))])
    assert shell.sent.records == [] and shell.handback.waiting == 1
    shell.show(server("has-it", partitions={TOPIC: (1,)}))
    shell.handback.turn()
    [(_t, _v, _k, _p, headers)] = shell.sent.records
    assert headers[-1] == (HANDBACK_HEADER, handback_value(3, first_ms))


def test_without_a_worker_that_has_it_the_task_runs_here_and_a_stale_one_passes() -> None:
    shell = Shell()
    shell.show(server("other", types=("price",)))
    shell.take()
    assert [f.step.step_type for f in shell.here] == ["load"] and shell.sent.records == []
    shell.take(offset=5, ahead_s=-1)
    assert shell.done == [((TOPIC, 2), 5)] and shell.skipped["deadline"] == 1


def test_waiting_tasks_go_with_their_partition_and_when_the_worker_stops() -> None:
    shell = Shell()
    shell.take(offset=1)
    shell.handback.releasing({(TOPIC, 2)})
    assert shell.handback.waiting == 0
    shell.take(offset=2)
    shell.handback.stop()
    assert shell.handback.waiting == 0 and shell.done == []


# -- a named worker's membership -------------------------------------------------------------


def test_a_named_worker_is_a_static_member_with_the_workers_session() -> None:
    named = worker_consumer_config(Settings(worker_name="w-1"), "c")
    assert named["group.instance.id"] == "w-1"
    assert "group.instance.id" not in worker_consumer_config(Settings(), "c")
    classic = worker_consumer_config(
        Settings(group_protocol="classic", worker_session_timeout_ms=6000), "c"
    )
    assert (classic["session.timeout.ms"], classic["heartbeat.interval.ms"]) == (6000, 1000)
    short = worker_consumer_config(
        Settings(group_protocol="classic", worker_session_timeout_ms=1500), "c"
    )
    assert short["heartbeat.interval.ms"] == 500


@pytest.mark.parametrize(
    ("error", "refused"),
    [
        (KafkaError(KafkaError.UNRELEASED_INSTANCE_ID), True),
        (
            KafkaError(
                KafkaError._FATAL,
                "Fatal error: Broker: The instance ID is still used by another member in the"
                " consumer group: ConsumerGroupHeartbeat fatal error",
            ),
            True,
        ),
        (KafkaError(KafkaError.FENCED_INSTANCE_ID), False),
        (KafkaError(KafkaError._FATAL, "Fatal error: Broker: Fenced instance id"), False),
    ],
)
def test_a_refused_name_is_told_from_other_fatal_errors(error: KafkaError, refused: bool) -> None:
    assert StaticJoin.is_refusal(error) is refused


def test_a_refused_name_is_joined_again_each_second() -> None:
    join = StaticJoin("w-1")
    join.refused(100.0)
    join.refused(100.2)  # the same refusal, reported twice
    assert not join.due(100.5)
    assert join.due(101.0)
    assert not join.due(101.1)  # once per refusal
    join.joined()
    assert join.refused_since is None


# -- what `workflows register` and `start` warn about ----------------------------------------


def _worker(queues: tuple[str, ...], types: tuple[str, ...]) -> LiveWorker:
    at = datetime(2026, 1, 1, tzinfo=UTC)
    return LiveWorker("w", None, "h", 1, queues, types, 4, "0.1.0", None, {}, at, at)


def test_a_step_type_no_live_worker_serves_on_its_queue_is_warned_about() -> None:
    wf = parse_workflow(
        {
            "name": "orders",
            "version": 2,
            "steps": [
                {"name": "load", "type": "load"},
                {"name": "price", "type": "price", "depends_on": ["load"]},
                {"name": "report", "type": "render", "queue": "reports"},
                {"name": "approval", "kind": "wait", "signal": "approve"},
            ],
        }
    )
    assert unserved_lines([wf], [_worker(("default",), ("load", "price", "render"))]) == [
        "warning: workflow orders v2: no live worker has step type 'render' on queue"
        " 'reports': its tasks wait until a worker of the queue runs (`ductor workers` lists"
        " what the live workers serve)"
    ]
    [line] = unserved_lines(
        [wf], [_worker(("default", "reports"), ("load", "render")), _worker((), ())]
    )
    assert "'price' on queue 'default': its attempts fail on the queue's workers" in line
    assert line.endswith("; 1 live worker(s) of an older version do not say what they serve)")
    assert (
        unserved_lines([wf], [_worker(("default", "reports"), ("load", "price", "render"))]) == []
    )
