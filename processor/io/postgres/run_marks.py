"""What is kept beside a run's row, never on it (schemas/migrations/0021_run_marks.sql): the
row is written only by versioned writes (docs/guarantees.md), so the watchdog's re-wake marks
(``eec_run_rewake``, io/postgres/sweeps.py) and the quarantine flags (``eec_run_quarantine``) live
in tables of their own keyed by run id.

A quarantine flag holds for the row's version it was decided on and no other: a run that
commits a transition again has left its flag behind without anyone writing it, and `ductor
runs release` moves the version. Every reader asks through ``quarantined`` or
``flag_column`` (a primary-key probe per run), so none can read a flag that no longer holds.
"""

from __future__ import annotations

# Written as scalar subqueries, never EXISTS: Postgres turns an EXISTS into a join, which it
# may plan as a hash join over the whole table of flags (it did, for the sweeps, once the
# statistics said the live runs were few); a scalar subquery stays a probe of the primary key
# for each run the statement reaches (tests/integration/test_query_plans.py).


def quarantined(run: str) -> str:
    """The SQL condition "the run of ``eec_workflow_run`` aliased ``run`` is quarantined"."""
    return (
        f"coalesce((SELECT true FROM eec_run_quarantine flag WHERE flag.run_id = {run}.run_id"
        f" AND flag.run_version = {run}.db_record_version), false)"
    )


def flag_column(run: str, column: str) -> str:
    """A column of the run's quarantine flag in force (NULL when it has none), for a SELECT
    list: read only for the rows a statement returns."""
    return (
        f"(SELECT flag.{column} FROM eec_run_quarantine flag WHERE flag.run_id = {run}.run_id"
        f" AND flag.run_version = {run}.db_record_version)"
    )
