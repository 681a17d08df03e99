"""The engine's access to Postgres: one connection and the definitions cache, per thread.

The commit path's database stage and the watchdog's sweeps each own a ``Database``: they run
on threads of their own, so neither ever waits behind the other, and a connection is never
shared between threads. A connection that failed is dropped and reopened on next use.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import psycopg

from processor.core.batch_values import ForceFailWritten, QuarantineFlag
from processor.core.limit_values import LimitInputs
from processor.core.model import Loaded, LoadedRun
from processor.core.plans import Commit, ForceFailWrite, Send
from processor.core.routing import TopicNames
from processor.core.run_state import RunStatus
from processor.core.shapes import OutboxKey, RunAtSeq, RunRef
from processor.core.stuck import Fail, Leave, StuckVerdict, judge_stuck
from processor.io.postgres import (
    connections,
    kept_signals,
    limit_store,
    outbox,
    schedules,
    store,
    sweeps,
    trigger_store,
    worker_registry,
)
from processor.io.runtime.faults import NO_FAULTS, Faults

log = logging.getLogger("ductor.watchdog")


class Database:
    def __init__(
        self, dsn: str, instance_id: str | None = None, gone_after_s: float = 30.0
    ) -> None:
        self._dsn = dsn
        self._instance_id = instance_id  # the owner of the outbox rows its commits write
        self._gone_after_s = gone_after_s
        # What the live workers serve: the versions the runs it starts pin (core/versions.py).
        self._served = worker_registry.ServedCache(gone_after_s)
        self._conn: psycopg.Connection[Any] | None = None
        self._definitions = store.Definitions()
        self._server_started: object = None  # when the server of the connection started

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._conn

    def _connect(self) -> psycopg.Connection[Any]:
        conn = connections.connect(self._dsn)
        self._server_started = connections.server_started(conn)
        return conn

    def server_started(self) -> object:
        """When the server of this connection started (a closed connection is opened first):
        another value than before means a restart or a failover (engine/recent_commits.py)."""
        if self._conn is None or self._conn.closed:
            self._conn = self._connect()
        return self._server_started

    def sibling(self) -> Database:
        """Another access to the same database, with a connection of its own."""
        return Database(self._dsn, self._instance_id, self._gone_after_s)

    def close(self) -> None:
        """Forget the connection (after a failure, or at the end); the next use reopens it."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def load(self, run_ids: Sequence[str]) -> dict[str, Loaded]:
        return store.load_runs(self.conn, self._definitions, run_ids)

    def load_at(self, run_ids: Sequence[str]) -> tuple[dict[str, Loaded], int]:
        """The runs, and Postgres's time of the load (epoch ms); a pending run with what the
        live workers serve, the versions its start pins (core/versions.py)."""
        loaded, now_ms = store.load_runs_at(self.conn, self._definitions, run_ids)
        starting = [
            run_id
            for run_id, run in loaded.items()
            if isinstance(run, LoadedRun) and run.state.status is RunStatus.PENDING
        ]
        if starting:
            served = self._served.get(self.conn)
            for run_id in starting:
                loaded[run_id] = cast(LoadedRun, loaded[run_id]).with_served(served)
        return loaded, now_ms

    def load_limits(self, loaded: Mapping[str, Loaded]) -> LimitInputs:
        """What the batch's limited dispatches are decided on (no statement without any)."""
        return limit_store.load_limits(self.conn, loaded)

    def waiters_to_wake(self, freed: Counter[str]) -> list[RunRef]:
        return limit_store.waiters_to_wake(self.conn, freed)

    def free_lingering(self, gone_after_s: float, limit: int) -> list[RunRef]:
        """Free the concurrency slots of executions that outlived their attempts and are over
        now (core/limits.py, rule 4); the waiters to wake for them, with their tiers."""
        freed = limit_store.free_lingering(self.conn, gone_after_s, limit)
        return limit_store.waiters_to_wake(self.conn, freed)

    def commit(
        self, commits: Sequence[Commit], acknowledged: Sequence[OutboxKey]
    ) -> store.CommitAnswer:
        return store.commit_batch(self.conn, commits, acknowledged, self._instance_id)

    def landed(self, commits: Sequence[Commit]) -> set[str]:
        return store.commits_landed(self.conn, commits)

    def delete_outbox(self, acknowledged: Sequence[OutboxKey]) -> None:
        outbox.delete_outbox(self.conn, acknowledged)

    def claim_outbox(
        self, older_than_s: float, limit: int, relay: outbox.OutboxRelay
    ) -> list[tuple[str, int, tuple[Send, ...]]]:
        return outbox.claim_outbox(self.conn, older_than_s, limit, relay)

    def park_outbox(self, rows: Sequence[tuple[str, int, str]]) -> None:
        outbox.park_outbox(self.conn, rows)

    def force_fail(self, write: ForceFailWrite) -> ForceFailWritten:
        """The terminal path shared by the livelock guard and the watchdog: write the failed
        state only if the run did not move since it was loaded. Its records go to the outbox
        without an owner: sent at once by the caller, and by any relay after
        DUCTOR_RELAY_AFTER_S if the caller could not (its answer was lost, it died). The
        limit slots it gave back come with the answer, for their waiters to be woken."""
        return store.force_fail_write(
            self.conn,
            write.run_id,
            write.loaded_checksum,
            write.state,
            write.cancel_children,
            write.effects,
        )

    def quarantine(self, runs: Sequence[QuarantineFlag]) -> set[str]:
        """Flag runs whose rows cannot be used; returns the newly flagged."""
        return store.quarantine_runs(self.conn, runs)

    def settle_stuck(
        self, run_id: str, selected_seq: int, now_ms: int, names: TopicNames
    ) -> tuple[StuckVerdict, list[RunRef]]:
        """A run the stuck sweep selected at ``selected_seq``: ticked with everything recorded
        for it (core/stuck.py); failed through the terminal path only if nothing can move it,
        and only if its row did not change since it was loaded (else left alone). A failed
        one's records (``Fail.write.effects``) are in the outbox, for the caller to send, and
        the waiters of the limit slots it gave back come with it, for the caller to wake (a
        waiter not woken, should reading them fail, looks again by itself)."""
        verdict = judge_stuck(self.load([run_id]).get(run_id), selected_seq, now_ms, names)
        if not isinstance(verdict, Fail):
            return verdict, []
        done = self.force_fail(verdict.write)
        if not done.written:
            return Leave(), []
        if not done.freed:
            return verdict, []
        try:
            return verdict, self.waiters_to_wake(done.freed)
        except psycopg.Error as exc:
            log.warning("run %s: its freed slots' waiters not read: %s", run_id, exc)
            return verdict, []

    def woken(self, run_ids: Sequence[str]) -> set[str]:
        """Mark the runs the stuck sweep wakes (spaced like the overdue ones); the marked."""
        return sweeps.mark_rewoken(self.conn, run_ids)

    def stuck(
        self, modulus: int, shards: Sequence[int], stuck_s: float, grace_s: float, limit: int
    ) -> list[RunAtSeq]:
        return sweeps.sweep_stuck(self.conn, modulus, shards, stuck_s, grace_s, limit)

    def overdue(
        self, modulus: int, shards: Sequence[int], grace_s: float, limit: int
    ) -> list[RunRef]:
        return sweeps.rewake_due(self.conn, modulus, shards, grace_s, limit)

    def fire_schedules(
        self,
        modulus: int,
        shards: Sequence[int],
        limit: int,
        faults: Faults = NO_FAULTS,
        unexpected: Callable[[str, Exception], None] | None = None,
    ) -> list[RunRef]:
        """The runs the due schedules of these shards start, with their tiers, to wake (a
        schedule whose fire raised what nobody foresaw is handed to ``unexpected``)."""
        return schedules.fire_due(
            self.conn, self._definitions, modulus, shards, limit, faults, unexpected
        )

    def adopt_kept_signals(self, modulus: int, shards: Sequence[int], limit: int) -> list[RunRef]:
        return kept_signals.adopt_kept_signals(self.conn, self._definitions, modulus, shards, limit)

    def claim_kept_dead_letters(
        self,
        modulus: int,
        shards: Sequence[int],
        ttl_s: float,
        claimer: outbox.OutboxRelay,
        limit: int,
    ) -> list[kept_signals.KeptDeadLetter]:
        return kept_signals.claim_kept_dead_letters(
            self.conn, modulus, shards, ttl_s, claimer, limit
        )

    def forget_kept_signals(self, keys: Sequence[kept_signals.KeptKey]) -> None:
        kept_signals.forget_kept_signals(self.conn, keys)

    def triggers(self) -> trigger_store.TriggerSet:
        return trigger_store.load_triggers(self.conn)
