"""Retention: deleting finished runs, with their step results, signals, step attempts, map
items, the tags their steps set, outbox rows and the marks kept beside them (re-wakes,
quarantine flags).

A run is finished when its status is terminal (succeeded, failed, cancelled); terminal statuses
are absorbing, so a run chosen here can never come back to life, and a live run is never
chosen. Runs go in batches, one statement (and transaction) each: the batch's run rows are
locked ``FOR UPDATE SKIP LOCKED`` (a row someone holds at that moment is left for the next
pass, never waited for), their children are deleted, then the rows. No lock outlives its batch,
so this runs beside processors and workers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from processor.core.run_state import TERMINAL_STATUSES

# Literal statuses (not a parameter), so the planner matches the partial index
# eec_workflow_run_finished_idx (schemas/migrations/0003_finished_runs_index.sql).
_FINISHED = sql.SQL("status IN ({}) AND last_transition_at < %(before)s").format(
    sql.SQL(", ").join(sql.Literal(s.value) for s in sorted(TERMINAL_STATUSES))
)

_DELETE_BATCH = sql.SQL(
    """
    WITH doomed AS (
        SELECT run_id FROM eec_workflow_run WHERE {finished}
         LIMIT %(limit)s FOR UPDATE SKIP LOCKED
    ), results AS (
        DELETE FROM eec_step_result c USING doomed d WHERE c.run_id = d.run_id RETURNING 1
    ), signals AS (
        DELETE FROM eec_run_signal c USING doomed d WHERE c.run_id = d.run_id RETURNING 1
    ), outbox AS (
        DELETE FROM eec_outbox c USING doomed d WHERE c.run_id = d.run_id RETURNING 1
    ), attempts AS (
        DELETE FROM eec_step_attempt c USING doomed d WHERE c.run_id = d.run_id
    ), rewakes AS (
        DELETE FROM eec_run_rewake c USING doomed d WHERE c.run_id = d.run_id
    ), flags AS (
        DELETE FROM eec_run_quarantine c USING doomed d WHERE c.run_id = d.run_id
    ), map_items AS (
        DELETE FROM eec_map_item c USING doomed d WHERE c.run_id = d.run_id
    ), tags AS (
        DELETE FROM eec_run_tag c USING doomed d WHERE c.run_id = d.run_id
    ), runs AS (
        DELETE FROM eec_workflow_run r USING doomed d WHERE r.run_id = d.run_id RETURNING 1
    )
    SELECT (SELECT count(*) FROM runs), (SELECT count(*) FROM results),
           (SELECT count(*) FROM signals), (SELECT count(*) FROM outbox)
    """
).format(finished=_FINISHED)

_COUNT = sql.SQL(
    """
    WITH doomed AS (SELECT run_id FROM eec_workflow_run WHERE {finished})
    SELECT (SELECT count(*) FROM doomed),
           (SELECT count(*) FROM eec_step_result c JOIN doomed d USING (run_id)),
           (SELECT count(*) FROM eec_run_signal c JOIN doomed d USING (run_id)),
           (SELECT count(*) FROM eec_outbox c JOIN doomed d USING (run_id))
    """
).format(finished=_FINISHED)


@dataclass(frozen=True)
class Removed:
    """How many rows of each table went (or would go, for a count)."""

    runs: int = 0
    results: int = 0
    signals: int = 0
    outbox: int = 0

    def __add__(self, other: Removed) -> Removed:
        return Removed(
            self.runs + other.runs,
            self.results + other.results,
            self.signals + other.signals,
            self.outbox + other.outbox,
        )


def cutoff(conn: psycopg.Connection[Any], older_than_s: float) -> datetime:
    """The database's clock minus ``older_than_s``: one instant for every batch of a pass."""
    row = conn.execute("SELECT now() - make_interval(secs => %s)", (older_than_s,)).fetchone()
    assert row is not None
    moment: datetime = row[0]
    return moment


def count_finished(conn: psycopg.Connection[Any], before: datetime) -> Removed:
    """What ``delete_finished`` would delete now (nothing is locked or deleted)."""
    row = conn.execute(_COUNT, {"before": before}).fetchone()
    assert row is not None
    return Removed(*(int(n) for n in row))


def delete_finished_batch(conn: psycopg.Connection[Any], before: datetime, limit: int) -> Removed:
    """Delete up to ``limit`` runs finished before ``before`` (rows locked by someone else are
    skipped) with their children, in one statement: on an autocommit connection, one
    transaction."""
    row = conn.execute(_DELETE_BATCH, {"before": before, "limit": limit}).fetchone()
    assert row is not None
    return Removed(*(int(n) for n in row))


def delete_finished(
    conn: psycopg.Connection[Any],
    before: datetime,
    batch_size: int,
    on_batch: Callable[[Removed], None] | None = None,
) -> tuple[Removed, int]:
    """Delete every run finished before ``before``, ``batch_size`` at a time, until a batch
    finds none; returns the total and the number of batches. ``on_batch`` gets the running
    total after each batch."""
    total, batches = Removed(), 0
    while True:
        removed = delete_finished_batch(conn, before, batch_size)
        if removed.runs == 0:
            return total, batches
        total, batches = total + removed, batches + 1
        if on_batch is not None:
            on_batch(total)
