"""Where a worker's tasks come from: its consumer of the queues' steps topics, the records read
ahead of the tasks in hand (the backlog), and the offsets, which advance through a tracker that
never passes an unfinished task (core/offsets.py).

A record is tracked from the moment it is read. The partitions are paused only when the
backlog is full (``Backlog``), and resumed once it is down to half: librdkafka drops what it
prefetched for a paused partition, and a resumed partition's records come again only 0.75 to
1 s later (its fetcher takes the resume up on its own schedule: measured with librdkafka 2.16,
whatever the fetch settings), so what is left must cover that second. Pausing whenever the
slots were full (every few tasks, under load) cost more time than the tasks did; a backlog of
2,000 resumed at a quarter stalled a burst of 8,000 runs four times, for 0.4 of the runs/s.
Paused or not, the consumer is polled every turn, so the group never takes the worker for dead.

A queue's tasks come on one steps topic per tier (core/routing.py): the backlog hands out the
top tier's first, and a backlog full of lower tiers' tasks pauses only their partitions, so a
flood of bulk runs never holds an interactive run's task behind it (its own line has the whole
bound). A task already running holds its slot: a tier is served first, never preempted.

A worker that has read nothing for ``DUCTOR_GROUP_STALL_S`` looks at its group as the broker
sees it (io/kafka/group_watch.py) and joins again with a new consumer if tasks wait that it holds or
was given but does not read.

A worker with a name (``DUCTOR_WORKER_NAME``) is a static member of its group, which the
broker may refuse for a while after a previous process of that name died (static_join.py).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.membership import Holding, Stuck
from processor.core.offsets import OffsetTracker
from processor.core.shapes import TopicPartition
from processor.io.config.settings import Settings
from processor.io.kafka.clients import ClientErrors
from processor.io.kafka.configs import worker_consumer_config
from processor.io.kafka.group_watch import GroupWatch, holding, let_go_by_fault
from processor.io.kafka.logs import with_logger
from processor.io.kafka.offsets import (
    commit_offsets,
    leave_group,
    positions_to_commit,
    read_finished,
    store_offsets,
)
from processor.io.runtime.faults import NO_FAULTS, Faults
from processor.worker.backlog import Backlog
from processor.worker.static_join import StaticJoin

log = logging.getLogger("ductor.worker")


_MOST_PER_CONSUME = 500


class TaskSource:
    def __init__(
        self,
        settings: Settings,
        client_id: str,
        errors: Counter[str],
        releasing: Callable[[set[TopicPartition], bool], None],
        skipped: Counter[str],
        client_errors: ClientErrors,
        faults: Faults = NO_FAULTS,
        rank: Callable[[str], int] = lambda _topic: 1,
    ) -> None:
        """``releasing(tps, commit)`` is called when partitions go, before their offsets are
        committed (``commit``: a revocation; else lost): the worker lets their tasks go.
        ``skipped["done_before"]`` counts records the previous owner had finished.
        ``rank``: a steps topic's tier, 0 first (its tasks are handed out before others)."""
        self._settings = settings
        self._client_id = client_id
        self._group = settings.worker_group_id
        self._errors = errors
        self._skipped = skipped
        self._releasing = releasing
        self._faults = faults
        self._client_errors = client_errors
        self._static = StaticJoin(settings.worker_name) if settings.worker_name else None
        self._consumer = self._new_consumer()
        self.tracker = OffsetTracker()
        self.assigned: set[TopicPartition] = set()
        self.assignments = 0  # changes of ``assigned`` so far
        self.paused = False  # every partition is paused (the worker stops, or all is full)
        self._paused: set[TopicPartition] = set()  # the partitions paused now
        self._rank = rank
        self._backlog = Backlog(rank)
        self._topics: list[str] = []
        self._watch: GroupWatch | None = None
        self._read = False  # a record came since the last turn's look at the group
        self._leaving = False  # the worker left: the close's callbacks find nothing to do

    def _new_consumer(self) -> Consumer:
        # Offsets are stored once a task's result is recorded and its wakeup acknowledged (the
        # tracker's order); auto-commit ships them.
        config = {
            **worker_consumer_config(self._settings, self._client_id),
            "error_cb": self._client_error,
        }
        # A named worker's consumers share one log: the broker's refusal of the name is said
        # by the worker (StaticJoin), not as a critical line of each consumer that tries.
        return Consumer(with_logger(config, self._static.client_log if self._static else None))

    def _client_error(self, error: KafkaError) -> None:
        if self._static is not None and StaticJoin.is_refusal(error):
            self._static.refused(time.monotonic())
        else:
            self._client_errors(error)

    def subscribe(self, partitions: Mapping[str, int]) -> None:
        """Join the group for these topics (topic: partition count)."""
        self._topics = list(partitions)
        self._watch = GroupWatch(
            self._settings,
            self._group,
            partitions,
            self._settings.group_stall_s,
            time.monotonic(),
            self._faults,
        )
        self._subscribe()

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            self._topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def keep_in_group(self, now: float) -> Stuck | None:
        """Once a turn: if the worker has read nothing for a while and the group shows it
        stuck (io/kafka/group_watch.py), join again with a new consumer; returns what was wrong."""
        if self._static is not None and self._static.due(now):
            self._join_with_name()
        if self._watch is None:
            return None
        read, self._read = self._read, False
        stuck = self._watch.turn(now, read, self._holding)
        if stuck is not None:
            self._watch.joined_again(now, self._join_again(stuck))
        return stuck

    def _holding(self) -> Holding:
        held = set(self.assigned)
        return holding(self._consumer, held, held - self._paused)

    def _join_again(self, stuck: Stuck) -> Consumer:
        """Give back what is held, as on a revocation, and join with a new consumer; returns
        the old one, to be closed in the background."""
        log.warning(
            "joining the group again",
            extra={"instance": self._client_id, "reason": stuck.reason, "waiting": stuck.waiting},
        )
        # Everything goes back as on a revocation, but the commit is not waited for: a stuck
        # client's coordinator may not answer. A task redone by the next owner finds its
        # attempt claimed or ended and does not run again (auto-commit had shipped the
        # offsets within 1 s).
        held = {(p.topic, p.partition) for p in self._consumer.assignment()} & self.assigned
        left = self.assigned - held  # (the client had let these go: none of its own)
        for tps, commit in ((held, True), (left, False)):
            if tps:
                self._release([KafkaTopicPartition(t, p) for t, p in tps], commit, wait=False)
        old, self._consumer = self._consumer, self._new_consumer()
        self.paused = False
        self._paused = set()
        self._subscribe()
        return old

    def _join_with_name(self) -> None:
        """Join again with a new consumer: the broker refused the last one this worker's
        name, and that consumer never held a partition (it is closed at once)."""
        old, self._consumer = self._consumer, self._new_consumer()
        self.paused = False
        self._paused = set()
        self._subscribe()
        try:
            old.close()
        except (KafkaException, RuntimeError) as exc:
            log.debug("closing the refused consumer: %s", exc)

    def serve(self) -> None:
        """Serve the consumer's queue before it joins the group (its log lines:
        io/kafka/logs.py); once it has, ``take`` does."""
        self._consumer.poll(0)

    @property
    def backlog(self) -> int:
        return len(self._backlog)

    def take(self, room: int, wait_s: float, reading: bool) -> list[Message]:
        """Up to ``room`` records to make tasks of, from the backlog first; reads more into
        the backlog while it has space and ``reading`` (False: the worker stops), waiting at
        most ``wait_s`` for the first record."""
        taken: list[Message] = []
        while len(taken) < room and self._backlog:
            taken.append(self._backlog.popleft())
        space = self._backlog.space()
        if reading and space > 0:
            for message in self._consume(min(space, _MOST_PER_CONSUME), wait_s):
                self._read = True
                if not self._track(message):
                    continue
                if len(taken) < room:
                    taken.append(message)
                else:
                    self._backlog.append(message)
        else:
            self._consumer.poll(0)  # (paused: serves the group, returns no record)
        if not reading or self._backlog.top_full():
            self._pause(True)
        elif self._backlog.full():
            self._pause(True, keep_top=True)  # a bulk backlog never holds interactive tasks
        elif self._backlog.low():
            self._pause(False)
        return taken

    def done(self, tp: TopicPartition, offset: int) -> None:
        """A task is finished: its offset may be passed (ignored once the partition went)."""
        self.tracker.done(tp, offset)

    def store_offsets(self) -> None:
        store_offsets(self._consumer, self.tracker.committable(), self.assigned)

    def stop_reading(self) -> None:
        """The worker stops: what was read ahead is left to the group."""
        self._backlog.clear()
        self._pause(True)

    def close(self, bound_s: float) -> bool:
        """Leave the group: what is held goes as on a revocation, then the last commit and
        the consumer's close, waited for at most ``bound_s`` (io/kafka/clients.py's leave_group).
        False: left without them (the broker did not answer)."""
        offsets = self._let_go(set(self.assigned), commit=True)
        self._leaving = True
        failure = "final worker offset commit failed: %s"
        left = leave_group(self._consumer, offsets, failure, bound_s)
        if self._watch is not None:
            self._watch.close(2.0)
        return left

    def _consume(self, count: int, wait_s: float) -> list[Message]:
        """Up to ``count`` records, waiting at most ``wait_s`` for the first (a batch consume
        waits for all ``count`` until its timeout: the first comes by poll instead)."""
        if wait_s <= 0:
            return self._consumer.consume(count, 0)
        first = self._consumer.poll(wait_s)
        if first is None:
            return []
        return [first, *self._consumer.consume(count - 1, 0)] if count > 1 else [first]

    def _track(self, message: Message) -> bool:
        """A record read: its offset is held from now on (False: an error, not a record, or
        a record its partition's previous owner finished)."""
        error = message.error()
        if error is not None:
            if self._static is not None and StaticJoin.is_refusal(error):
                self._static.refused(time.monotonic())
            elif error.code() == KafkaError._FATAL:  # the consumer's own, reported so
                self._client_errors.failed(error.str())
            elif error.code() != KafkaError._PARTITION_EOF:
                self._errors["consume"] += 1
                log.error("worker consumer error: %s", error)
            return False
        topic, partition, offset = message.topic(), message.partition(), message.offset()
        assert topic is not None and partition is not None and offset is not None
        if self.tracker.done_before((topic, partition), offset):
            # Its previous owner finished it and committed an offset below it: not again.
            self._skipped["done_before"] += 1
            return False
        self.tracker.started((topic, partition), offset)
        return True

    def _pause(self, pause: bool, keep_top: bool = False) -> None:
        """Pause the partitions (``keep_top``: all but the top tier's), or resume them all."""
        wanted = {tp for tp in self.assigned if not (keep_top and self._rank(tp[0]) == 0)}
        wanted = wanted if pause else set()
        if wanted == self._paused:
            return
        pausing, resuming = wanted - self._paused, self._paused - wanted
        if pausing:
            self._consumer.pause([KafkaTopicPartition(t, p) for t, p in pausing])
        if resuming:
            self._consumer.resume([KafkaTopicPartition(t, p) for t, p in resuming])
        self._paused = wanted
        self.paused = pause and not keep_top

    # -- rebalance --------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        if let_go_by_fault(self._faults, consumer, partitions):
            return
        if self._static is not None and partitions:
            self._static.joined()
        read_finished(consumer, partitions, self.tracker)
        consumer.incremental_assign(partitions)
        self.assigned |= {(p.topic, p.partition) for p in partitions}
        self.assignments += 1
        if self._paused and partitions:
            # Assigned while the backlog is full: paused like the rest of their tier.
            paused = [p for p in partitions if self.paused or self._rank(p.topic) != 0]
            if paused:
                consumer.pause(paused)
                self._paused |= {(p.topic, p.partition) for p in paused}
        log.info(
            "partitions assigned", extra={"count": len(partitions), "instance": self._client_id}
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        if self._ours(consumer):
            self._release(partitions, commit=True)

    def _on_lost(self, consumer: Consumer, partitions: list[KafkaTopicPartition]) -> None:
        if self._ours(consumer):
            self._release(partitions, commit=False)

    def _ours(self, consumer: Consumer) -> bool:
        """Whether a rebalance callback is the member's to act on: not one of a retired
        consumer closing (see RetiredConsumers), nor of the close after the worker left."""
        return consumer is self._consumer and not self._leaving

    def _release(
        self, partitions: list[KafkaTopicPartition], commit: bool, wait: bool = True
    ) -> None:
        """Give partitions back (``_let_go``) and commit what is done (``wait``: for the
        broker's answer)."""
        tps = {(p.topic, p.partition) for p in partitions}
        offsets = self._let_go(tps, commit)
        commit_offsets(self._consumer, offsets, "worker offset commit on revoke failed: %s", wait)

    def _let_go(self, tps: set[TopicPartition], commit: bool) -> list[KafkaTopicPartition]:
        """Partitions go: what was read of them and not taken is the next owner's; the worker
        lets their tasks go. Returns the offsets to commit (``commit``: a revocation; none
        when they were lost)."""
        self._backlog.drop(tps)
        self._releasing(tps, commit)
        offsets = positions_to_commit(self.tracker, tps) if commit else []
        for tp in tps:
            self.tracker.forget(tp)
        self.assigned -= tps
        self.assignments += 1
        self._paused -= tps
        log.info("partitions released", extra={"count": len(tps), "instance": self._client_id})
        return offsets
