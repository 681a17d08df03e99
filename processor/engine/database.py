"""The engine's access to Postgres: one connection and the definitions cache, per thread.

The commit path's database stage and the watchdog's sweeps each own a ``Database``: they run
on threads of their own, so neither ever waits behind the other, and a connection is never
shared between threads. A connection that failed is dropped and reopened on next use.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg

from processor.core.decide import Commit, ForceFailWrite, Send
from processor.core.model import Loaded, LoadedRun
from processor.core.outcomes import ForceFailReason
from processor.core.tick import force_fail
from processor.io import connections, store, sweeps


class Database:
    def __init__(self, dsn: str, instance_id: str | None = None) -> None:
        self._dsn = dsn
        self._instance_id = instance_id  # the owner of the outbox rows its commits write
        self._conn: psycopg.Connection[Any] | None = None
        self._definitions = store.Definitions()

    @property
    def conn(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed:
            self._conn = connections.connect(self._dsn)
        return self._conn

    def close(self) -> None:
        """Forget the connection (after a failure, or at the end); the next use reopens it."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def load(self, run_ids: Sequence[str]) -> dict[str, Loaded]:
        return store.load_runs(self.conn, self._definitions, run_ids)

    def commit(
        self, commits: Sequence[Commit], acknowledged: Sequence[tuple[str, int]]
    ) -> store.CommitAnswer:
        return store.commit_batch(self.conn, commits, acknowledged, self._instance_id)

    def landed(self, commits: Sequence[Commit]) -> set[str]:
        return store.commits_landed(self.conn, commits)

    def delete_outbox(self, acknowledged: Sequence[tuple[str, int]]) -> None:
        store.delete_outbox(self.conn, acknowledged)

    def claim_outbox(
        self, older_than_s: float, limit: int, relay: store.OutboxRelay
    ) -> list[tuple[str, int, tuple[Send, ...]]]:
        return store.claim_outbox(self.conn, older_than_s, limit, relay)

    def force_fail(self, write: ForceFailWrite) -> bool:
        """The terminal path shared by the livelock guard and the watchdog: write the failed
        state only if the run did not move since it was loaded."""
        return store.force_fail_write(self.conn, write.run_id, write.loaded_checksum, write.state)

    def quarantine(self, runs: Sequence[tuple[str, str]]) -> set[str]:
        """Flag runs whose rows cannot be used, ``(run_id, why)``; returns the newly flagged."""
        return store.quarantine_runs(self.conn, runs)

    def force_fail_stuck(self, run_id: str, selected_seq: int) -> bool:
        """Fail a run that made no transition for too long, through the same terminal path,
        only if it is still at the seq it was selected at (a transition committed between
        the sweep's select and this write means it is not stuck)."""
        run = self.load([run_id]).get(run_id)
        if not isinstance(run, LoadedRun) or not run.checksum_ok or run.state.seq != selected_seq:
            return False
        failed = force_fail(run.state, ForceFailReason.STUCK)
        if failed is None:
            return False
        return self.force_fail(ForceFailWrite(run_id, run.stored_checksum, failed))

    def stuck(
        self, modulus: int, shards: Sequence[int], stuck_s: float, limit: int
    ) -> list[tuple[str, int]]:
        return sweeps.sweep_stuck(self.conn, modulus, shards, stuck_s, limit)

    def overdue(self, modulus: int, shards: Sequence[int], grace_s: float, limit: int) -> list[str]:
        return [
            run_id for run_id, _tier in sweeps.sweep_due(self.conn, modulus, shards, grace_s, limit)
        ]
