"""Where a task goes that reached a worker without its step function (the shell:
worker/handback.py).

A queue's workers share its steps topics' partitions, whatever functions each has: a worker
deployed with another app on the same queue is handed tasks it cannot run, and so is one
without the version of a function a task's run pinned (core/versions.py). A step type here is
what a worker serves of it, the served key: the type for version 1, ``type@N`` for version N.
It does not fail them; it passes each to a partition held by a live worker that serves the
task's queue and has its step type, as the instance registry says (each worker's row: what it
serves, and what it holds). The rules:

1. The candidates are the other workers that serve the task's queue and have its step type.
2. A live candidate holding partitions of the task's topic takes it: one of those partitions,
   chosen by the task's own hash (the tasks of one worker spread over all of them).
3. Candidates, but none both live and holding a partition of the topic (one that is starting,
   restarting under a supervisor, or a spare without a partition): the task waits where it is,
   read again as the registry changes, for at most ``grace_s`` since it was first handed back;
   then it fails as rule 4 says.
4. No candidate (none seen within ``grace_s``), or the wait of rule 3 is over: the attempt runs
   here, where it fails ("no step function registered ..."), and its retry policy decides.

A task handed back once more (the registry was out of date: the partition moved) counts from
its first hand-back: the grace bounds its whole journey.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from processor.core.versions import parse_served

# How long a task waits for a worker that has its function but holds no partition of its topic
# (restarting, starting, a spare), and how long ago a worker may have been seen to count.
GRACE_S = 60.0
# The header a handed-back task carries: "<hand-backs>:<epoch ms of the first>".
HANDBACK_HEADER = "ductor-handback"


@dataclass(frozen=True)
class Server:
    """A worker as the registry shows it."""

    instance_id: str
    queues: frozenset[str]
    step_types: frozenset[str]
    partitions: Mapping[str, tuple[int, ...]]  # topic -> the partitions it holds
    live: bool

    def serves(self, queue: str, step_type: str) -> bool:
        return queue in self.queues and step_type in self.step_types


@dataclass(frozen=True)
class SendTo:
    """Produce the task to this partition of its topic (held by ``instance_id``)."""

    partition: int
    instance_id: str


@dataclass(frozen=True)
class Wait:
    """Keep the task and decide again when the registry changes."""

    why: str


@dataclass(frozen=True)
class RunHere:
    """No worker can take it: it runs here, and fails."""

    why: str


Route = SendTo | Wait | RunHere


def route(
    servers: Iterable[Server],
    me: str,
    queue: str,
    step_type: str,
    topic: str,
    task_hash: int,
    waited_s: float,
    grace_s: float = GRACE_S,
) -> Route:
    """Where a task of ``step_type`` on ``topic`` (a steps topic of ``queue``) goes, from the
    worker ``me``, which has no function for it; ``waited_s`` since it was first handed back."""
    candidates = [s for s in servers if s.instance_id != me and s.serves(queue, step_type)]
    targets = sorted(
        (partition, s.instance_id)
        for s in candidates
        if s.live
        for partition in s.partitions.get(topic, ())
    )
    if targets:
        partition, owner = targets[task_hash % len(targets)]
        return SendTo(partition, owner)
    if not candidates:
        return RunHere(f"no live worker of queue {queue!r} has step type {_named(step_type)}")
    if waited_s >= grace_s:
        return RunHere(
            f"no worker with step type {_named(step_type)} held a partition of {topic} for"
            f" {grace_s:.0f} s"
        )
    live = any(s.live for s in candidates)
    return Wait(
        "a live worker with it holds no partition of the topic yet"
        if live
        else "a worker with it was seen lately (restarting?)"
    )


def _named(key: str) -> str:
    """A served key as a line says it: 'charge', or 'charge' version 2."""
    step_type, version = parse_served(key)
    return repr(step_type) if version == 1 else f"{step_type!r} version {version}"


def task_hash(run_id: str, node: str, attempt: int) -> int:
    """A stable hash of an attempt: which of the candidates' partitions it goes to."""
    return zlib.crc32(f"{run_id}\x00{node}\x00{attempt}".encode())


def parse_handback(value: bytes | None) -> tuple[int, int] | None:
    """(hand-backs so far, epoch ms of the first) from the header, or None (none, or not
    ours to read)."""
    if not value:
        return None
    try:
        hops, _, first = value.decode().partition(":")
        return int(hops), int(first)
    except (UnicodeDecodeError, ValueError):
        return None


def handback_value(hops: int, first_ms: int) -> bytes:
    return f"{hops}:{first_ms}".encode()
