"""The database stage isolates one run's exception from its batch (engine/stage.py), with a
database that answers from memory (the real one: tests/integration/test_isolation.py): a tick
that raises for one run (a fault point, or an input nested deeper than the step task's
encoder writes), and a commit whose encoding raises for one run, are each tried on halves of
the batch down to that run, which is dead-lettered and quarantined while the others commit;
a plan that raises after the commit is its run's alone; a database error is still the batch's."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import psycopg
import pytest

from processor.core.batch_values import Decided, QuarantineFlag, Undecided
from processor.core.envelope import Wakeup
from processor.core.limit_values import NO_LIMITS, LimitInputs
from processor.core.model import Loaded, RunInput
from processor.core.outcomes import DeadLetterReason, Outcome
from processor.core.plans import BatchItem, Commit, DeadLettered, Rules, payload_of
from processor.core.shapes import OutboxKey
from processor.engine import database as database_module
from processor.engine.database import Database
from processor.engine.stage import DatabaseStage
from processor.io.postgres.db_clock import DatabaseClock
from processor.io.postgres.store import CommitAnswer, commit_params
from processor.io.runtime.faults import NO_FAULTS, Faults

from .fakes import NAMES, NOW_MS, accepted, item, loaded, wakeup_message

RULES = Rules(NAMES, livelock_requeues=3)
# A compiled class cannot be derived from in Python: with the compiled build, the real
# database's test (tests/integration/test_isolation.py) stands for these.
pytestmark = pytest.mark.skipif(
    not str(database_module.__file__).endswith(".py"),
    reason="the compiled Database cannot be derived from in Python",
)


def _nested(levels: int) -> object:
    value: object = 1
    for _ in range(levels):
        value = [value]
    return value


class MemoryDatabase(Database):
    """Answers the stage from memory; its commit encodes its parameters as the real one does
    (store.commit_params), and fails the batch with ``error`` when given one."""

    def __init__(self, runs: dict[str, Loaded], error: psycopg.Error | None = None) -> None:
        super().__init__("postgresql://nobody@127.0.0.1:1/none")
        self.runs = runs
        self.error = error
        self.committed: list[str] = []
        self.flagged: list[QuarantineFlag] = []
        self.poison_commit: str | None = None  # a run whose row the commit cannot encode

    def server_started(self) -> object:
        return "always"

    def load_at(self, run_ids: Sequence[str]) -> tuple[dict[str, Loaded], int]:
        if self.error is not None:
            raise self.error
        return {r: self.runs[r] for r in run_ids if r in self.runs}, NOW_MS

    def load_limits(self, loaded: object) -> LimitInputs:
        return NO_LIMITS

    def commit(self, commits: Sequence[Commit], acknowledged: Sequence[OutboxKey]) -> CommitAnswer:
        commit_params(commits, acknowledged, None)  # raises on what cannot be encoded
        if any(c.run_id == self.poison_commit for c in commits):
            raise TypeError("Recursion limit reached")  # as orjson does, encoding it
        self.committed += [c.run_id for c in commits]
        return CommitAnswer({c.run_id for c in commits}, set())

    def delete_outbox(self, acknowledged: Sequence[OutboxKey]) -> None:
        pass

    def quarantine(self, runs: Sequence[QuarantineFlag]) -> set[str]:
        self.flagged += runs
        return {r.run_id for r in runs}

    def close(self) -> None:
        pass


def _batch(run_ids: list[str]) -> list[BatchItem]:
    return [
        item(r, [accepted(wakeup_message(i, Wakeup(r, "start")))]) for i, r in enumerate(run_ids)
    ]


def _stage(db: Database, faults: Faults = NO_FAULTS) -> DatabaseStage:
    return DatabaseStage(db, RULES, DatabaseClock(lambda: NOW_MS), faults)


RUNS = [f"r{i}" for i in range(8)]


@pytest.mark.parametrize("how", ["fault", "deep input", "commit encoding"])
def test_one_runs_exception_is_isolated_from_its_batch(how: str) -> None:
    runs: dict[str, Loaded] = {r: loaded(r) for r in RUNS}
    db = MemoryDatabase(runs)
    faults = NO_FAULTS
    if how == "fault":
        faults = Faults.from_spec("tick=raise:r5")
    elif how == "deep input":  # its first dispatch would carry it one level deeper: 255
        runs["r5"] = replace(loaded("r5"), input=RunInput(_nested(254)))
    else:
        db.poison_commit = "r5"
    result = _stage(db, faults).run(_batch(RUNS), []).outcome
    assert isinstance(result, Decided)
    plans = {p.run_id: p for p in result.plans}
    assert list(plans) == RUNS  # one plan per run, in the batch's order
    bad = plans["r5"]
    assert bad.outcome is Outcome.DEAD_LETTERED and bad.quarantine
    letters = payload_of(bad, DeadLettered)
    assert letters.reason is DeadLetterReason.UNEXPECTED_ERROR and len(bad.sends) == 1
    assert letters.detail.startswith(("Exception:", "TypeError:")), letters.detail
    assert [r for r, _ in result.isolated] == ["r5"]
    assert {p.outcome for r, p in plans.items() if r != "r5"} == {Outcome.COMMITTED}
    assert sorted(db.committed) == sorted(r for r in RUNS if r != "r5")
    assert [f.run_id for f in db.flagged] == ["r5"] and result.quarantined == (bad,)


def test_a_plan_that_raises_after_the_commit_is_its_runs_alone() -> None:
    db = MemoryDatabase({r: loaded(r) for r in RUNS})
    result = _stage(db, Faults.from_spec("decide=raise:r2")).run(_batch(RUNS), []).outcome
    assert isinstance(result, Decided)
    assert sorted(db.committed) == sorted(RUNS)  # one statement: the batch is not tried again
    plans = {p.run_id: p for p in result.plans}
    assert payload_of(plans["r2"], DeadLettered).reason is DeadLetterReason.UNEXPECTED_ERROR
    assert plans["r2"].quarantine
    assert [r for r, _ in result.isolated] == ["r2"]
    assert sum(p.outcome is Outcome.COMMITTED for p in plans.values()) == len(RUNS) - 1


def test_a_database_error_is_still_the_batchs_and_isolates_no_one() -> None:
    db = MemoryDatabase({r: loaded(r) for r in RUNS}, error=psycopg.OperationalError("gone"))
    result = _stage(db).run(_batch(RUNS), []).outcome
    assert isinstance(result, Undecided) and isinstance(result.error, psycopg.OperationalError)
    assert result.isolated == () and db.flagged == []
