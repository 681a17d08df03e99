"""What the client keeps between calls: idle Postgres connections and one Kafka producer per
configuration, per process.

A call used to open a connection and a producer and close both: a connect (~5-10 ms, more with
TLS) and a producer's first metadata round trip on every ``start_run``, before the start
wakeup could leave. An application that starts runs one by one paid that on each; a
``ductor`` command makes one call, so it pays it once either way.

Why not psycopg_pool: the client makes short, mostly sequential calls from the application's
threads; a pool's background threads in every process that imports the client (and every
``ductor`` command) buy nothing here, and a pool reports a refused connection as a timeout
after its wait, where a plain connect says why at once (``ClientError`` names the DSN and the
cause). What is kept is small: up to ``IDLE_PER_DSN`` idle connections, each checked before
reuse (``_usable``); a connection that comes back broken or
inside a transaction is closed, not kept. After a fork the child keeps nothing of its parent's.
"""

from __future__ import annotations

import atexit
import os
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from confluent_kafka import Producer
from psycopg.pq import TransactionStatus

IDLE_PER_DSN = 4
# A connection idle longer than this is asked `SELECT 1` before reuse (a proxy's idle timeout
# can cut a connection without a word); a fresher one is reused unless its socket has
# something to read (_usable).
CHECK_AFTER_S = 5.0
# How long the partition count of a topic is trusted before asking the broker again.
PARTITIONS_FOR_S = 60.0


class _Kept:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.pid = os.getpid()
        self.idle: dict[str, list[tuple[psycopg.Connection[Any], float]]] = {}
        self.producers: dict[tuple[tuple[str, str], ...], Producer] = {}
        self.partitions: dict[tuple[int, str], tuple[int, float]] = {}


_kept = _Kept()


def _here() -> _Kept:
    """This process's keep (a fresh one after a fork: a parent's sockets are not ours)."""
    global _kept  # noqa: PLW0603 - one keep per process, replaced after a fork
    if _kept.pid != os.getpid():
        _kept = _Kept()
    return _kept


@contextmanager
def kept_connection(
    dsn: str, connect: Callable[[], psycopg.Connection[Any]]
) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection to ``dsn`` for the block: an idle one kept from an earlier
    call, or a new one from ``connect``; kept again afterwards if it is still usable."""
    conn = _take(dsn) or connect()
    try:
        yield conn
    finally:
        _give_back(dsn, conn)


def _take(dsn: str) -> psycopg.Connection[Any] | None:
    kept = _here()
    while True:
        with kept.lock:
            idle = kept.idle.get(dsn)
            if not idle:
                return None
            conn, since = idle.pop()
        if _usable(conn, time.monotonic() - since):
            return conn
        conn.close()


def _usable(conn: psycopg.Connection[Any], idle_s: float) -> bool:
    """Whether a kept connection still works. An idle connection is sent nothing, so one
    with something to read was told goodbye (a server shut down or restarted sends its
    termination, a dropped socket reads as its end): no round trip for that. One idle for
    long is asked, should a proxy have cut it silently."""
    if conn.closed or conn.broken:
        return False
    if select.select([conn.fileno()], [], [], 0)[0]:
        return False
    if idle_s < CHECK_AFTER_S:
        return True
    try:
        conn.execute("SELECT 1")
    except psycopg.Error:
        return False
    return True


def _give_back(dsn: str, conn: psycopg.Connection[Any]) -> None:
    usable = (
        not conn.closed
        and not conn.broken
        and conn.info.transaction_status == TransactionStatus.IDLE
    )
    if usable:
        kept = _here()
        with kept.lock:
            idle = kept.idle.setdefault(dsn, [])
            if len(idle) < IDLE_PER_DSN:
                idle.append((conn, time.monotonic()))
                return
    conn.close()


def kept_producer(
    config: dict[str, Any], make: Callable[[dict[str, Any]], Producer] = Producer
) -> Producer:
    """The process's producer for ``config`` (``make``-d on first use, flushed at exit)."""
    key = tuple(sorted((str(k), str(v)) for k, v in config.items()))
    kept = _here()
    with kept.lock:
        producer = kept.producers.get(key)
        if producer is None:
            producer = kept.producers[key] = make(config)
        return producer


def partition_count(
    producer: Producer, topic: str, ask: Callable[[Producer, str], int], now: float
) -> int:
    """``topic``'s partition count as ``ask`` last answered it for this producer, asked
    again once it is older than PARTITIONS_FOR_S."""
    kept = _here()
    key = (id(producer), topic)
    with kept.lock:
        known = kept.partitions.get(key)
    if known is not None and now - known[1] < PARTITIONS_FOR_S:
        return known[0]
    count = ask(producer, topic)
    with kept.lock:
        kept.partitions[key] = (count, now)
    return count


def forget_all() -> None:
    """Close what is kept (at exit; tests that restart the services call it too)."""
    kept = _here()
    with kept.lock:
        idle = [conn for conns in kept.idle.values() for conn, _ in conns]
        producers = list(kept.producers.values())
        kept.idle.clear()
        kept.producers.clear()
        kept.partitions.clear()
    for conn in idle:
        conn.close()
    for producer in producers:
        # Every call waited for its records: what is left had failed. One with nothing left
        # is not polled at all: a poll would only report (on stderr, at exit) that a broker
        # a test has stopped since refuses the connection.
        if len(producer):
            producer.flush(1)


atexit.register(forget_all)
