"""Moving runs to other versions of their steps' functions (`ductor runs upgrade`): a run keeps
the versions it started with (core/versions.py) until an operator moves them, one run or every
run a filter matches.

A move is committed like every transition, by the conditional UPDATE on the run's version
(``db_record_version``), its pins in its state; it takes effect from the next attempt of each
step: an attempt in flight keeps the version its task carries. A running or failed run may be
moved (a failed one, then `runs retry`, runs again at the new versions); a pending run pins
its versions as it starts, and an ended one runs no more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import psycopg

from processor.client.actions import MAX_BULK_RUNS, bulk_matches
from processor.client.common import connection
from processor.client.errors import ClientError, InvalidArgument, RunNotFound, UpgradeRefused
from processor.client.records import BulkAction
from processor.core.plans import Commit
from processor.core.run_search import RunFilter
from processor.core.run_state import RunState, RunStatus
from processor.core.versions import PinMove, ServedVersions, upgrade
from processor.core.workflow_def import MAX_STEP_VERSION
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import run_columns
from processor.io.postgres.store import Definitions, commit_batch, load_runs
from processor.io.postgres.worker_registry import ServedCache

# The runs an upgrade may move: a pending run pins its versions when it starts.
_MOVABLE = (RunStatus.RUNNING, RunStatus.FAILED)
# A move that lost the race for the run's row is read again and tried after these waits.
_RACE_WAITS_S = (0.0, 0.01, 0.05, 0.2, 0.5)


@dataclass(frozen=True)
class UpgradedRun:
    """What an upgrade moved of one run: each step's pin, from and to (none: it had nothing
    to move), and whether it was written (not in a dry run)."""

    run_id: str
    moves: tuple[PinMove, ...]
    written: bool


def upgrade_run(
    settings: Settings,
    run_id: str,
    step_type: str | None = None,
    to_version: int | None = None,
    dry_run: bool = False,
) -> UpgradedRun:
    """Move the pins of run ``run_id``'s steps of ``step_type`` (None: of every type) to
    ``to_version`` (None: the newest version the live workers of each step's queue serve, 1
    when none does). RunNotFound; ClientError for a run that is not running or failed, is
    quarantined, or was changed outside Ductor; InvalidArgument for a version out of range."""
    _check(step_type, to_version)
    with connection(settings) as conn:
        served = _served(settings, conn, to_version)
        return _move(conn, Definitions(), run_id, step_type, to_version, served, dry_run)


def upgrade_runs(
    settings: Settings,
    wanted: RunFilter,
    step_type: str | None = None,
    to_version: int | None = None,
    dry_run: bool = False,
    max_runs: int = MAX_BULK_RUNS,
) -> BulkAction:
    """``upgrade_run`` for every running or failed run ``wanted`` matches (a run refused says
    why, the others go on); ``acted``: the runs whose pins moved (in a dry run, those that
    would). Bounds as ``cancel_runs``."""
    _check(step_type, to_version)
    matched = bulk_matches(settings, wanted, _MOVABLE, max_runs)
    moved: list[str] = []
    refused: list[tuple[str, str]] = []
    with connection(settings) as conn:
        served = _served(settings, conn, to_version)
        definitions = Definitions()
        for run_id, _tier in matched:
            try:
                done = _move(conn, definitions, run_id, step_type, to_version, served, dry_run)
            except ClientError as exc:
                refused.append((run_id, str(exc)))
                continue
            if done.moves:
                moved.append(run_id)
    return BulkAction(tuple(id for id, _ in matched), tuple(sorted(moved)), tuple(refused))


def _check(step_type: str | None, to_version: int | None) -> None:
    if to_version is not None and (
        type(to_version) is not int or not 1 <= to_version <= MAX_STEP_VERSION
    ):
        raise InvalidArgument(f"a version is an integer from 1 to {MAX_STEP_VERSION}")
    if to_version is not None and step_type is None:
        raise InvalidArgument("a version to move to needs the step type it is of")


def _served(
    settings: Settings, conn: psycopg.Connection[Any], to_version: int | None
) -> ServedVersions:
    """What the live workers serve, when the move is to the newest (else nothing is read)."""
    if to_version is not None:
        return {}
    return ServedCache(settings.instance_timeout_s).get(conn)


def _move(
    conn: psycopg.Connection[Any],
    definitions: Definitions,
    run_id: str,
    step_type: str | None,
    to_version: int | None,
    served: ServedVersions,
    dry_run: bool,
) -> UpgradedRun:
    """Commit one run's moved pins on its version, read again after a lost race."""
    for wait_s in _RACE_WAITS_S:
        time.sleep(wait_s)
        columns = run_columns(conn, run_id)
        run = load_runs(conn, definitions, [run_id]).get(run_id)
        if columns is None or run is None:
            raise RunNotFound(f"no run with id {run_id!r}")
        if columns.quarantined_at is not None:
            raise UpgradeRefused(f"run {run_id!r} is quarantined ({columns.quarantine_reason})")
        if isinstance(run, Exception) or not run.checksum_ok:
            raise UpgradeRefused(f"run {run_id!r} cannot be loaded as stored; repair its row first")
        state = run.state
        if state.status not in _MOVABLE:
            raise UpgradeRefused(
                f"run {run_id!r} is {state.status}: only a running or failed run is moved (a"
                " pending one pins its versions when it starts)"
            )
        pins, moves = upgrade(run.wf, state.versions, served, step_type, to_version)
        if not moves or dry_run:
            return UpgradedRun(run_id, moves, False)
        moved = RunState(state.status, state.nodes, state.seq + 1, state.reason, state.maps, pins)
        with conn.transaction():  # (an operator's command waits for a row another holds)
            conn.execute(
                "SELECT 1 FROM eec_workflow_run WHERE run_id = %s FOR NO KEY UPDATE", (run_id,)
            )
            answer = commit_batch(conn, [Commit(run_id, run.version, moved)])
        if answer.committed:
            return UpgradedRun(run_id, moves, True)
    raise UpgradeRefused(
        f"run {run_id!r} kept changing while it was being upgraded"
        f" ({len(_RACE_WAITS_S)} lost races); try again"
    )
