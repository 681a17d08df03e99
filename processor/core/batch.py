"""The database stage of a batch (steps 1 to 3 of the commit path, engine/executor.py) as a
protocol: ``batch`` is a generator that yields each request to the database and is sent its
answer (core/batch_values.py), and returns what the batch came to. It does no I/O: the driver
(engine/stage.py) carries out each request and sends the answer back, as psycopg's
``generators.py`` are driven by its ``waiting.py``; a unit test drives it with scripted
answers. The rules it keeps:

1. Load every run of the batch in one query, and what its limited steps count on.
2. Tick each run (pure, ``tick_batch``); a no-op writes nothing.
3. Commit every changed run in one conditional UPDATE that also deletes the acknowledged
   outbox rows; a commit whose answer was lost with its connection is read back (a run at the
   version and checksum the commit wrote landed; the others did not, nor did the deletions).
   Then each run's plan is decided (``decide``); a livelocked run's force-fail is written.
4. One run never holds its batch: a failure that is one run's own (a row the database
   refused, an exception that is no database error, met before the commit went) is tried
   again on each half of the batch, down to the run that makes it fail, which is
   dead-lettered and quarantined (``poisoned``, ``failed_unexpectedly``). After the commit an
   exception is its run's alone. Any other failure is the database's: nothing is decided
   (``Undecided``), and the batch is retried whole.
5. The runs whose rows the plans found unusable are flagged; a flag that cannot be written
   fails nothing (it is written when the run is met again). So are the waiters of freed
   limit slots woken, the slots a landed commit gave back and those a force-fail's write
   did (a waiter not woken looks again by itself: core/limits.py, BACKSTOP_MS).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Mapping, Sequence
from typing import cast

from processor.core.batch_values import (
    ITEM_FAILURES,
    Acknowledged,
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
    QuarantineFlag,
    ReadBack,
    ReadBackResult,
    Request,
    RunTiers,
    Undecided,
    WakeWaiters,
    WriteForceFail,
)
from processor.core.decide import (
    database_failed,
    decide,
    failed_unexpectedly,
    force_fail_refused,
    poisoned,
    tick_batch,
)
from processor.core.limit_values import LimitInputs
from processor.core.model import Loaded, LoadedRun
from processor.core.outcomes import Outcome
from processor.core.plans import (
    BatchItem,
    Commit,
    DeadLettered,
    ForceFailed,
    Plan,
    Rules,
    payload_of,
)
from processor.core.run_tally import RunTally

Protocol = Generator[Request, object, BatchOutcome]
_MEET = MeetServer()


class RequestFailed(Exception):
    """Raised inside the protocol when a request was answered ``Failed``."""

    def __init__(self, failed: Failed) -> None:
        super().__init__(failed.error)
        self.failed = failed


def describe(exc: BaseException) -> str:
    """What a dead letter says of an exception nobody foresaw: its type and the first line of
    its text (a database error's runs on with hints)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else type(exc).__name__}"


class _Gathered:
    """What the rounds of one batch found, frozen into its outcome at the end."""

    __slots__ = (
        "commits_sent",
        "force_fail_errors",
        "force_freed",
        "isolated",
        "limit_refused",
        "limit_waited",
        "limit_wakes",
        "not_landed",
        "plans",
        "read_back_error",
        "runs",
    )

    def __init__(self) -> None:
        self.plans: list[Plan] = []
        self.isolated: list[tuple[str, Exception]] = []
        self.runs = RunTally()
        self.commits_sent = 0
        self.read_back_error: Exception | None = None
        self.not_landed: set[str] = set()
        self.force_fail_errors: dict[str, Exception] = {}
        self.force_freed: Counter[str] = Counter()  # slots this round's force-fails gave back
        self.limit_wakes: RunTiers = ()
        self.limit_waited: list[tuple[str, int]] = []
        self.limit_refused: list[str] = []


def _ask(request: Request) -> Generator[Request, object, object]:
    """Yield ``request``; its answer, or RequestFailed when it failed."""
    answer = yield request
    if isinstance(answer, Failed):
        raise RequestFailed(answer)
    return answer


def _cause(exc: Exception) -> tuple[Exception, Failure]:
    """The error a failure of the batch is about, and what it means: a request's as the
    driver classified it; the protocol's own (a tick that raises) is no database error."""
    if isinstance(exc, RequestFailed):
        return exc.failed.error, exc.failed.failure
    return exc, Failure.UNFORESEEN


def batch(
    items: Sequence[BatchItem],
    acknowledged: Acknowledged,
    rules: Rules,
    probe_decide: bool = False,
) -> Protocol:
    """Steps 1 to 3 for ``items``, deleting the ``acknowledged`` outbox rows on the way; with
    no run to tick, it only deletes the rows. ``probe_decide``: ask the ``decide`` fault point
    before each run's plan (tests only)."""
    gathered = _Gathered()
    replay: RunTiers = ()
    try:
        met = yield _MEET
        if isinstance(met, Failed):
            raise RequestFailed(met)
        replay = cast(RunTiers, met)
        if items:
            yield from _isolating(items, acknowledged, rules, probe_decide, gathered)
        else:
            yield from _ask(DeleteOutbox(acknowledged))
    except Exception as failed:  # the database's, or no run's own: the batch is retried whole
        error = _cause(failed)[0]
        isolated = tuple(gathered.isolated)
        return Undecided(error, replay, isolated, gathered.runs, acknowledged)
    quarantined, quarantine_error = yield from _quarantine(gathered)
    read_back = None
    if gathered.read_back_error is not None:
        read_back = ReadBackResult(gathered.read_back_error, frozenset(gathered.not_landed))
    return Decided(
        plans=tuple(gathered.plans),
        replay=replay,
        isolated=tuple(gathered.isolated),
        runs=gathered.runs,
        unacknowledged=acknowledged if gathered.not_landed else (),
        commits_sent=gathered.commits_sent,
        read_back=read_back,
        force_fail_errors=gathered.force_fail_errors,
        quarantined=quarantined,
        quarantine_error=quarantine_error,
        limit_wakes=gathered.limit_wakes,
        limit_waited=tuple(gathered.limit_waited),
        limit_refused=tuple(gathered.limit_refused),
    )


def _isolating(
    items: Sequence[BatchItem],
    acknowledged: Acknowledged,
    rules: Rules,
    probe: bool,
    gathered: _Gathered,
) -> Generator[Request, object, None]:
    """Steps 1 to 3; a failure that is one run's own is tried again on each half of the
    batch, down to the run that makes it fail (rule 4)."""
    try:
        yield from _steps(items, acknowledged, rules, probe, gathered)
    except Exception as failed:
        error, failure = _cause(failed)
        if failure not in ITEM_FAILURES:
            raise
        if len(items) == 1:
            yield from _ask(DeleteOutbox(acknowledged))  # the failed statement did not
            item = items[0]
            if failure is Failure.ROW:
                gathered.plans.append(poisoned(item, describe(error), rules))
            else:
                gathered.isolated.append((item.run_id, error))
                gathered.plans.append(failed_unexpectedly(item, describe(error), rules))
            return
        half = len(items) // 2
        yield from _isolating(items[:half], acknowledged, rules, probe, gathered)
        yield from _isolating(items[half:], (), rules, probe, gathered)


def _steps(
    items: Sequence[BatchItem],
    acknowledged: Acknowledged,
    rules: Rules,
    probe: bool,
    gathered: _Gathered,
) -> Generator[Request, object, None]:
    run_ids = tuple(item.run_id for item in items)
    # 1. Load, at Postgres's time: the batch is judged by it (io/postgres/db_clock.py).
    answer = yield LoadRuns(run_ids)
    if isinstance(answer, Failed):
        raise RequestFailed(answer)
    loaded, now_ms = cast("tuple[Mapping[str, Loaded], int]", answer)
    # 2. Tick (with what the batch's limited steps count on: core/limits.py).
    answer = yield LoadLimits(run_ids, loaded)
    if isinstance(answer, Failed):
        raise RequestFailed(answer)
    limits = cast(LimitInputs, answer)
    # Judged no earlier than the counters were read (core/limits.py, rule 5).
    now_ms = max(now_ms, limits.now_ms)
    commits = tick_batch(loaded, now_ms, rules.names, limits)
    # 3. Commit.
    writes = tuple(commits.values())
    not_landed: set[str] = set()
    answered = yield CommitRuns(writes, acknowledged)
    if isinstance(answered, Failed):
        if answered.failure is not Failure.LOST:
            raise RequestFailed(answered)  # refused: nothing was written
        landed = cast("set[str]", (yield from _ask(ReadBack(writes))))
        gathered.read_back_error = answered.error
        not_landed = {c.run_id for c in writes} - landed
        gathered.not_landed |= not_landed
        committed, held = landed, set[str]()
    else:
        committed, held = cast("tuple[set[str], set[str]]", answered)
    tiers = []
    for run_id in committed:
        run = loaded.get(run_id)
        if isinstance(run, LoadedRun):
            tiers.append((run_id, run.tier))
    noted = yield NoteCommitted(frozenset(committed), tuple(tiers))
    if isinstance(noted, Failed):
        raise RequestFailed(noted)
    gathered.commits_sent += len(commits)
    yield from _after_limits(commits, committed, gathered)
    yield from _plans(
        items, loaded, commits, (committed, held, not_landed), now_ms, rules, probe, gathered
    )
    freed, gathered.force_freed = gathered.force_freed, Counter()
    yield from _wake_waiters(freed, gathered)


def _plans(
    items: Sequence[BatchItem],
    loaded: Mapping[str, Loaded],
    commits: Mapping[str, Commit],
    answered: tuple[set[str], set[str], set[str]],
    now_ms: int,
    rules: Rules,
    probe: bool,
    gathered: _Gathered,
) -> Generator[Request, object, None]:
    """Each run's plan once the commit answered (``answered``: the runs it committed, those
    whose row another transaction held, those lost with its connection), its force-fail
    written. The commit went: from here an exception is one run's own, never the batch's (a
    bisection would only tick again what committed)."""
    committed, held, not_landed = answered
    for item in items:
        run_id = item.run_id
        try:
            if run_id in not_landed:  # lost with its connection: try again at once
                plan = database_failed(item, 0)
            else:
                if probe:
                    probed = yield ProbeDecide(run_id)
                    if isinstance(probed, Failed):
                        raise probed.error
                found, commit = loaded.get(run_id), commits.get(run_id)
                landed, was_held = run_id in committed, run_id in held
                plan = decide(item, found, commit, landed, now_ms, rules, was_held)
                if isinstance(plan.payload, ForceFailed):
                    plan = yield from _force_fail(item, plan, plan.payload, found, gathered)
                elif plan.outcome is Outcome.COMMITTED:
                    assert commit is not None and isinstance(found, LoadedRun)
                    # Only a commit that landed is counted: a conflict, or a commit lost with
                    # its connection and not found landed, never gets here (run_tally.py).
                    gathered.runs.committed(found.wf.name, found.state.status, commit.state.status)
        except Exception as unforeseen:
            gathered.isolated.append((run_id, unforeseen))
            plan = failed_unexpectedly(item, describe(unforeseen), rules)
        gathered.plans.append(plan)


def _force_fail(
    item: BatchItem, plan: Plan, failed: ForceFailed, found: Loaded | None, gathered: _Gathered
) -> Generator[Request, object, Plan]:
    """A livelocked run's terminal write, before its plan holds."""
    assert isinstance(found, LoadedRun)
    written = yield WriteForceFail(failed.write)
    if isinstance(written, Failed):
        if written.failure is Failure.UNFORESEEN:
            raise written.error
        gathered.force_fail_errors[item.run_id] = written.error
        return database_failed(item, 0)  # the delay is the outage's (the executor's)
    done = cast(ForceFailWritten, written)
    if not done.written:
        return force_fail_refused(plan)
    gathered.runs.force_failed(found.wf.name)
    gathered.force_freed.update(done.freed)
    return plan


def _after_limits(
    commits: Mapping[str, Commit], committed: set[str], gathered: _Gathered
) -> Generator[Request, object, None]:
    """The waiters to wake for the slots the landed commits freed, and how long those let in
    had waited."""
    freed: Counter[str] = Counter()
    for run_id in committed:
        commit = commits.get(run_id)
        limits = commit.limits if commit is not None else None
        if limits is not None:
            freed.update(limits.released)
            gathered.limit_waited += limits.waited
            gathered.limit_refused += limits.refused
    yield from _wake_waiters(freed, gathered)


def _wake_waiters(freed: Counter[str], gathered: _Gathered) -> Generator[Request, object, None]:
    """The oldest waiters of the ``freed`` slots, added to the batch's wakes (each half of a
    bisected batch adds its own). A failure to read them fails nothing (rule 5)."""
    if not freed:
        return
    answer = yield WakeWaiters(freed)
    if not isinstance(answer, Failed):
        gathered.limit_wakes += cast(RunTiers, answer)
    elif answer.failure is Failure.UNFORESEEN:  # counted and logged, it fails nothing
        gathered.isolated.append(("the waiters of freed limits", answer.error))


def _quarantine(
    gathered: _Gathered,
) -> Generator[Request, object, tuple[tuple[Plan, ...], Exception | None]]:
    """Flag the runs whose rows the plans found unusable: the plans flagged, or the error that
    kept them from being written (rule 5)."""
    flagged = [p for p in gathered.plans if p.quarantine]
    if not flagged:
        return (), None
    flags = tuple(_flag(p, payload_of(p, DeadLettered)) for p in flagged)
    answer = yield FlagQuarantine(flags)
    if isinstance(answer, Failed):
        if answer.failure is Failure.UNFORESEEN:  # counted and logged, it fails nothing
            gathered.isolated.append(("the quarantine flags", answer.error))
            return (), None
        return (), answer.error
    done = cast("set[str]", answer)
    return tuple(p for p in flagged if p.run_id in done), None


def _flag(plan: Plan, letters: DeadLettered) -> QuarantineFlag:
    return QuarantineFlag(plan.run_id, f"{letters.reason}: {letters.detail}", plan.expected_version)


__all__ = ["Protocol", "RequestFailed", "batch", "describe"]
