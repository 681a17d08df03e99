"""The shell of core/membership.py: a look at a consumer group as the broker sees it, taken
with an admin client's futures so the loop never waits for it, and the watch that takes one
when a member has read nothing for a while and says when it should join its group again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Set
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec  # type: ignore[attr-defined]

from processor.core.membership import GroupView, Holding, IdleWatch, Stuck, judge
from processor.core.shapes import TopicPartition
from processor.io.config.settings import Settings
from processor.io.kafka.configs import admin_config, reader_config
from processor.io.kafka.logs import with_logger
from processor.io.runtime.faults import Faults, Point

log = logging.getLogger("ductor.kafka")

# librdkafka 2.16 aborts the process (rd_kafka_enq_once_del_source_return: eonce->refcnt > 0)
# when a group coordinator request (DescribeGroups, OffsetFetch) waits for a broker that is
# down, times out, and the broker comes back: an idle worker's look during the broker-outage
# test did, and a script reproduces it with a 5 s timeout. So a look goes out only when the
# broker has just answered a metadata request (``_BROKER_CHECK_S``, the only wait on the
# loop thread, once per quiet time), and its requests may wait long rather than time out;
# no other look starts while one waits. And an admin client's OffsetFetch that is answered
# NOT_COORDINATOR (the group's coordinator moved: a broker of a cluster restarted) crashes the
# process outright (SIGSEGV in librdkafka's main thread: its handler hands the error to the
# client's consumer group, which an admin client does not have; a script spamming the request
# while the brokers restart in turn crashed all three of its processes, the processor and the
# worker of the rolling-restart test both died of it). So the committed offsets are read by a
# consumer that carries the group's id and joins nothing (``CommittedReader``), on a thread of
# its own: it answers NOT_COORDINATOR as an error.
_LOOK_TIMEOUT_S = 300.0
# A stuck verdict is acted on only if a look this long after still finds the member stuck
# (or after the quiet time, if shorter): a group settling after a rebalance or a broker
# restart looks stuck for a moment.
_CONFIRM_S = 5.0
# A read of the committed offsets may fail and be asked again at the next look: no crash.
_COMMITTED_TIMEOUT_S = 10.0
_BROKER_CHECK_S = 0.5
# (confluent-kafka's OffsetSpec is untyped)
_EARLIEST: Any = OffsetSpec.earliest()  # type: ignore[no-untyped-call]
_LATEST: Any = OffsetSpec.latest()  # type: ignore[no-untyped-call]


def holding(consumer: Consumer, held: Set[TopicPartition], reading: Set[TopicPartition]) -> Holding:
    """What a member holds, as its client says: ``held``, of which it reads ``reading``, with
    its fetch position in each it reads (read only when a look is in)."""
    positions = consumer.position([KafkaTopicPartition(t, p) for t, p in reading])
    return Holding(
        consumer.memberid() or "",
        held,
        reading,
        {(tp.topic, tp.partition): tp.offset for tp in positions},
    )


def let_go_by_fault(
    faults: Faults, consumer: Consumer, partitions: list[KafkaTopicPartition]
) -> bool:
    """Tests only (``assigned=ignore``, io/runtime/faults.py): the member takes its assignment and
    lets it go at once, unknown to the group, as the stuck member was seen to. True: it did."""
    if not faults.forces(Point.ASSIGNED, partitions):
        return False
    consumer.incremental_assign(partitions)
    consumer.incremental_unassign(partitions)
    log.warning("TEST ONLY: an assignment of %d partition(s) ignored", len(partitions))
    return True


# How long a forced ``retiring`` fault holds a retired consumer's close (tests only).
RETIRING_HANG_S = 9.0
# How long the watch waits for a retired consumer to close before it may judge again: past
# the broker's session timeouts (10 s classic here, 45 s by default with the consumer
# protocol), after which the broker has let its member go even if it never closes.
_HOLD_OFF_S = 60.0


class RetiredConsumers:
    """The consumers a member stopped using when it joined its group again, each closed on a
    thread of its own. A stuck member's client may wait on a group coordinator that does not
    answer (seen after a broker restart: its revocation's commit waited 45 s and failed, then
    its close hung as long again, and the member's loop with it, so nothing was read and the
    liveness probe failed); the member's new client must not wait behind it. The old client's
    rebalance callbacks run on that thread: the member's callbacks ignore a consumer that is
    no longer its own (what it held was released when it retired)."""

    def __init__(self, faults: Faults) -> None:
        self._faults = faults
        self._closing: list[threading.Thread] = []
        self._last_at = 0.0

    def retire(self, consumer: Consumer, now: float) -> None:
        thread = threading.Thread(
            target=self._close, args=(consumer,), name="ductor-retired-consumer", daemon=True
        )
        thread.start()
        self._closing = [t for t in self._closing if t.is_alive()] + [thread]
        self._last_at = now

    def closing(self, now: float) -> bool:
        """Whether the last one retired is still closing, for at most ``_HOLD_OFF_S``: the
        broker counts its partitions as its own until it is gone (or its session ends)."""
        return now - self._last_at < _HOLD_OFF_S and any(t.is_alive() for t in self._closing)

    def _close(self, consumer: Consumer) -> None:
        if self._faults.forces(Point.RETIRING):
            log.warning("TEST ONLY: a retired consumer's close hangs %.0f s", RETIRING_HANG_S)
            time.sleep(RETIRING_HANG_S)
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer left behind failed: %s", exc)
        log.info("the consumer left behind is closed")

    def wait(self, timeout_s: float) -> bool:
        """At shutdown: whether every retired consumer closed within ``timeout_s`` (one still
        closing is abandoned: the process exits, and the broker lets its member go)."""
        deadline = time.monotonic() + timeout_s
        for thread in self._closing:
            thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in self._closing)


class CommittedReader:
    """A group's committed offsets, read by a consumer that carries the group's id and never
    subscribes (so it joins nothing), one read at a time on a thread of its own: the loop
    never waits for it (see ``_LOOK_TIMEOUT_S`` for why not an admin client)."""

    def __init__(self, settings: Settings, group: str) -> None:
        self._reader = Consumer(
            with_logger(reader_config(settings, f"{group}-watch-offsets", group))
        )
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="ductor-group-offsets")
        self._reading: Future[list[KafkaTopicPartition]] | None = None

    def read(self, tps: list[KafkaTopicPartition]) -> Future[list[KafkaTopicPartition]]:
        self._reading = self._thread.submit(
            self._reader.committed, tps, timeout=_COMMITTED_TIMEOUT_S
        )
        return self._reading

    def close(self) -> None:
        """Closed unless a read is still out (then left to the process's exit: closing a
        client another thread is using is not safe)."""
        self._thread.shutdown(wait=False)
        if self._reading is None or self._reading.done():
            self._reader.close()


class GroupLook:
    """One look at ``group``'s committed offsets, its partitions' start and end offsets and
    its members' assignments, for the partitions of ``partitions`` (topic: count). Requests go
    out at construction; ``view()`` is None until every answer is in."""

    def __init__(
        self,
        admin: AdminClient,
        committed: CommittedReader,
        group: str,
        partitions: Mapping[str, int],
        now: float,
    ) -> None:
        self.started_at = now
        tps = [KafkaTopicPartition(t, p) for t, count in partitions.items() for p in range(count)]
        timeout = {"request_timeout": _LOOK_TIMEOUT_S}
        self._topics = set(partitions)
        self._committed = committed.read(tps)
        self._starts = admin.list_offsets(dict.fromkeys(tps, _EARLIEST), **timeout)
        self._ends = admin.list_offsets(dict.fromkeys(tps, _LATEST), **timeout)
        self._members = admin.describe_consumer_groups([group], **timeout)[group]

    def _futures(self) -> list[Future[Any]]:
        return [self._committed, self._members, *self._starts.values(), *self._ends.values()]

    def done(self) -> bool:
        return all(f.done() for f in self._futures())

    def view(self) -> GroupView:
        """The answers (once ``done``); KafkaException if the broker refused one."""
        ends = {(tp.topic, tp.partition): f.result().offset for tp, f in self._ends.items()}
        committed = {(tp.topic, tp.partition): f.result().offset for tp, f in self._starts.items()}
        for tp in self._committed.result():
            if tp.offset >= 0:  # else never committed: from the start, as the consumer reads
                committed[(tp.topic, tp.partition)] = tp.offset
        owners: dict[TopicPartition, str] = {}
        targets: dict[TopicPartition, str] = {}
        for member in self._members.result().members:
            for given, assignment in (
                (owners, member.assignment),
                (targets, member.target_assignment),
            ):
                for tp in assignment.topic_partitions if assignment is not None else ():
                    if tp.topic in self._topics:
                        given[(tp.topic, tp.partition)] = member.member_id
        return GroupView(committed, ends, owners, targets)


class GroupWatch:
    """Fed every loop turn; after ``quiet_s`` without a record it looks at the group (in the
    background) and, if the look shows this member stuck (core/membership.py) and a second
    look ``confirm_s`` later still does, returns what is wrong: the caller joins its group
    again with a new client. ``quiet_s`` 0 turns it off."""

    def __init__(
        self,
        settings: Settings,
        group: str,
        partitions: Mapping[str, int],
        quiet_s: float,
        now: float,
        faults: Faults,
    ) -> None:
        self._settings = settings
        self._retired = RetiredConsumers(faults)
        self._group = group
        self._partitions = dict(partitions)
        self._idle = IdleWatch(quiet_s, now) if quiet_s > 0 else None
        self._admin: AdminClient | None = None
        self._committed: CommittedReader | None = None
        self._look: GroupLook | None = None
        self._stale = False  # records came while the look was out
        self._confirm_s = min(_CONFIRM_S, quiet_s)
        self._suspect_since: float | None = None  # a look found it stuck: confirm at +confirm_s

    def turn(self, now: float, took: bool, holding: Callable[[], Holding]) -> Stuck | None:
        """One loop turn (``took``: a record came). ``holding`` is read only when a look is
        in, so the turns in between cost a comparison."""
        if self._idle is None:
            return None
        if self._retired.closing(now):
            self._idle.looked(now)  # a full quiet time once it is gone
            return None  # the group still counts the old client's partitions as its own
        if self._admin is not None and not took:
            self._admin.poll(0)  # its log lines (io/kafka/logs.py), on the quiet turns only
        if self._look is None:
            self._maybe_look(now, took)
            return None
        if took:
            self._idle.turn(now, took)
            self._stale = True  # records came: what the look says is out of date
        if not self._look.done():
            return None  # it waits for the broker (see _LOOK_TIMEOUT_S); no other starts
        return self._judge(now, holding)

    def _maybe_look(self, now: float, took: bool) -> None:
        """Start a look when one is due: the idle time passed, or a suspicion is to confirm."""
        assert self._idle is not None
        if took:
            self._suspect_since = None
        suspect = self._suspect_since
        due = (
            now - suspect >= self._confirm_s if suspect is not None else self._idle.turn(now, took)
        )
        if due:
            self._idle.looked(now)
            self._look = self._start(now)
            self._stale = False
            if self._look is None:
                self._suspect_since = None  # the broker did not answer: not confirmed

    def _judge(self, now: float, holding: Callable[[], Holding]) -> Stuck | None:
        """What the finished look says: stuck once confirmed by a second look."""
        assert self._look is not None and self._idle is not None
        look, self._look = self._look, None
        confirming, self._suspect_since = self._suspect_since, None
        if self._stale:
            return None
        self._idle.looked(now)
        try:
            stuck = judge(look.view(), holding())
        except KafkaException as exc:
            log.debug("could not look at group %s: %s", self._group, exc)
            return None
        if stuck is None or confirming is not None:
            return stuck
        self._suspect_since = now  # a second look, confirm_s from now, decides
        log.info(
            "the group looks stuck for this member; looking again in %.0f s: %s",
            self._confirm_s,
            stuck.reason,
        )
        return None

    def joined_again(self, now: float, old: Consumer) -> None:
        """The caller joined again with a new client: ``old`` is closed in the background,
        and the next look is a full quiet time after it is gone."""
        self._retired.retire(old, now)
        if self._idle is not None:
            self._idle.looked(now)

    def close(self, timeout_s: float) -> None:
        """At shutdown: wait a little for the clients left behind to close."""
        if self._committed is not None:
            self._committed.close()
        if not self._retired.wait(timeout_s):
            log.warning("a consumer left behind by joining the group again is still closing")

    def _start(self, now: float) -> GroupLook | None:
        if self._admin is None or self._committed is None:
            self._admin = AdminClient(
                with_logger(admin_config(self._settings, f"{self._group}-watch"))
            )
            self._committed = CommittedReader(self._settings, self._group)
        try:
            self._admin.list_topics(timeout=_BROKER_CHECK_S)  # (see _LOOK_TIMEOUT_S)
            return GroupLook(self._admin, self._committed, self._group, self._partitions, now)
        except KafkaException as exc:
            log.debug("could not look at group %s: %s", self._group, exc)
            return None
