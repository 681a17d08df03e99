"""The processor's membership of its consumer group: the consumer, what reads and steers it
(engine/lag.py, engine/flow_control.py), the rebalance callbacks, the release of partitions
given back, a stuck member's rejoin (io/kafka/group_watch.py) and the leave at shutdown.

Partitions given back (revoked, lost, or held at shutdown) first let the batch in flight and
the request statement finish, bounded, so their outcome is known; their waiting records are
dropped (the next owner redoes them); effects already produced are flushed so their records
count as done; then the offsets are committed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Set

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.flow import TierQueues
from processor.core.membership import Holding, Stuck
from processor.core.offsets import OffsetTracker
from processor.core.records import Inbound
from processor.core.routing import TopicNames
from processor.core.shapes import TopicPartition
from processor.core.stats import Stats
from processor.engine.executor import Executor
from processor.engine.flow_control import FlowControl
from processor.engine.health import Probe
from processor.engine.lag import LagMeter
from processor.engine.request_desk import RequestDesk
from processor.engine.trigger_follow import TriggerFollower
from processor.io.config.settings import Settings
from processor.io.kafka.clients import ClientErrors, Publisher
from processor.io.kafka.configs import consumer_config
from processor.io.kafka.group_watch import GroupWatch, holding, let_go_by_fault
from processor.io.kafka.logs import with_logger
from processor.io.kafka.offsets import (
    commit_positions,
    leave_group,
    positions_to_commit,
    read_finished,
)
from processor.io.runtime.clock import Clock
from processor.io.runtime.faults import Faults

log = logging.getLogger("ductor.processor")

# The last offset commit and the group's leave wait at least this long, whatever is left of
# the shutdown bound: a broker that answers takes them in milliseconds.
_LEAVE_AT_LEAST_S = 2.0


class Membership:
    def __init__(
        self,
        *,
        settings: Settings,
        instance_id: str,
        names: TopicNames,
        clock: Clock,
        client_errors: ClientErrors,
        lag_enabled: bool,
        tracker: OffsetTracker,
        queues: TierQueues[Inbound],
        executor: Executor,
        requests: RequestDesk,
        triggers: TriggerFollower,
        publisher: Publisher,
        probe: Probe,
        stats: Stats,
        faults: Faults,
    ) -> None:
        self._settings = settings
        self._instance_id = instance_id
        self._names = names
        self._monotonic = clock.monotonic
        self._client_errors = client_errors
        self._lag_enabled = lag_enabled
        self._tracker = tracker
        self._queues = queues
        self._executor = executor
        self._requests = requests
        self._triggers = triggers
        self._publisher = publisher
        self._probe = probe
        self._stats = stats
        self._faults = faults
        self.consumer, self.lag, self.flow = self._new_member()
        # Looks at the group when nothing has come for a while (built once the partition
        # counts are read: ``watch``).
        self._group_watch: GroupWatch | None = None
        self.deadline: float | None = None  # the shutdown's bound, once it began
        self._leaving = False  # it left its group: the close's callbacks find nothing to do

    @property
    def assigned(self) -> Set[TopicPartition]:
        return self.flow.assigned

    def lag_now(self) -> Mapping[TopicPartition, int]:
        return self.lag.read()  # (the current member's meter: a new member has its own)

    def watch(self, partitions: Mapping[str, int]) -> None:
        """Start watching the group (the coordinator topics' partition counts are known)."""
        self._group_watch = GroupWatch(
            self._settings,
            self._settings.group_id,
            {t: partitions[t] for t in self._names.coordinator_topics()},
            self._settings.group_stall_s,
            self._monotonic(),
            self._faults,
        )

    def turn(self, now: float, consumed: bool) -> None:
        """Each loop turn: a member found stuck joins the group again."""
        assert self._group_watch is not None
        stuck = self._group_watch.turn(now, consumed, self._holding)
        if stuck is not None:
            self._join_again(stuck, now)

    def _new_member(self) -> tuple[Consumer, LagMeter, FlowControl]:
        """A consumer, not subscribed yet, and what reads and steers it."""
        config = consumer_config(self._settings, self._instance_id)
        consumer = Consumer(with_logger({**config, "error_cb": self._client_errors}))
        lag = LagMeter(consumer, enabled=self._lag_enabled)
        return consumer, lag, FlowControl(consumer, self._names, lag)

    def subscribe(self) -> None:
        self.consumer.subscribe(
            [*self._names.coordinator_topics(), *sorted(self._triggers.by_topic)],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def _holding(self) -> Holding:
        held = set(self.flow.assigned)
        return holding(self.consumer, held, held - self.flow.paused())

    def _join_again(self, stuck: Stuck, now: float) -> None:
        """The member is stuck (io/kafka/group_watch.py): give back what it holds, as on a
        revocation, leave the group, and join it again with a new consumer."""
        log.warning(
            "joining the group again",
            extra={"instance": self._instance_id, "reason": stuck.reason, "waiting": stuck.waiting},
        )
        self._stats.rejoins += 1
        old = self.consumer
        # Everything goes back as on a revocation, but the commit is not waited for: a stuck
        # client's coordinator may not answer. A record redone by the next owner costs a
        # tick that finds its row moved on (auto-commit had shipped the offsets within 1 s).
        held = {(p.topic, p.partition) for p in old.assignment()} & self.flow.assigned
        left = self.flow.assigned - held  # (the client had let these go: none of its own)
        for tps, commit in ((held, True), (left, False)):
            if tps:
                self._release(old, [KafkaTopicPartition(t, p) for t, p in tps], commit, wait=False)
        self.consumer, self.lag, self.flow = self._new_member()
        self.subscribe()
        assert self._group_watch is not None
        self._group_watch.joined_again(now, old)

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        if let_go_by_fault(self._faults, consumer, partitions):
            return
        uncommitted = read_finished(consumer, partitions, self._tracker)
        consumer.incremental_assign([self._triggers.start_at(p, uncommitted) for p in partitions])
        tps = {(p.topic, p.partition) for p in partitions}
        self.flow.assigned_now(tps)
        self._probe.assigned_partitions = len(self.flow.assigned)
        log.info("partitions assigned", extra={"count": len(tps), "instance": self._instance_id})

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        if self._ours(consumer):
            self._release(consumer, partitions, commit=True)

    def _on_lost(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        if self._ours(consumer):
            self._release(consumer, partitions, commit=False)

    def _ours(self, consumer: Consumer) -> bool:
        """Whether a rebalance callback is the instance's to act on: not one of a retired
        consumer closing (see RetiredConsumers), nor of the close after it left."""
        return consumer is self.consumer and not self._leaving

    def wait_bound(self) -> float:
        """How long a rebalance or the shutdown may wait for in-flight work."""
        if self.deadline is not None:
            return max(0.1, self.deadline - self._monotonic())
        return min(10.0, self._settings.shutdown_timeout_s)

    def _release(
        self,
        consumer: Consumer,
        partitions: list[KafkaTopicPartition],
        commit: bool,
        wait: bool = True,
    ) -> None:
        """Give partitions back: drop their waiting records (the next owner redoes them), let
        effects already produced finish so their records count as done, then commit
        (``wait``: for the broker's answer)."""
        tps = {(p.topic, p.partition) for p in partitions}
        # The batch in flight finishes first, so its outcome is known; bounded, because a hung
        # database must not hold a rebalance (or a shutdown) hostage. If it does not finish,
        # its records are simply redone by the partitions' next owner.
        if not self._executor.flush(self.wait_bound()):
            log.error("the batch in flight did not finish before the partitions were released")
        if not self._requests.flush(self.wait_bound()):
            log.error("the request statement in flight did not finish before the release")
        self._requests.drop_partitions(tps)
        self._queues.drop(lambda r: r.tp in tps)
        self._executor.drop_partitions(tps)
        if commit:
            self._publisher.flush(min(5.0, self.wait_bound()))
            failure = "offset commit on revoke failed: %s"
            commit_positions(consumer, self._tracker, tps, failure, wait)
            # Acknowledged outbox rows go now, before the partitions' next owner meets them.
            self._executor.delete_acknowledged(min(5.0, self.wait_bound()))
        for tp in tps:
            self._tracker.forget(tp)
        self.flow.released(tps)
        self._probe.assigned_partitions = len(self.flow.assigned)
        log.info("partitions released", extra={"count": len(tps), "instance": self._instance_id})

    def leave(self) -> None:
        """At shutdown (its work finished or dropped): what is held goes as on a revocation,
        then the last commit and the close, bounded (io/kafka/clients.py's leave_group): the close's
        callbacks have nothing left to do."""
        assert self.deadline is not None
        held = set(self.flow.assigned)
        offsets = positions_to_commit(self._tracker, held)
        for tp in held:
            self._tracker.forget(tp)
        self.flow.released(held)
        self._probe.assigned_partitions = 0
        log.info("partitions released", extra={"count": len(held), "instance": self._instance_id})
        self._leaving = True
        leave_group(
            self.consumer,
            offsets,
            "final offset commit failed: %s",
            max(_LEAVE_AT_LEAST_S, self.deadline - self._monotonic()),
        )
        if self._group_watch is not None:
            self._group_watch.close(max(0.1, min(2.0, self.deadline - self._monotonic())))


__all__ = ["Membership"]
