"""Where a worker's tasks come from: its consumer of the queues' steps topics, the records read
ahead of the tasks in hand (the backlog), and the offsets, which advance through a tracker that
never passes an unfinished task (core/offsets.py).

A record is tracked from the moment it is read. The partitions are paused only when the
backlog is full, and resumed once it is down to a quarter: librdkafka drops what it prefetched
for a paused partition and fetches again only some hundreds of ms after the resume, so pausing
whenever the slots were full (every few tasks, under load) cost more time than the tasks did.
Paused or not, the consumer is polled every turn, so the group never takes the worker for dead.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import Callable

from confluent_kafka import Consumer, KafkaError, Message, TopicPartition

from processor.core.offsets import OffsetTracker
from processor.io.config import Settings
from processor.io.kafka import (
    ClientErrors,
    commit_positions,
    group_protocol_config,
    read_finished,
    store_offsets,
)

log = logging.getLogger("ductor.worker")

TP = tuple[str, int]

# Records read ahead of the tasks in hand; the partitions pause when this many wait.
BACKLOG_LIMIT = 2000
_MOST_PER_CONSUME = 500


class TaskSource:
    def __init__(
        self,
        settings: Settings,
        client_id: str,
        errors: Counter[str],
        releasing: Callable[[set[TP], bool], None],
        skipped: Counter[str],
        client_errors: ClientErrors,
    ) -> None:
        """``releasing(tps, commit)`` is called when partitions go, before their offsets are
        committed (``commit``: a revocation; else lost): the worker lets their tasks go.
        ``skipped["done_before"]`` counts records the previous owner had finished."""
        self._client_id = client_id
        self._errors = errors
        self._skipped = skipped
        self._releasing = releasing
        self._consumer = Consumer(
            {
                **settings.kafka_common(),
                "client.id": client_id,
                "group.id": f"{settings.group_id}-workers",
                **group_protocol_config(settings),
                "auto.offset.reset": "earliest",
                # Offsets are stored once a task's result is recorded and its wakeup
                # acknowledged (the tracker's order); auto-commit ships them.
                "enable.auto.offset.store": False,
                "enable.auto.commit": True,
                "auto.commit.interval.ms": 1000,
                # What librdkafka prefetches beside the worker's own backlog.
                "queued.max.messages.kbytes": 4096,
                "enable.partition.eof": False,
                "error_cb": client_errors,
            }
        )
        self._client_errors = client_errors
        self.tracker = OffsetTracker()
        self.assigned: set[TP] = set()
        self.paused = False
        self._backlog: deque[Message] = deque()

    def subscribe(self, topics: list[str]) -> None:
        self._consumer.subscribe(
            topics, on_assign=self._on_assign, on_revoke=self._on_revoke, on_lost=self._on_lost
        )

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
        space = BACKLOG_LIMIT - len(self._backlog)
        if reading and space > 0:
            for message in self._consume(min(space, _MOST_PER_CONSUME), wait_s):
                if not self._track(message):
                    continue
                if len(taken) < room:
                    taken.append(message)
                else:
                    self._backlog.append(message)
        else:
            self._consumer.poll(0)  # (paused: serves the group, returns no record)
        if len(self._backlog) >= BACKLOG_LIMIT or not reading:
            self._pause(True)
        elif len(self._backlog) <= BACKLOG_LIMIT // 4:
            self._pause(False)
        return taken

    def done(self, tp: TP, offset: int) -> None:
        """A task is finished: its offset may be passed (ignored once the partition went)."""
        self.tracker.done(tp, offset)

    def store_offsets(self) -> None:
        store_offsets(self._consumer, self.tracker.committable(), self.assigned)

    def stop_reading(self) -> None:
        """The worker stops: what was read ahead is left to the group."""
        self._backlog.clear()
        self._pause(True)

    def close(self) -> None:
        self._commit(self.assigned, "final worker offset commit failed: %s")
        self._consumer.close()

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
            if error.code() == KafkaError._FATAL:  # the consumer's own, reported so
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

    def _pause(self, pause: bool) -> None:
        if pause == self.paused:
            return
        partitions = [TopicPartition(t, p) for t, p in self.assigned]
        if partitions:
            (self._consumer.pause if pause else self._consumer.resume)(partitions)
        self.paused = pause

    def _commit(self, tps: set[TP], failure: str) -> None:
        commit_positions(self._consumer, self.tracker, tps, failure)

    # -- rebalance --------------------------------------------------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        read_finished(consumer, partitions, self.tracker)
        consumer.incremental_assign(partitions)
        self.assigned |= {(p.topic, p.partition) for p in partitions}
        if self.paused and partitions:
            consumer.pause(partitions)
        log.info(
            "partitions assigned", extra={"count": len(partitions), "instance": self._client_id}
        )

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(partitions, commit=True)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release(partitions, commit=False)

    def _release(self, partitions: list[TopicPartition], commit: bool) -> None:
        """Give partitions back: what was read of them and not taken is the next owner's;
        the worker lets their tasks go; what is done is committed."""
        tps = {(p.topic, p.partition) for p in partitions}
        self._backlog = deque(m for m in self._backlog if (m.topic(), m.partition()) not in tps)
        self._releasing(tps, commit)
        if commit:
            self._commit(tps, "worker offset commit on revoke failed: %s")
        for tp in tps:
            self.tracker.forget(tp)
        self.assigned -= tps
        log.info("partitions released", extra={"count": len(tps), "instance": self._client_id})
