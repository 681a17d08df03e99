"""Quarantine: a run whose row cannot be used (changed out of band, a definition that cannot be
read) is dead-lettered once and flagged, so the watchdog stops re-waking it on every sweep and
bad rows never fill a sweep's limit; `ductor inspect` shows the flag and `ductor runs release`
clears it once the row is repaired."""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.client import wake
from processor.core.batch_values import QuarantineFlag
from processor.core.model import LoadedRun
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import DeadLetter, read_dead_letters
from processor.io.postgres.runs_admin import insert_runs, release_quarantine
from processor.io.postgres.store import Definitions, load_runs, quarantine_runs
from processor.io.postgres.workflows import register_workflow

from .children import run_ductor
from .instances import ProcessorThread, WorkerThread
from .runs import count_terminal, run_statuses
from .samples import sample_workflow
from .waiting import wait_for

pytestmark = pytest.mark.integration

LIMIT = 4  # runs per sweep: fewer than the bad rows, so they would fill every sweep
CLOCK_SLACK_MS = 50  # Postgres's now() is taken when its statement started


def _quarantined(pg: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, str]:
    """The runs' quarantine flags in force (io/postgres/run_marks.py), by run: their reasons."""
    rows = pg.execute(
        "SELECT r.run_id, f.reason FROM eec_workflow_run r"
        " JOIN eec_run_quarantine f ON f.run_id = r.run_id AND f.run_version = r.db_record_version"
        " WHERE r.run_id = ANY(%s)",
        (run_ids,),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def _flagged_ms(pg: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, int]:
    rows = pg.execute(
        "SELECT run_id, (extract(epoch FROM quarantined_at) * 1000)::bigint"
        " FROM eec_run_quarantine WHERE run_id = ANY(%s)",
        (run_ids,),
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def _run_of(letter: DeadLetter) -> str:
    return str(orjson.loads(letter.value or b"{}")["run_id"])


def test_bad_rows_are_quarantined_once_and_released_after_repair(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    settings = replace(settings, sweep_grace_s=0.0, sweep_limit=LIMIT, stuck_after_s=3600.0)
    tag = uuid.uuid4().hex[:6]
    tampered = [f"tampered-{tag}-{i}" for i in range(5)]
    unreadable = [f"unreadable-{tag}-{i}" for i in range(4)]
    lost = [f"lost-{tag}-{i}" for i in range(6)]  # good runs whose wakeups were never sent
    insert_runs(pg, sample_workflow(), [(r, {}) for r in tampered + lost], "t1")
    broken = parse_workflow(
        {"name": f"broken-{tag}", "version": 1, "steps": [{"name": "a", "type": "fast"}]}
    )
    register_workflow(pg, broken)
    insert_runs(pg, broken, [(r, {}) for r in unreadable], "t1")
    # The definition row no longer parses (written by hand): its runs cannot be loaded.
    pg.execute(
        "UPDATE eec_workflow_definition SET definition = '{\"steps\": 3}' WHERE name = %s",
        (broken.name,),
    )
    checksum = pg.execute(
        "SELECT state_checksum FROM eec_workflow_run WHERE run_id = %s", (tampered[0],)
    ).fetchone()
    assert checksum is not None
    pg.execute(
        "UPDATE eec_workflow_run SET state_checksum = 'changed-by-hand' WHERE run_id = ANY(%s)",
        (tampered,),
    )
    # Every run is overdue, the bad ones longest: without quarantine they would come first in
    # every sweep and fill its limit, and the lost good runs would never be re-woken.
    pg.execute(
        "UPDATE eec_workflow_run SET next_wakeup_at = now() - interval '1 hour'"
        " WHERE run_id = ANY(%s)",
        (tampered + unreadable,),
    )
    pg.execute(
        "UPDATE eec_workflow_run SET next_wakeup_at = now() - interval '1 minute'"
        " WHERE run_id = ANY(%s)",
        (lost,),
    )
    bad = tampered + unreadable

    instance: ProcessorThread = processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, lost) == len(lost), 90, "the lost good runs to end")
        assert set(run_statuses(pg, lost).values()) == {"succeeded"}
        wait_for(lambda: len(_quarantined(pg, bad)) == len(bad), 30, "every bad run flagged")
        # A sweep that started before the last flag may still re-wake; none after it does.
        watchdog = instance.processor.watchdog
        sweeps = watchdog.sweeps
        wait_for(lambda: watchdog.sweeps >= sweeps + 2, 30, "two sweeps")
        rewoken, sweeps = watchdog.rewoken, watchdog.sweeps
        wait_for(lambda: watchdog.sweeps >= sweeps + 4, 30, "four more sweeps")
        assert watchdog.rewoken == rewoken
        # Flagged exactly once each, with its reason.
        assert dict(instance.stats.quarantined) == {
            "checksum_mismatch": len(tampered),
            "unknown_workflow": len(unreadable),
        }
        # Every bad run's wakeups went to the dead-letter topic, and none was produced after
        # the run was flagged (one re-woken just before its flag may still arrive after it).
        flagged_ms = _flagged_ms(pg, bad)
        wait_for(
            lambda: {_run_of(d) for d in read_dead_letters(settings)} == set(bad),
            30,
            "a dead letter for every bad run",
        )
        for letter in read_dead_letters(settings):
            wakeup = orjson.loads(letter.value or b"{}")
            assert wakeup["produced_at"] <= flagged_ms[wakeup["run_id"]] + CLOCK_SLACK_MS, letter
        flags = _quarantined(pg, bad)
        assert all(flags[r].startswith("checksum_mismatch: ") for r in tampered)
        assert all(flags[r].startswith("unknown_workflow: ") for r in unreadable)

        shown = run_ductor(settings, "inspect", tampered[0])
        assert shown.returncode == 1
        assert "QUARANTINED since" in shown.stdout and "checksum_mismatch" in shown.stdout
        shown = run_ductor(settings, "inspect", unreadable[0])
        assert shown.returncode == 1, shown.stderr
        assert "QUARANTINED since" in shown.stdout and "as stored" in shown.stdout

        refused = run_ductor(settings, "runs", "release", lost[0])
        assert refused.returncode == 1 and "is not quarantined" in refused.stderr

        # Repaired, then released: the run goes on from where it was.
        pg.execute(
            "UPDATE eec_workflow_run SET state_checksum = %s WHERE run_id = %s",
            (checksum[0], tampered[0]),
        )
        released = run_ductor(settings, "runs", "release", tampered[0])
        assert released.returncode == 0, released.stderr
        wait_for(
            lambda: run_statuses(pg, [tampered[0]]) == {tampered[0]: "succeeded"},
            60,
            "the repaired run to succeed",
        )
        # Released while still broken: dead-lettered and quarantined again, once.
        released = run_ductor(settings, "runs", "release", tampered[1])
        assert released.returncode == 0, released.stderr
        wait_for(
            lambda: instance.stats.quarantined["checksum_mismatch"] == len(tampered) + 1,
            30,
            "the still-broken run to be quarantined again",
        )
        assert tampered[1] in _quarantined(pg, [tampered[1]])
    finally:
        worker.stop()


def test_a_quarantined_run_that_commits_again_is_unflagged(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """A run flagged, then repaired without `ductor runs release`, and woken: its first
    commit clears the flag, so the sweeps see it (and enforce its deadlines) again."""
    run_id = f"repaired-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    pg.execute(
        "INSERT INTO eec_run_quarantine (run_id, run_version, quarantined_at, reason)"
        " SELECT run_id, db_record_version, now(), 'repaired since' FROM eec_workflow_run"
        " WHERE run_id = %s",
        (run_id,),
    )
    assert _quarantined(pg, [run_id]) == {run_id: "repaired since"}
    processor_thread(settings)
    worker = WorkerThread(settings)
    try:
        wake(settings, [run_id], "t1", "replay")
        wait_for(lambda: count_terminal(pg, [run_id]) == 1, 60, "the run to end")
    finally:
        worker.stop()
    assert run_statuses(pg, [run_id]) == {run_id: "succeeded"}
    assert _quarantined(pg, [run_id]) == {}


def test_a_release_is_not_undone_by_a_flag_decided_before_it(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    """Two batches found the same bad row; the first flagged it, an operator repaired and
    released it, and then the second batch's flag (decided on the row as it was before the
    release) arrives: it is not written."""
    run_id = f"released-{uuid.uuid4().hex[:6]}"
    insert_runs(pg, sample_workflow(), [(run_id, {})], "t1")
    found = load_runs(pg, Definitions(), [run_id])[run_id]
    assert isinstance(found, LoadedRun)
    flag = QuarantineFlag(run_id, "checksum_mismatch: changed out of band", found.version)
    assert quarantine_runs(pg, [flag]) == {run_id}
    assert release_quarantine(pg, run_id)
    assert quarantine_runs(pg, [flag]) == set()  # the second batch's, late
    assert _quarantined(pg, [run_id]) == {}
