"""A consumer's offsets: stored as the records are done (core/offsets.py tracks them),
committed, read back for a partition newly assigned (the finished records after the
committed offset, kept in its metadata), and the group left cleanly."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Set

from confluent_kafka import Consumer, KafkaException
from confluent_kafka import TopicPartition as KafkaTopicPartition

from processor.core.offsets import OffsetTracker, decode_finished
from processor.core.shapes import TopicPartition

log = logging.getLogger("ductor.kafka")

# How long a newly assigned partition's committed offset (and metadata) is waited for.
_COMMITTED_S = 5.0


def store_offsets(
    consumer: Consumer, moved: dict[TopicPartition, int], assigned: Set[TopicPartition]
) -> None:
    """Store the positions the offset tracker moved (``committable()``), for the partitions
    still ``assigned`` (auto-commit then ships them). A partition revoked meanwhile is its
    next owner's: it redoes what was not committed."""
    offsets = [KafkaTopicPartition(t, p, o) for (t, p), o in moved.items() if (t, p) in assigned]
    if offsets:
        try:
            consumer.store_offsets(offsets=offsets)
        except KafkaException as exc:
            log.warning("could not store offsets: %s", exc)


def commit_positions(
    consumer: Consumer,
    tracker: OffsetTracker,
    tps: Iterable[TopicPartition],
    failure: str,
    wait: bool = True,
) -> None:
    """Commit now, for the partitions ``tps`` (given up, or at the end), the tracker's safe
    position (``positions_to_commit``). ``failure`` is logged with the error if the broker
    refuses; ``wait=False`` sends the commit without waiting for it (a member leaving a client
    that may not answer)."""
    commit_offsets(consumer, positions_to_commit(tracker, tps), failure, wait)


def positions_to_commit(
    tracker: OffsetTracker, tps: Iterable[TopicPartition]
) -> list[KafkaTopicPartition]:
    """The tracker's safe position of each of ``tps`` where it has one, with what is done past
    it in the commit's metadata (core/offsets.py): the partitions' next owner does not do those
    records again."""
    offsets = []
    for topic, partition in tps:
        position = tracker.position((topic, partition))
        if position is None:
            continue  # nothing done here: what was committed before stands
        metadata = tracker.commit_metadata((topic, partition), position)
        offsets.append(KafkaTopicPartition(topic, partition, position, metadata=metadata))
    return offsets


def commit_offsets(
    consumer: Consumer, offsets: list[KafkaTopicPartition], failure: str, wait: bool = True
) -> None:
    """Commit ``offsets`` now (``positions_to_commit``); see ``commit_positions``."""
    if not offsets:
        return
    try:
        # Stored too: librdkafka's own commits (auto-commit, and the one it makes on a
        # revocation) ship the stored offsets, and must not drop the metadata.
        consumer.store_offsets(offsets=offsets)
        if wait:
            consumer.commit(offsets=offsets, asynchronous=False)
        else:
            consumer.commit(offsets=offsets, asynchronous=True)
    except KafkaException as exc:
        log.warning(failure, exc)


def leave_group(
    consumer: Consumer, offsets: list[KafkaTopicPartition], failure: str, bound_s: float
) -> bool:
    """A member's last commit of ``offsets`` and its consumer's close, on a thread of their
    own, waited for at most ``bound_s``. With the broker away both wait for its group
    coordinator: a commit behind an auto-commit that cannot reach it, and a close behind any
    commit outstanding, each until its request times out (a worker stopped in a broker outage
    waited past its supervisor's patience; a close alone waited 45 s). A shutdown must not.
    False: the process leaves without them; the partitions' next owner redoes what was done
    since the last commit the broker took (a step task finds its attempt claimed or ended, a
    wakeup a row that moved on). The caller has released what it held and ignores the
    rebalance callbacks the close may still make."""

    def leave() -> None:
        commit_offsets(consumer, offsets, failure)
        try:
            consumer.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("closing the consumer failed: %s", exc)

    leaving = threading.Thread(target=leave, name="ductor-leave-group", daemon=True)
    leaving.start()
    leaving.join(bound_s)
    if leaving.is_alive():
        log.warning(
            "the broker did not take the last offset commit and the leave within %.1f s:"
            " leaving without them (what was done since the last commit it took is redone by"
            " the partitions' next owner)",
            bound_s,
        )
        return False
    return True


def read_finished(
    consumer: Consumer, partitions: list[KafkaTopicPartition], tracker: OffsetTracker
) -> set[TopicPartition] | None:
    """What the previous owners of ``partitions`` committed as done past their offsets, for
    ``tracker`` (bounded: without an answer those records are done again, as before). Returns
    the partitions the group has no offset for (None: not known)."""
    try:
        committed = consumer.committed(
            [KafkaTopicPartition(p.topic, p.partition) for p in partitions], timeout=_COMMITTED_S
        )
    except KafkaException as exc:
        log.warning("could not read the committed offsets of assigned partitions: %s", exc)
        return None
    uncommitted = set()
    for c in committed:
        if c.offset >= 0:
            tracker.learn((c.topic, c.partition), decode_finished(c.offset, c.metadata))
        else:
            uncommitted.add((c.topic, c.partition))
    return uncommitted
