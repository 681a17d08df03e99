"""What each worker serves, in its row of the instance registry (``eec_instance``, migration
0032): its queues, step types, concurrency, version and app, written when it registers, and the
partitions it holds, written with its heartbeat when they changed (io/postgres/instances.py writes
the row). Read by `ductor workers`, by the warnings of `workflows register` and `start`, and by a
worker handed a task it has no function for (``Directory``: worker/handback.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from importlib import metadata
from typing import Any

import orjson
import psycopg

from processor.core.handback import GRACE_S, Server
from processor.core.shapes import TopicPartition
from processor.core.versions import (
    ServedVersions,
    newest_served,
    parse_served,
    runs_code,
    served_key,
)
from processor.core.workflow_def import WorkflowDef


@dataclass(frozen=True)
class WorkerAbout:
    """What a worker serves, as it registers."""

    group_id: str  # the consumer group it joins (its deployment's workers)
    name: str | None  # DUCTOR_WORKER_NAME, None when it has none
    queues: tuple[str, ...]
    step_types: tuple[str, ...]
    concurrency: int
    version: str
    app: str | None  # its --app (None: the samples)


def ductor_version() -> str:
    """The version of the installed distribution, as `ductor --version` says it."""
    try:
        return metadata.version("ductor-processor")
    except metadata.PackageNotFoundError:
        return "unknown"


def about_params(about: WorkerAbout | None) -> tuple[Any, ...]:
    """The registry columns (group_id, name, queues, step_types, concurrency, version, app)
    of a worker's row; NULLs for a processor's."""
    if about is None:
        return (None, None, None, None, None, None, None)
    return (
        about.group_id,
        about.name,
        list(about.queues),
        list(about.step_types),
        about.concurrency,
        about.version,
        about.app,
    )


def partitions_doc(held: Iterable[TopicPartition]) -> str:
    """The ``partitions`` column of what a worker holds: {"topic": [partition, ...]}."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(held):
        by_topic.setdefault(topic, []).append(partition)
    return orjson.dumps(by_topic).decode()


# What a worker reads of the others of its group (the workers' role may read these columns):
# those seen within the grace of a hand-back, live or not (core/handback.py).
_SERVERS = """
SELECT instance_id, queues, step_types, partitions,
       stopped_at IS NULL AND heartbeat_at > now() - make_interval(secs => %(gone_after_s)s)
  FROM eec_instance
 WHERE kind = 'worker' AND group_id = %(group_id)s
   AND heartbeat_at > now() - make_interval(secs => %(seen_within_s)s)
"""


def servers(
    conn: psycopg.Connection[Any],
    group_id: str,
    gone_after_s: float,
    seen_within_s: float = GRACE_S,
) -> list[Server]:
    params = {"group_id": group_id, "gone_after_s": gone_after_s, "seen_within_s": seen_within_s}
    rows = conn.execute(_SERVERS, params).fetchall()
    return [
        Server(
            instance_id,
            frozenset(queues or ()),
            frozenset(types or ()),
            {t: tuple(p) for t, p in (partitions or {}).items()},
            bool(live),
        )
        for instance_id, queues, types, partitions, live in rows
    ]


@dataclass(frozen=True)
class LiveWorker:
    """A live worker as `ductor workers` lists it."""

    instance_id: str
    name: str | None
    host: str
    pid: int
    queues: tuple[str, ...]
    step_types: tuple[str, ...]
    concurrency: int | None
    version: str | None
    app: str | None
    partitions: Mapping[str, tuple[int, ...]]
    started_at: datetime
    heartbeat_at: datetime

    @property
    def partition_count(self) -> int:
        return sum(len(p) for p in self.partitions.values())

    def as_json(self) -> dict[str, Any]:
        return {
            "instance_id": self.instance_id,
            "name": self.name,
            "host": self.host,
            "pid": self.pid,
            "queues": list(self.queues),
            "step_types": list(self.step_types),
            "concurrency": self.concurrency,
            "version": self.version,
            "app": self.app,
            "partitions": {t: list(p) for t, p in self.partitions.items()},
            "started_at": self.started_at.isoformat(),
            "heartbeat_at": self.heartbeat_at.isoformat(),
        }


def live_workers(
    conn: psycopg.Connection[Any], group_id: str, gone_after_s: float
) -> list[LiveWorker]:
    """The workers of group ``group_id`` alive now (not stopped, a heartbeat within
    ``gone_after_s``), oldest first; a worker from before the registry said what it serves
    (no group: listed with every group) shows none."""
    rows = conn.execute(
        "SELECT instance_id, name, host, pid, queues, step_types, concurrency, version, app,"
        "       partitions, started_at, heartbeat_at"
        "  FROM eec_instance"
        " WHERE kind = 'worker' AND stopped_at IS NULL"
        "   AND heartbeat_at > now() - make_interval(secs => %s)"
        "   AND (group_id = %s OR group_id IS NULL)"
        " ORDER BY started_at, instance_id",
        (gone_after_s, group_id),
    ).fetchall()
    return [_live_worker(row) for row in rows]


# The columns both reads of live workers select first, in this order (``_live_worker``).
_WORKER_COLUMNS = 12


def _live_worker(row: Sequence[Any]) -> LiveWorker:
    """A worker from the first ``_WORKER_COLUMNS`` of a row: instance_id, name, host, pid,
    queues, step_types, concurrency, version, app, partitions, started_at, heartbeat_at."""
    (instance_id, name, host, pid, queues, types, concurrency, version, app) = row[:9]
    partitions, started_at, heartbeat_at = row[9:_WORKER_COLUMNS]
    return LiveWorker(
        instance_id,
        name,
        host,
        pid,
        tuple(queues or ()),
        tuple(types or ()),
        concurrency,
        version,
        app,
        {t: tuple(p) for t, p in (partitions or {}).items()},
        started_at,
        heartbeat_at,
    )


def unserved(wf: WorkflowDef, workers: Sequence[LiveWorker]) -> list[tuple[str, str]]:
    """The (queue, step type) pairs of ``wf``'s steps that run on workers (a map's items,
    the steps' compensations and its failure handler too) and that no worker of ``workers``
    serves, sorted: a step that declares its version
    needs that version (named ``type@N``), any other a version of its type. A worker from
    before the registry said what it serves counts for nothing here (the caller says how
    many there are)."""
    served = {(q, key) for w in workers for q in w.queues for key in w.step_types}
    any_version = {(q, parse_served(key)[0]) for q, key in served}
    missing = set()
    for s in (*wf.steps, *wf.saga_steps):
        if not runs_code(s):
            continue
        if s.version is None:
            if (s.queue, s.step_type) not in any_version:
                missing.add((s.queue, s.step_type))
        elif (s.queue, served_key(s.step_type, s.version)) not in served:
            missing.add((s.queue, served_key(s.step_type, s.version)))
    return sorted(missing)


# What every live worker serves (any group: a run pins the versions of its steps' functions
# from it, core/versions.py).
SERVED_VERSIONS_SQL = """
SELECT queues, step_types
  FROM eec_instance
 WHERE kind = 'worker' AND stopped_at IS NULL AND step_types IS NOT NULL
   AND heartbeat_at > now() - make_interval(secs => %s)
"""


class ServedCache:
    """The newest version of each (queue, step type) the live workers serve, as the commit
    path's database stage reads it for the runs it starts (their pins: core/versions.py):
    read again when older than ``REFRESH_S`` and asked for, so a worker that registered
    within that long may not be seen by a run starting now."""

    REFRESH_S = 1.0

    def __init__(self, gone_after_s: float, monotonic: Any = time.monotonic) -> None:
        self._gone_after_s = gone_after_s
        self._monotonic = monotonic
        self._read_at: float | None = None
        self._served: ServedVersions = {}

    def get(self, conn: psycopg.Connection[Any]) -> ServedVersions:
        now = self._monotonic()
        if self._read_at is None or now - self._read_at >= self.REFRESH_S:
            rows = conn.execute(SERVED_VERSIONS_SQL, (self._gone_after_s,)).fetchall()
            self._served = newest_served((queues or (), keys or ()) for queues, keys in rows)
            self._read_at = now
        return self._served


class Directory:
    """The other workers as the registry shows them, read on the presence thread (its
    connection, after its heartbeat: io/postgres/instances.py ``Presence``) while someone asked for
    them within the last minute; read on the loop thread without waiting. ``version`` moves
    with each read."""

    WANTED_FOR_S = 60.0

    def __init__(self, group_id: str, gone_after_s: float, monotonic: Any = time.monotonic) -> None:
        self._group_id = group_id
        self._gone_after_s = gone_after_s
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._servers: list[Server] = []
        self._wanted_at: float | None = None
        self.version = 0  # 0: never read

    def want(self) -> None:
        """Keep it read (a hand-back waits on it)."""
        self._wanted_at = self._monotonic()

    def servers(self) -> list[Server]:
        with self._lock:
            return self._servers

    def refresh(self, conn: psycopg.Connection[Any]) -> None:
        """On the presence thread, after a heartbeat: read it if someone wants it."""
        wanted = self._wanted_at
        if wanted is None or self._monotonic() - wanted > self.WANTED_FOR_S:
            return
        found = servers(conn, self._group_id, self._gone_after_s)
        with self._lock:
            self._servers = found
            self.version += 1


@dataclass(frozen=True)
class WorkerLoad:
    """A live worker of any group, and how many executions it runs now (None: a worker from
    before the registry reports its executions' ends, whose count would mean nothing)."""

    worker: LiveWorker
    group_id: str | None
    busy: int | None


# Every live worker, and the executions it reports running for live runs: read from the
# live runs (the watchdog's index of them, as io/postgres/run_search.py reads it) into their
# attempts by primary key, never the whole attempts table; an execution that outlives its run
# (a step in a thread after a cancel) is not counted.
_LOADS = """
WITH busy AS (
  SELECT a.worker_id, count(*) AS running
    FROM eec_workflow_run r
    JOIN eec_step_attempt a ON a.run_id = r.run_id
   WHERE r.status IN ('pending', 'running') AND r.last_transition_at < 'infinity'::timestamptz
     AND a.reports AND a.ended_at IS NULL
   GROUP BY a.worker_id
)
SELECT i.instance_id, i.name, i.host, i.pid, i.queues, i.step_types, i.concurrency, i.version,
       i.app, i.partitions, i.started_at, i.heartbeat_at, i.group_id,
       CASE WHEN i.group_id IS NULL THEN NULL ELSE coalesce(b.running, 0) END
  FROM eec_instance i LEFT JOIN busy b ON b.worker_id = i.instance_id
 WHERE i.kind = 'worker' AND i.stopped_at IS NULL
   AND i.heartbeat_at > now() - make_interval(secs => %s)
 ORDER BY i.group_id NULLS LAST, i.started_at, i.instance_id
"""


def worker_loads(conn: psycopg.Connection[Any], gone_after_s: float) -> list[WorkerLoad]:
    """Every worker alive now, of every group (the web page's workers), with what it runs."""
    return [
        WorkerLoad(_live_worker(row), *row[_WORKER_COLUMNS:])
        for row in conn.execute(_LOADS, (gone_after_s,)).fetchall()
    ]
