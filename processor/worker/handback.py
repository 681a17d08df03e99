"""Tasks a worker has no step function for: handed to a worker that has (core/handback.py says
where), never failed while one is live.

A queue's workers share its partitions whatever functions each has, so a worker deployed with
another app on the same queue (or with other versions of a function: a task runs only with the
version its run pinned, core/versions.py) is handed tasks it cannot run. Such a task is
produced again, as it came (key, value, headers, plus a ``ductor-handback`` header counting its
hand-backs), to a partition of its topic held by a live worker that serves its queue and has
its type (the instance registry: io/postgres/worker_registry.py, read on the presence thread
while hand-backs wait on it). Its offset passes once the broker has the copy: a worker that
dies between the two leaves both, and the second delivery of the attempt finds it claimed or
recorded, as any redelivery. A task waits here (its offset held) while a worker with its type
is starting or restarting, for at most core/handback.py's grace; with no such worker it runs
here and fails as before.

Each hand-back is counted by step type (``ductor_worker_handed_back_total``) and said in a
warning naming the type, once a minute per type at most, and so is each task that runs here
for want of a worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import NamedTuple

from confluent_kafka import Message

from processor.core.handback import (
    HANDBACK_HEADER,
    RunHere,
    SendTo,
    Wait,
    handback_value,
    parse_handback,
    route,
    task_hash,
)
from processor.core.records import Headers, normalise_headers
from processor.core.routing import TopicNames
from processor.core.shapes import TopicPartition
from processor.core.step_task import StepTask
from processor.core.versions import served_key
from processor.io.kafka.delivery import Delivery
from processor.io.postgres.worker_registry import Directory
from processor.worker.stats import WorkerStats

log = logging.getLogger("ductor.worker")


# A line about a step type is said at most this often (with the count since the last one).
_SAY_EVERY_S = 60.0


class Foreign(NamedTuple):
    """A task this worker has no function for, as it came."""

    step: StepTask
    tp: TopicPartition
    offset: int
    key: bytes | None
    value: bytes | None
    headers: Headers  # every header of the record but ours
    context: Headers  # its trace context, for the task if it runs here
    produced_ms: int | None
    hops: int  # hand-backs before this one
    first_ms: int  # when it was first handed back (epoch ms)
    seen: int  # the directory's version when it came: a task handed back already waits for a newer


class Handback:
    def __init__(
        self,
        names: TopicNames,
        queues: tuple[str, ...],
        me: str,
        directory: Directory,
        delivery: Delivery,
        done_offset: Callable[[TopicPartition, int], None],
        run_here: Callable[[Foreign], None],
        stats: WorkerStats,
    ) -> None:
        self._queue_of = {t: q for q in queues for t in names.step_topics(q)}
        self._me = me
        self._directory = directory
        self._delivery = delivery
        self._done_offset = done_offset
        self._run_here = run_here
        self._stats = stats  # (handed_back by step type, skipped, isolated)
        self._waiting: dict[TopicPartition, dict[int, Foreign]] = {}
        self._seen_version = -1  # the directory's version at the last look at the waiting
        self._said: dict[tuple[str, str], tuple[float, int]] = {}

    @property
    def waiting(self) -> int:
        return sum(len(w) for w in self._waiting.values())

    def take(
        self,
        message: Message,
        tp: TopicPartition,
        offset: int,
        step: StepTask,
        context: Headers,
        produced_ms: int | None,
    ) -> None:
        """A task of a step type this worker has no function for."""
        headers: Headers = []
        hops, first_ms = 0, int(time.time() * 1000)
        for name, raw in normalise_headers(message):
            if name != HANDBACK_HEADER:
                headers.append((name, raw))
                continue
            parsed = parse_handback(raw)
            if parsed is not None:
                hops, first_ms = parsed
        foreign = Foreign(
            step,
            tp,
            offset,
            message.key(),
            message.value(),
            headers,
            context,
            produced_ms,
            hops,
            first_ms,
            self._directory.version,
        )
        self._directory.want()
        self._decide(foreign)

    def turn(self) -> None:
        """Once a loop turn: the waiting tasks are routed again when the directory moved."""
        if not self._waiting:
            return
        self._directory.want()
        version = self._directory.version
        if version == self._seen_version:
            return
        self._seen_version = version
        waiting, self._waiting = self._waiting, {}
        for tasks in waiting.values():
            for foreign in tasks.values():
                try:
                    self._decide(foreign)
                except Exception as unforeseen:  # the task's alone, never the loop's
                    self._stats.isolated["handback"] += 1
                    log.error(
                        "handing back a task of run %s failed unexpectedly: it runs here",
                        foreign.step.run_id,
                        exc_info=unforeseen,
                        extra={"run_id": foreign.step.run_id},
                    )
                    self._run_here(foreign)

    def releasing(self, tps: set[TopicPartition]) -> None:
        """Partitions go: their waiting tasks are the next owner's."""
        for tp in tps:
            self._waiting.pop(tp, None)

    def stop(self) -> None:
        """The worker stops: waiting tasks are left to the group (their offsets held)."""
        self._waiting.clear()

    def _decide(self, foreign: Foreign) -> None:
        step = foreign.step
        if time.time() * 1000 >= step.deadline_ms:
            self._stats.skipped["deadline"] += 1  # stale: the coordinator moved on
            self._done_offset(foreign.tp, foreign.offset)
            return
        version = self._directory.version
        if version == 0 or (foreign.hops > 0 and version <= foreign.seen):
            self._wait(foreign)  # (a registry read after it came decides)
            return
        topic = foreign.tp[0]
        queue = self._queue_of.get(topic, "")
        waited_s = max(0.0, time.time() - foreign.first_ms / 1000)
        decision = route(
            self._directory.servers(),
            self._me,
            queue,
            served_key(step.step_type, step.step_version),
            topic,
            task_hash(step.run_id, step.node, step.attempt),
            waited_s,
        )
        if isinstance(decision, SendTo):
            self._send(foreign, decision)
        elif isinstance(decision, Wait):
            self._wait(foreign)
        else:
            assert isinstance(decision, RunHere)
            self._say(
                "run_here",
                served_key(step.step_type, step.step_version),
                "a task of step type %r runs here, where it fails: %s (`ductor workers` lists"
                " what each worker serves)",
                decision.why,
                logging.ERROR,
            )
            self._run_here(foreign)

    def _wait(self, foreign: Foreign) -> None:
        self._waiting.setdefault(foreign.tp, {})[foreign.offset] = foreign

    def _send(self, foreign: Foreign, to: SendTo) -> None:
        step = foreign.step
        hops = handback_value(foreign.hops + 1, foreign.first_ms)
        headers = [*foreign.headers, (HANDBACK_HEADER, hops)]

        def delivered() -> None:
            self._done_offset(foreign.tp, foreign.offset)

        self._delivery.send(
            foreign.tp[0], foreign.value, foreign.key, to.partition, headers, delivered
        )
        key = served_key(step.step_type, step.step_version)
        self._stats.handed_back[key] += 1
        self._say(
            "handed_back",
            key,
            "a task of step type %r came to this worker, which has no function for it: handed"
            " back to a worker that has (%s)",
            to.instance_id,
            logging.WARNING,
        )

    def _say(self, kind: str, step_type: str, text: str, detail: str, level: int) -> None:
        """A line about a step type, at most once a minute (with how many since the last)."""
        now = time.monotonic()
        said_at, since = self._said.get((kind, step_type), (-_SAY_EVERY_S, 0))
        if now - said_at < _SAY_EVERY_S:
            self._said[(kind, step_type)] = (said_at, since + 1)
            return
        self._said[(kind, step_type)] = (now, 0)
        log.log(
            level,
            text,
            step_type,
            detail,
            extra={"step_type": step_type, "more_since_last": since},
        )
