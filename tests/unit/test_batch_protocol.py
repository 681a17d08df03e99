"""The batch protocol (core/batch.py) driven with scripted answers, no database: each branch
of a batch's database stage, by the requests it yields and the outcome it returns (the
driver on the real database: tests/integration/test_isolation.py, test_poison.py,
test_lost_commits.py, test_limits.py, test_quarantine.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

import pytest

from processor.core.batch import batch
from processor.core.batch_values import (
    BatchOutcome,
    CommitRuns,
    Decided,
    DeleteOutbox,
    Failed,
    Failure,
    FlagQuarantine,
    ForceFailWritten,
    LoadLimits,
    LoadRuns,
    MeetServer,
    NoteCommitted,
    ProbeDecide,
    ReadBack,
    Request,
    Undecided,
    WakeWaiters,
    WriteForceFail,
)
from processor.core.decide import decide, tick_batch
from processor.core.envelope import Wakeup, decode_wakeup
from processor.core.limit_values import NO_LIMITS, LimitInputs
from processor.core.model import Loaded, LoadedRun, RunInput, StepOutcome, StepResult
from processor.core.outcomes import DeadLetterReason, ForceFailReason, Outcome
from processor.core.plans import BatchItem, DeadLettered, ForceFailed, Rules, TryAgain, payload_of
from processor.core.policy import MAX_IN_PROCESS_TRIES
from processor.core.records import Inbound
from processor.core.run_state import RunStatus, initial_state, state_checksum
from processor.core.workflow import parse_workflow

from .fakes import MAX_BYTES, NAMES, NOW_MS, FakeMessage, accepted, item, loaded, wakeup_message

RULES = Rules(NAMES, livelock_requeues=3)
ACKS = (("done", 1), ("done", 2))
RUNS = [f"r{i}" for i in range(8)]
Answer = Callable[[Request], object]
R = TypeVar("R")


@dataclass
class Script:
    """The database, scripted: the runs it holds, and a hook per kind of request that may
    answer otherwise (a failure) than the default."""

    runs: dict[str, Loaded]
    limits: LimitInputs = NO_LIMITS
    hooks: dict[type, Answer] = field(default_factory=dict)
    asked: list[Request] = field(default_factory=list)

    def answer(self, request: Request) -> object:
        self.asked.append(request)
        hook = self.hooks.get(type(request))
        if hook is not None:
            return hook(request)
        if isinstance(request, MeetServer):
            return ()
        if isinstance(request, LoadRuns):
            return {r: self.runs[r] for r in request.run_ids if r in self.runs}, NOW_MS
        if isinstance(request, LoadLimits):
            return self.limits
        if isinstance(request, CommitRuns):
            return {c.run_id for c in request.commits}, set()
        if isinstance(request, FlagQuarantine):
            return {f.run_id for f in request.flags}
        if isinstance(request, WriteForceFail):
            return ForceFailWritten(True, Counter())
        if isinstance(request, WakeWaiters):
            return (("waiter", "t1"),)  # answers are of the types the protocol casts them to
        return None  # NoteCommitted, ProbeDecide, DeleteOutbox

    def kinds(self) -> list[str]:
        return [type(r).__name__ for r in self.asked]

    def of(self, kind: type[R]) -> list[R]:
        return [r for r in self.asked if isinstance(r, kind)]


def run(
    script: Script, items: Sequence[BatchItem], acknowledged: tuple[tuple[str, int], ...] = ACKS
) -> BatchOutcome:
    """Drive the protocol as engine/stage.py does, answering from the script."""
    protocol = batch(items, acknowledged, RULES, probe_decide=ProbeDecide in script.hooks)
    try:
        request = next(protocol)
        while True:
            request = protocol.send(script.answer(request))
    except StopIteration as done:
        outcome: BatchOutcome = done.value
    return outcome


def decided(outcome: BatchOutcome) -> Decided:
    assert isinstance(outcome, Decided), outcome
    return outcome


def starts(run_ids: Sequence[str]) -> list[BatchItem]:
    return [
        item(r, [accepted(wakeup_message(i, Wakeup(r, "start")))]) for i, r in enumerate(run_ids)
    ]


def fails(failure: Failure, when: Callable[[Request], bool] = lambda _: True) -> Answer:
    """A hook failing the requests ``when`` picks, answering the others as the script would."""

    def hook(request: Request) -> object:
        if when(request):
            return Failed(RuntimeError(f"{failure.value} failure"), failure)
        return Script(dict(HELD)).answer(request)

    return hook


HELD: dict[str, Loaded] = {r: loaded(r) for r in RUNS}


def holding(run_id: str) -> Callable[[Request], bool]:
    def picks(request: Request) -> bool:
        ids = [c.run_id for c in request.commits] if isinstance(request, CommitRuns) else []
        ids += list(request.run_ids) if isinstance(request, LoadLimits) else []
        return run_id in ids

    return picks


# -- loads, commits, conflicts --------------------------------------------------------------


def test_a_batch_loads_ticks_commits_and_notes_its_commit_in_that_order() -> None:
    script = Script({"a": loaded("a"), "b": loaded("b")})
    outcome = decided(run(script, starts(["a", "b"])))
    assert script.kinds() == ["MeetServer", "LoadRuns", "LoadLimits", "CommitRuns", "NoteCommitted"]
    (commit,) = script.of(CommitRuns)
    assert isinstance(commit, CommitRuns) and commit.acknowledged == ACKS
    (noted,) = script.of(NoteCommitted)
    assert isinstance(noted, NoteCommitted) and sorted(noted.runs) == [("a", "t1"), ("b", "t1")]
    assert [p.run_id for p in outcome.plans] == ["a", "b"]
    assert {p.outcome for p in outcome.plans} == {Outcome.COMMITTED}
    assert outcome.commits_sent == 2 and outcome.unacknowledged == ()
    assert outcome.runs.started == {"pair": 2}
    assert (outcome.read_back, outcome.quarantined, outcome.isolated) == (None, (), ())


def test_with_no_run_it_only_deletes_the_acknowledged_rows() -> None:
    script = Script({})
    outcome = decided(run(script, []))
    assert script.kinds() == ["MeetServer", "DeleteOutbox"]
    assert script.of(DeleteOutbox) == [DeleteOutbox(ACKS)] and outcome.plans == ()


def test_the_runs_to_wake_after_a_restart_of_the_database_are_carried_out() -> None:
    script = Script({"a": loaded("a")}, hooks={MeetServer: lambda _: (("x", "t1"),)})
    assert decided(run(script, starts(["a"]))).replay == (("x", "t1"),)


def test_a_lost_race_and_a_held_row_are_plans_never_failures() -> None:
    script = Script({r: loaded(r) for r in "abc"})
    script.hooks[CommitRuns] = lambda _: ({"a"}, {"c"})
    outcome = decided(run(script, starts(["a", "b", "c"])))
    plans = {p.run_id: p.outcome for p in outcome.plans}
    assert plans == {"a": Outcome.COMMITTED, "b": Outcome.CONFLICT, "c": Outcome.LOCKED}
    assert outcome.runs.started == {"pair": 1}  # only what landed is counted


def test_a_noop_commits_nothing_and_a_missing_run_is_dead_lettered() -> None:
    started = tick_batch({"a": loaded("a")}, NOW_MS, NAMES)["a"].state
    script = Script({"a": loaded("a", started)})
    outcome = decided(run(script, starts(["a", "gone"])))
    (commit,) = script.of(CommitRuns)
    assert isinstance(commit, CommitRuns) and commit.commits == ()
    plans = {p.run_id: p for p in outcome.plans}
    assert plans["a"].outcome is Outcome.NOOP
    gone = payload_of(plans["gone"], DeadLettered)
    assert gone.reason is DeadLetterReason.UNKNOWN_RUN and not gone.quarantine
    assert outcome.commits_sent == 0 and not script.of(FlagQuarantine)


# -- failures of the batch, failures of one run ---------------------------------------------


@pytest.mark.parametrize("kind", [LoadRuns, LoadLimits, CommitRuns, MeetServer])
def test_a_database_failure_decides_nothing_and_gives_the_deletions_back(kind: type) -> None:
    script = Script(dict(HELD), hooks={kind: fails(Failure.DATABASE)})
    outcome = run(script, starts(RUNS))
    assert isinstance(outcome, Undecided) and str(outcome.error) == "database failure"
    assert outcome.unacknowledged == ACKS and outcome.isolated == ()
    assert not script.of(FlagQuarantine)


@pytest.mark.parametrize("failure", [Failure.ROW, Failure.UNFORESEEN])
@pytest.mark.parametrize("kind", [CommitRuns, LoadLimits])
def test_one_runs_failure_is_found_by_halving_and_its_run_alone_dead_lettered(
    failure: Failure, kind: type
) -> None:
    script = Script(dict(HELD), hooks={kind: fails(failure, holding("r5"))})
    outcome = decided(run(script, starts(RUNS)))
    # 8 fails: r0-r3 commit, r4-r7 fail: r4-r5 fail: r4 commits, r5 fails alone; r6-r7 commit.
    assert [len(r.run_ids) for r in script.of(LoadRuns)] == [8, 4, 4, 2, 1, 1, 2]
    plans = {p.run_id: p for p in outcome.plans}
    assert list(plans) == RUNS  # one plan per run, in the batch's order
    bad = plans.pop("r5")
    reason = (
        DeadLetterReason.POISON if failure is Failure.ROW else DeadLetterReason.UNEXPECTED_ERROR
    )
    letters = payload_of(bad, DeadLettered)
    assert (bad.outcome, letters.reason, letters.quarantine) == (
        Outcome.DEAD_LETTERED,
        reason,
        True,
    )
    assert letters.detail == f"RuntimeError: {failure.value} failure"
    assert {p.outcome for p in plans.values()} == {Outcome.COMMITTED}
    assert [r for r, _ in outcome.isolated] == ([] if failure is Failure.ROW else ["r5"])
    # The acknowledged rows go with the first half's statements; the lone failed run's
    # statement did not delete them, so they are deleted apart.
    landed = [c for c in script.of(CommitRuns) if "r5" not in {x.run_id for x in c.commits}]
    with_acks = [[x.run_id for x in c.commits] for c in landed if c.acknowledged == ACKS]
    assert with_acks == [RUNS[:4]]
    assert script.of(DeleteOutbox) == [DeleteOutbox(())]
    assert outcome.quarantined == (bad,) and outcome.unacknowledged == ()


def test_a_tick_that_raises_for_one_run_is_found_by_halving_too() -> None:
    runs: dict[str, Loaded] = dict(HELD)
    value: object = 1
    for _ in range(254):  # its first dispatch would carry it one level deeper: 255
        value = [value]
    runs["r2"] = replace(loaded("r2"), input=RunInput(value))
    outcome = decided(run(Script(runs), starts(RUNS)))
    bad = next(p for p in outcome.plans if p.run_id == "r2")
    assert payload_of(bad, DeadLettered).reason is DeadLetterReason.UNEXPECTED_ERROR
    assert bad.quarantine
    assert [r for r, _ in outcome.isolated] == ["r2"]


def test_a_batch_of_one_that_fails_on_its_row_deletes_the_acknowledged_rows_apart() -> None:
    script = Script(dict(HELD), hooks={CommitRuns: fails(Failure.ROW)})
    outcome = decided(run(script, starts(["r1"])))
    assert script.of(DeleteOutbox) == [DeleteOutbox(ACKS)]
    assert payload_of(outcome.plans[0], DeadLettered).reason is DeadLetterReason.POISON


def test_a_plan_that_raises_after_the_commit_is_its_runs_alone() -> None:
    script = Script(dict(HELD))
    script.hooks[ProbeDecide] = fails(Failure.UNFORESEEN, lambda r: r == ProbeDecide("r2"))
    outcome = decided(run(script, starts(RUNS)))
    assert len(script.of(CommitRuns)) == 1  # the commit went: no halving
    assert len(script.of(ProbeDecide)) == len(RUNS)
    assert [r for r, _ in outcome.isolated] == ["r2"]
    reasons = {
        p.run_id: p.payload.reason
        for p in outcome.plans
        if isinstance(p.payload, (DeadLettered, ForceFailed))
    }
    assert reasons == {"r2": DeadLetterReason.UNEXPECTED_ERROR}


# -- a commit whose answer was lost ---------------------------------------------------------


def test_a_lost_commit_is_read_back_and_what_did_not_land_is_tried_again_at_once() -> None:
    script = Script(dict(HELD), hooks={CommitRuns: fails(Failure.LOST)})
    script.hooks[ReadBack] = lambda _: {"r0"}
    outcome = decided(run(script, starts(["r0", "r1"])))
    assert script.kinds()[3:] == ["CommitRuns", "ReadBack", "NoteCommitted"]
    plans = {p.run_id: p for p in outcome.plans}
    assert plans["r0"].outcome is Outcome.COMMITTED
    assert (plans["r1"].outcome, payload_of(plans["r1"], TryAgain).retry_in_ms) == (
        Outcome.ERROR,
        0,
    )
    assert outcome.read_back is not None and outcome.read_back.not_landed == {"r1"}
    assert outcome.unacknowledged == ACKS  # the deletions went with the lost statement
    assert outcome.runs.started == {"pair": 1}


def test_a_lost_commit_that_landed_whole_gives_nothing_back() -> None:
    script = Script(dict(HELD), hooks={CommitRuns: fails(Failure.LOST)})
    script.hooks[ReadBack] = lambda r: {c.run_id for c in r.commits}  # type: ignore[union-attr]
    outcome = decided(run(script, starts(["r0", "r1"])))
    assert outcome.read_back is not None and outcome.read_back.not_landed == frozenset()
    assert outcome.unacknowledged == ()


def test_a_lost_commit_that_cannot_be_read_back_decides_nothing() -> None:
    script = Script(dict(HELD), hooks={CommitRuns: fails(Failure.LOST)})
    script.hooks[ReadBack] = fails(Failure.LOST)
    outcome = run(script, starts(["r0", "r1"]))
    assert isinstance(outcome, Undecided) and outcome.unacknowledged == ACKS


# -- force-fails ----------------------------------------------------------------------------


def _livelocked() -> BatchItem:
    """Run ``r``'s work after ``livelock_requeues`` requeues with no progress: its next lost
    race force-fails it (core/policy.py)."""
    message = wakeup_message(1, Wakeup("r", "start"))
    run_ = loaded("r")
    for _ in range(RULES.livelock_requeues):
        records = [_due(message)]
        commit = tick_batch({"r": run_}, NOW_MS, NAMES)["r"]
        work = item("r", records, MAX_IN_PROCESS_TRIES - 1)
        (send,) = decide(work, run_, commit, False, NOW_MS, RULES).sends
        message = FakeMessage(send.topic, 1, send.value, key_=send.key)
    return item("r", [_due(message)], MAX_IN_PROCESS_TRIES - 1)


def _due(message: FakeMessage) -> Inbound:
    wakeup = decode_wakeup(message.value(), MAX_BYTES)
    assert isinstance(wakeup, Wakeup)
    return accepted(message, now_ms=max(NOW_MS, wakeup.due_at or 0))


def _lost_race(written: Answer | None = None) -> tuple[Script, Decided]:
    script = Script({"r": loaded("r")}, hooks={CommitRuns: lambda _: (set(), set())})
    if written is not None:
        script.hooks[WriteForceFail] = written
    return script, decided(run(script, [_livelocked()]))


def test_a_livelocked_run_is_force_failed_and_counted_as_ended() -> None:
    script, outcome = _lost_race()
    (plan,) = outcome.plans
    assert plan.outcome is Outcome.FORCE_FAILED
    assert payload_of(plan, ForceFailed).reason is ForceFailReason.LIVELOCK
    assert len(script.of(WriteForceFail)) == 1
    assert outcome.runs.ended == {("pair", RunStatus.FAILED): 1}


def test_a_force_fail_that_finds_the_run_moved_is_refused() -> None:
    _script, outcome = _lost_race(lambda _: ForceFailWritten(False, Counter()))
    (plan,) = outcome.plans
    assert (plan.outcome, plan.payload) == (Outcome.CONFLICT, TryAgain(0, 0))
    assert not outcome.runs


def test_a_force_fail_the_database_failed_is_retried_and_its_error_kept() -> None:
    _script, outcome = _lost_race(fails(Failure.DATABASE))
    (plan,) = outcome.plans
    assert plan.outcome is Outcome.ERROR and set(outcome.force_fail_errors) == {"r"}


def test_a_force_fail_that_raises_what_nobody_foresaw_is_its_runs_alone() -> None:
    _script, outcome = _lost_race(fails(Failure.UNFORESEEN))
    (plan,) = outcome.plans
    assert payload_of(plan, DeadLettered).reason is DeadLetterReason.UNEXPECTED_ERROR
    assert plan.quarantine
    assert [r for r, _ in outcome.isolated] == ["r"] and not outcome.force_fail_errors


# -- quarantines ----------------------------------------------------------------------------


def _tampered() -> Script:
    return Script({"a": loaded("a"), "bad": loaded("bad", tampered=True)})


def test_a_run_whose_row_cannot_be_used_is_flagged_after_the_plans() -> None:
    script = _tampered()
    outcome = decided(run(script, starts(["a", "bad"])))
    assert script.kinds()[-1] == "FlagQuarantine"
    (flag,) = script.of(FlagQuarantine)
    assert isinstance(flag, FlagQuarantine) and [f.run_id for f in flag.flags] == ["bad"]
    assert flag.flags[0].why.startswith("checksum_mismatch: ")
    assert [p.run_id for p in outcome.quarantined] == ["bad"]


def test_a_run_flagged_already_is_not_counted_again() -> None:
    script = _tampered()
    script.hooks[FlagQuarantine] = lambda _: set()
    assert decided(run(script, starts(["a", "bad"]))).quarantined == ()


@pytest.mark.parametrize("failure", [Failure.DATABASE, Failure.UNFORESEEN])
def test_flags_that_cannot_be_written_fail_nothing(failure: Failure) -> None:
    script = _tampered()
    script.hooks[FlagQuarantine] = fails(failure)
    outcome = decided(run(script, starts(["a", "bad"])))
    assert len(outcome.plans) == 2 and outcome.quarantined == ()
    if failure is Failure.DATABASE:
        assert outcome.quarantine_error is not None and outcome.isolated == ()
    else:
        assert outcome.quarantine_error is None
        assert [r for r, _ in outcome.isolated] == ["the quarantine flags"]


# -- limits ---------------------------------------------------------------------------------

API = parse_workflow(
    {
        "name": "w",
        "version": 1,
        "steps": [
            {"name": "a", "type": "x", "concurrency": {"limit": 1, "name": "api"}},
            {"name": "b", "type": "y", "depends_on": ["a"]},
        ],
    }
)


def _freeing() -> Script:
    """Run ``r`` whose step ``a`` ended: its commit frees the slot ``a`` held."""
    state = initial_state(API)
    fresh = LoadedRun("r", API, state, 1, "t1", stored_checksum=state_checksum(state))
    first = tick_batch({"r": fresh}, NOW_MS, NAMES, NO_LIMITS)["r"].state
    result = StepResult("a", 1, StepOutcome.SUCCEEDED)
    run_ = LoadedRun("r", API, first, 2, "t1", stored_checksum=state_checksum(first))
    return Script({"r": replace(run_, results=(result,))})


def test_slots_freed_by_the_commit_wake_their_waiters() -> None:
    script = _freeing()
    outcome = decided(run(script, starts(["r"])))
    (wake,) = script.of(WakeWaiters)
    assert isinstance(wake, WakeWaiters) and dict(wake.freed) == {"c/api/": 1}
    assert outcome.limit_wakes == (("waiter", "t1"),)


def test_slots_a_force_fail_gave_back_wake_their_waiters() -> None:
    script, outcome = _lost_race(lambda _: ForceFailWritten(True, Counter({"w/k/": 1})))
    (wake,) = script.of(WakeWaiters)
    assert dict(wake.freed) == {"w/k/": 1}
    assert outcome.plans[0].outcome is Outcome.FORCE_FAILED
    assert outcome.limit_wakes == (("waiter", "t1"),)


def test_a_force_fail_that_gave_back_nothing_wakes_nobody() -> None:
    script, outcome = _lost_race()
    assert not script.of(WakeWaiters) and outcome.limit_wakes == ()


def test_each_half_of_a_bisected_batch_wakes_the_waiters_of_what_it_freed() -> None:
    """``r`` and ``s`` free a slot each; ``bad`` makes the commit fail, so the batch is
    halved ([r], [s, bad], then [s], [bad]): the waiters of both halves' slots are woken."""
    freeing = _freeing().runs["r"]
    assert isinstance(freeing, LoadedRun)
    runs: dict[str, Loaded] = {
        "r": freeing,
        "s": replace(freeing, run_id="s"),
        "bad": loaded("bad"),
    }
    woken = iter(range(10))

    def commit(request: Request) -> object:
        assert isinstance(request, CommitRuns)
        if "bad" in {c.run_id for c in request.commits}:
            return Failed(RuntimeError("row failure"), Failure.ROW)
        return {c.run_id for c in request.commits}, set()

    script = Script(
        runs,
        hooks={CommitRuns: commit, WakeWaiters: lambda _: ((f"waiter-{next(woken)}", "t1"),)},
    )
    outcome = decided(run(script, starts(["r", "s", "bad"])))
    assert len(script.of(WakeWaiters)) == 2
    assert outcome.limit_wakes == (("waiter-0", "t1"), ("waiter-1", "t1"))


def test_a_commit_that_did_not_land_frees_nothing() -> None:
    script = _freeing()
    script.hooks[CommitRuns] = lambda _: (set(), set())
    decided(run(script, starts(["r"])))
    assert not script.of(WakeWaiters)


@pytest.mark.parametrize("failure", [Failure.DATABASE, Failure.UNFORESEEN])
def test_waiters_that_cannot_be_read_fail_nothing(failure: Failure) -> None:
    script = _freeing()
    script.hooks[WakeWaiters] = fails(failure)
    outcome = decided(run(script, starts(["r"])))
    assert outcome.plans[0].outcome is Outcome.COMMITTED and outcome.limit_wakes == ()
    isolated = [r for r, _ in outcome.isolated]
    assert isolated == ([] if failure is Failure.DATABASE else ["the waiters of freed limits"])


def test_what_the_limits_held_back_and_let_in_is_reported() -> None:
    charge = parse_workflow(
        {
            "name": "w",
            "version": 1,
            "steps": [{"name": "c", "type": "c", "concurrency": {"limit": 1, "name": "pay"}}],
        }
    )
    state = initial_state(charge)
    runs: Mapping[str, Loaded] = {
        r: LoadedRun(r, charge, state, 1, "t1", stored_checksum=state_checksum(state))
        for r in ("x", "y")
    }
    outcome = decided(run(Script(dict(runs)), starts(["x", "y"])))
    assert outcome.limit_refused == ("pay",)  # one slot: the second dispatch waits


def test_a_batch_is_judged_no_earlier_than_its_counters_were_read() -> None:
    """The counters were read 500 ms after the runs were loaded (another instance may have
    counted a dispatch meanwhile): the batch is judged at the later time (core/limits.py,
    rule 5), here seen in its dispatches' deadlines; with no counter read, at its load's."""

    def due_of(limits: LimitInputs) -> int | None:
        script = Script({"a": loaded("a")}, limits=limits)
        decided(run(script, starts(["a"])))
        (commit,) = script.of(CommitRuns)
        (write,) = commit.commits
        return next(n.due_ms for _, n in write.state.nodes if n.due_ms is not None)

    at_load = due_of(NO_LIMITS)
    assert at_load is not None
    assert due_of(LimitInputs({}, {}, NOW_MS + 500)) == at_load + 500
    assert due_of(LimitInputs({}, {}, NOW_MS - 500)) == at_load  # never earlier than the load
