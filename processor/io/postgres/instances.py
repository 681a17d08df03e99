"""The instance registry (``eec_instance``): which processors and workers are alive.

Each instance registers at start, writes a heartbeat about once a second and marks itself
stopped when it shuts down cleanly. It holds nothing through its row (no lock, no lease): the
registry only answers "is the instance that wrote this gone?", asked by the outbox relay (an
outbox row is sent again only when its owner is gone) and by a worker that meets an attempt
another worker started (run again only when that worker died).

An instance is gone when it marked itself stopped, or when its heartbeat is older than
``DUCTOR_INSTANCE_TIMEOUT_S``. Whoever asks must have been able to see heartbeats for at least
that long itself (``Judge``): right after an outage of its own database access, every other
heartbeat looks old, and the others are not dead for that.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from processor.io.postgres.connections import connect
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.worker_registry import WorkerAbout, about_params
from processor.io.runtime.threads import ThreadWatch
from processor.io.telemetry.logs import first_line

log = logging.getLogger("ductor.instances")

# Rows of instances gone this long are deleted when another instance registers.
_FORGET_AFTER = "1 day"

# The SQL condition "instance <column> is alive": an SQL fragment for the statements that ask,
# with the heartbeat timeout as the named parameter ``gone_after_s``.
ALIVE = """EXISTS (SELECT 1 FROM eec_instance i
                WHERE i.instance_id = {column} AND i.stopped_at IS NULL
                  AND i.heartbeat_at > now() - make_interval(secs => %(gone_after_s)s))"""


def heartbeat_interval_s(gone_after_s: float) -> float:
    """How often an instance writes its heartbeat: every second, or five times within the
    timeout after which it is taken for gone, if that is shorter."""
    return min(1.0, gone_after_s / 5)


def alive(column: str) -> str:
    return ALIVE.format(column=column)


# A worker's row says what it serves (io/postgres/worker_registry.py); ``partitions`` is written
# when given (what it holds changed), else kept.
_UPSERT = """
INSERT INTO eec_instance
    (instance_id, kind, host, pid, group_id, name, queues, step_types, concurrency, version,
     app, partitions)
    VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s::jsonb)
    ON CONFLICT (instance_id) DO UPDATE
        SET heartbeat_at = now(),
            partitions = coalesce(EXCLUDED.partitions, eec_instance.partitions)
RETURNING (extract(epoch FROM now()) * 1000)::bigint
"""


def register(
    conn: psycopg.Connection[Any],
    instance_id: str,
    kind: str,
    forget_gone: bool = True,
    about: WorkerAbout | None = None,
) -> int:
    """Announce an instance (and, with ``forget_gone``, forget instances gone for a day);
    Postgres's time (epoch ms). A worker forgets none: its database role may not delete
    another instance's row (docs/operations/access.md#the-workers-database-role)."""
    database_ms = heartbeat(conn, instance_id, kind, about)
    if forget_gone:
        conn.execute(
            "DELETE FROM eec_instance WHERE heartbeat_at < now() - %s::interval", (_FORGET_AFTER,)
        )
    return database_ms


def heartbeat(
    conn: psycopg.Connection[Any],
    instance_id: str,
    kind: str,
    about: WorkerAbout | None = None,
    partitions: str | None = None,
) -> int:
    """The instance is alive (registered again, should its row have been forgotten, with
    what it serves: ``about``); ``partitions`` (JSON), what it holds now if that changed.
    Returns Postgres's time of the heartbeat (epoch ms)."""
    row = conn.execute(
        _UPSERT,
        (
            instance_id,
            kind,
            socket.gethostname()[:200],
            os.getpid(),
            *about_params(about),
            partitions,
        ),
    ).fetchone()
    assert row is not None
    return int(row[0])


def stopped(conn: psycopg.Connection[Any], instance_id: str) -> None:
    """The instance stopped cleanly: whatever it leaves is for the others at once."""
    conn.execute(
        "UPDATE eec_instance SET stopped_at = now() WHERE instance_id = %s", (instance_id,)
    )


class Judge:
    """Whether this instance may take a silent instance for gone: only once its own database
    access has worked for ``gone_after_s`` without a failure (a start counts as working)."""

    def __init__(
        self, gone_after_s: float, monotonic: Callable[[], float] = time.monotonic
    ) -> None:
        self.gone_after_s = gone_after_s
        self._monotonic = monotonic
        self._failed_at: float | None = None

    def failed(self) -> None:
        """Its own database access just failed."""
        self._failed_at = self._monotonic()

    def may_judge(self) -> bool:
        failed = self._failed_at
        return failed is None or self._monotonic() - failed > self.gone_after_s


class Presence:
    """This instance in the registry, kept on a thread of its own with its own connection:
    registered at start, a heartbeat every ``interval_s``, marked stopped at the end. A
    heartbeat that fails is tried again at the next interval, quietly: the instance's own
    work reports the outage. ``may_judge`` says whether this instance may take a silent one
    for gone (it has seen the database answer, without a failure, for the last
    ``gone_after_s``). Only a processor forgets the instances gone for a day (``register``)."""

    def __init__(
        self,
        dsn: str,
        instance_id: str,
        kind: str,
        interval_s: float,
        gone_after_s: float,
        clock: DatabaseClock | None = None,
        threads: ThreadWatch | None = None,
        about: WorkerAbout | None = None,
        after_beat: Callable[[psycopg.Connection[Any]], None] | None = None,
    ) -> None:
        """``about``: what a worker serves (its row says it); ``after_beat``: called with the
        connection after each heartbeat (a worker's directory of the others reads there)."""
        self.instance_id = instance_id
        self._about = about
        self._after_beat = after_beat
        self._holding: str | None = None  # partitions to write with the next heartbeat
        self._after_beat_failing = False
        self._forgets = kind == "processor"
        self._clock = clock or DatabaseClock()  # each heartbeat measures its offset
        self.gone_after_s = gone_after_s
        self._dsn = dsn
        self._kind = kind
        self._interval_s = interval_s
        self._judge = Judge(gone_after_s)
        self._registered = threading.Event()
        self._stop = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        # Watched: a heartbeat that died would let the others take this instance for gone.
        self._thread = (threads or ThreadWatch()).thread(self._beat, f"{kind}-presence")

    def register_now(self) -> None:
        """Register before anything else happens (raises psycopg.Error: the caller's start
        waits it out as an outage, io/runtime/outage.py)."""
        self._close()  # (what a failed try left)
        self._conn = connect(self._dsn)
        sent_ms = self._clock.local_ms()
        database_ms = register(self._conn, self.instance_id, self._kind, self._forgets, self._about)
        self._clock.observe(database_ms, sent_ms, self._clock.local_ms())
        self._registered.set()

    def start(self) -> Presence:
        self._thread.start()
        return self

    def holding(self, partitions: str) -> None:
        """What the instance holds now (JSON), written with its next heartbeat."""
        self._holding = partitions

    def may_judge(self) -> bool:
        return self._registered.is_set() and self._judge.may_judge()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the heartbeat and mark the instance stopped (best effort, within
        ``timeout_s``: an instance that cannot say so is taken for gone by its silence)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout_s)
        if self._thread.is_alive():
            return  # its connection hangs: silence will tell
        if not self._registered.is_set():
            self._close()
            return  # stopped while it started: there is no row to mark
        try:
            if self._conn is None:
                self._conn = connect(self._dsn, connect_timeout_s=max(1, int(timeout_s)))
            stopped(self._conn, self.instance_id)
        except psycopg.Error as exc:
            log.warning("could not mark %s stopped: %s", self.instance_id, first_line(exc))
        finally:
            self._close()

    def _beat(self) -> None:
        while True:
            try:
                if self._conn is None:
                    self._conn = connect(self._dsn)
                sent_ms = self._clock.local_ms()
                if self._registered.is_set():
                    database_ms = self._heartbeat(self._conn)
                else:
                    database_ms = register(
                        self._conn, self.instance_id, self._kind, self._forgets, self._about
                    )
                    self._registered.set()
                self._clock.observe(database_ms, sent_ms, self._clock.local_ms())
                self._run_after_beat(self._conn)
            except psycopg.Error as exc:
                self._judge.failed()
                log.debug("heartbeat of %s failed: %s", self.instance_id, first_line(exc))
                self._close()
            except Exception as unexpected:  # nobody foresaw it: said, and the next beat tries
                self._judge.failed()
                log.error(
                    "heartbeat of %s failed unexpectedly: %s",
                    self.instance_id,
                    first_line(unexpected),
                    exc_info=unexpected,
                )
                self._close()
            if self._stop.wait(self._interval_s):
                return

    def _heartbeat(self, conn: psycopg.Connection[Any]) -> int:
        """A heartbeat, with what the instance holds if that changed (kept for the next one
        should this one fail)."""
        holding, self._holding = self._holding, None
        try:
            return heartbeat(conn, self.instance_id, self._kind, self._about, holding)
        except BaseException:
            if self._holding is None:
                self._holding = holding
            raise

    def _run_after_beat(self, conn: psycopg.Connection[Any]) -> None:
        """What rides on the heartbeat's connection; its failure is its own (logged), never
        the heartbeat's: a failed heartbeat would stop this instance judging the others."""
        if self._after_beat is None:
            return
        try:
            self._after_beat(conn)
            self._after_beat_failing = False
        except psycopg.Error as exc:
            level = logging.DEBUG if self._after_beat_failing else logging.WARNING
            self._after_beat_failing = True  # (said once until it works again)
            log.log(level, "after the heartbeat of %s: %s", self.instance_id, first_line(exc))

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
