"""What becomes of each run's wakeups, decided as frozen plans the shell carries out.

A batch goes through the commit path (engine/executor.py). Between its database steps, the
decisions are made here, without I/O, clock or randomness:

- ``tick_batch``: the tick of every loaded run, and the rows to commit with the records each
  transition must produce (step dispatches, retry timers), which go into the outbox in the
  same statement (step 2);
- ``decide``: once the commit answered, one ``Plan`` per run (core/plans.py: a record with
  one payload per kind of outcome): which records to produce (the transition's, a requeue,
  dead letters), whether to try again after a backoff, whether to force-fail;
  ``force_fail_refused`` when that write found the run moved on;
- ``reject``, ``hop`` and ``database_failed``: the plans for a record refused at intake, a
  timer that must travel on, and a batch the database could not serve;
- ``poisoned`` and ``failed_unexpectedly``: a run isolated from its batch because a statement
  failed on what it holds, or because handling it raised what nobody foresaw (the shell
  catches the exception; the plan is decided here).

Rules, in the order ``decide`` applies them:

1. A run that does not exist, whose workflow is not registered, or whose row was changed out of
   band (unreadable, or its checksum does not match) is never ticked: its records are
   dead-lettered, and the row is never overwritten.
2. A tick that changes nothing is a no-op: nothing is written, nothing produced.
3. A committed tick produces its step dispatches and retry timers.
4. A conflict (the commit matched no row) is retried in process after the policy's backoff,
   each try from freshly loaded state; when those tries are used up, the run is
   requeued to the delay ladder or, after too many non-progressing requeues, force-failed
   (policy.py). A conflict is never an error.
5. A run whose row another transaction held (an operator's lock, a repair script) was skipped
   by the commit: it is retried after a backoff that grows while the lock lasts, apart from
   its batch, neither a conflict (it lost no race, so it never counts towards a force-fail)
   nor an error (``locked``).
6. A database error decides nothing: the run is retried after the shell's backoff.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from processor.core.backoff import retry_delay_s
from processor.core.children import ChildStart, children_started, children_to_cancel
from processor.core.dataflow import output_refs
from processor.core.effects import (
    child_wakeups,
    dead_letter_sends,
    parent_wakeup,
    timer,
    transition_sends,
    wakeup_send,
)
from processor.core.envelope import Wakeup
from processor.core.limit_values import NO_LIMITS, LimitInputs, RunLimits
from processor.core.limits import admit
from processor.core.model import Loaded, LoadedRun, UnknownWorkflow, UnreadableRun
from processor.core.outcomes import DeadLetterReason, ForceFailReason, Outcome
from processor.core.plans import (
    NOTHING,
    BatchItem,
    Commit,
    DeadLettered,
    ForceFailed,
    ForceFailWrite,
    Plan,
    Produce,
    Requeue,
    Rules,
    TryAgain,
)
from processor.core.policy import ForceFail, after_exhausted_conflicts, retry_wait_ms
from processor.core.records import Inbound
from processor.core.routing import TopicNames
from processor.core.run_ends import force_fail
from processor.core.tick import tick_run
from processor.core.tick_decision import Decision

# -- step 2: tick ---------------------------------------------------------------------------


def tick_batch(
    loaded: Mapping[str, Loaded],
    now_ms: int,
    names: TopicNames,
    limits: LimitInputs = NO_LIMITS,
) -> dict[str, Commit]:
    """The tick of every run that can be ticked: the rows to commit, by run id, for the runs
    whose state changed (a run that can be ticked and is absent here was a no-op). The
    dispatches of steps with limits hold only within them, decided across the batch
    (core/limits.py, from ``limits``: what the shell loaded for them)."""
    decided: list[tuple[LoadedRun, Decision]] = []
    limited: list[tuple[LoadedRun, Decision]] = []
    for run in loaded.values():
        if not isinstance(run, LoadedRun) or not run.checksum_ok:
            continue
        decision = tick_run(run, now_ms)
        if decision.new_state is not None:
            (limited if run.wf.has_limits else decided).append((run, decision))
    run_limits: dict[str, RunLimits] = {}
    if limited:
        held, run_limits = admit(limited, limits, now_ms)
        decided += [(run, held[run.run_id]) for run, _ in limited]
    commits: dict[str, Commit] = {}
    for run, decision in decided:
        new_state = decision.new_state
        if new_state is None:
            continue
        run_id = run.run_id
        effects = transition_sends(run, decision, now_ms, names)
        output = output_refs(run.wf, new_state)
        started: list[ChildStart] = []
        cancelled: list[str] = []
        if run.wf.has_children:
            started = children_started(run_id, run.wf, run.state, new_state)
            cancelled = children_to_cancel(run_id, run.wf, run.state, new_state)
            effects += child_wakeups(run, started, cancelled, now_ms, names)
        if run.parent is not None and new_state.status.terminal:
            effects += parent_wakeup(run, now_ms, names)
        commits[run_id] = Commit(
            run_id,
            run.version,
            new_state,
            effects,
            output,
            decision.signalled,
            tuple(started),
            tuple(cancelled),
            decision.mapped,
            run_limits.get(run_id),
            decision.items_done,
            decision.unstarted,
            decision.settled,
        )
    return commits


# -- after step 3: the plan of each run -----------------------------------------------------


def decide(
    item: BatchItem,
    loaded: Loaded | None,
    commit: Commit | None,
    committed: bool,
    now_ms: int,
    rules: Rules,
    held: bool = False,
) -> Plan:
    """The plan for one run of a batch once its commit (``None``: the tick was a no-op)
    answered (``committed``: the row matched its expected version; ``held``: the commit
    skipped the row, another transaction held it)."""
    if loaded is None:
        reason, detail = DeadLetterReason.UNKNOWN_RUN, f"run {item.run_id!r} does not exist"
        return _dead_letter(item.run_id, item.records, reason, detail, rules)
    if isinstance(loaded, UnknownWorkflow):
        reason = DeadLetterReason.UNKNOWN_WORKFLOW
        return _dead_letter(
            item.run_id, item.records, reason, str(loaded), rules, True, loaded.version
        )
    if isinstance(loaded, UnreadableRun) or not loaded.checksum_ok:
        detail = (
            str(loaded)
            if isinstance(loaded, UnreadableRun)
            else "state_checksum does not match the row: changed out of band"
        )
        reason = DeadLetterReason.CHECKSUM_MISMATCH
        return _dead_letter(item.run_id, item.records, reason, detail, rules, True, loaded.version)
    version = loaded.version
    if commit is None:
        return Plan(item.run_id, Outcome.NOOP, NOTHING, Outcome.NOOP, version)
    if committed:
        seq = commit.state.seq if commit.effects else None
        produce = Produce(commit.effects, seq)
        return Plan(item.run_id, Outcome.COMMITTED, produce, Outcome.COMMITTED, version)
    if held:
        return _after_lock(item, loaded, now_ms, rules)
    return _after_conflict(item, loaded, now_ms, rules)


_LOCKED_FIRST_RETRY_S = 0.01


def _after_lock(item: BatchItem, run: LoadedRun, now_ms: int, rules: Rules) -> Plan:
    """Another transaction held the run's row, so the commit skipped it. If the work already
    lost a race, or the run's version moved since its previous try loaded it, whoever
    holds the row is writing it: a lost race like any other (a conflict, which the livelock
    guard counts). Otherwise the row is only held (an operator's lock, a repair script): try
    again after a backoff that doubles while it is (10 ms, 20 ms ... 5 s: another instance's
    commit holds a row for milliseconds, an operator's lock for minutes), from fresh state,
    its conflict tries untouched; never a force-fail, never a quarantine."""
    moved = item.prior_version is not None and item.prior_version != run.version
    if item.tries or moved:
        return _after_conflict(item, run, now_ms, rules)
    retry_in_ms = int(retry_delay_s(item.locked, first_s=_LOCKED_FIRST_RETRY_S) * 1000)
    retry = TryAgain(retry_in_ms, item.tries)
    return Plan(item.run_id, Outcome.LOCKED, retry, Outcome.LOCKED, run.version)


def _after_conflict(item: BatchItem, run: LoadedRun, now_ms: int, rules: Rules) -> Plan:
    tries = item.tries + 1
    run_id, version = item.run_id, run.version
    wait_ms = retry_wait_ms(tries)
    if wait_ms is not None:
        return Plan(run_id, Outcome.CONFLICT, TryAgain(wait_ms, tries), Outcome.CONFLICT, version)
    lineage = item.lineage()
    verdict = after_exhausted_conflicts(
        requeue_count=lineage.requeue_count,
        requeue_seq=lineage.requeue_seq,
        observed_seq=lineage.observed_seq,
        current_seq=run.state.seq,
        livelock_requeues=rules.livelock_requeues,
    )
    if isinstance(verdict, ForceFail):
        write = force_fail_write(run, verdict.reason, now_ms, rules.names)
        if write is None:  # it ended meanwhile: nothing to fail, try again from fresh state
            return _started_again(run_id, version)
        failed = ForceFailed(verdict.reason, write)
        return Plan(run_id, Outcome.FORCE_FAILED, failed, Outcome.CONFLICT, version)
    wakeup = Wakeup(
        run_id=run_id,
        reason="requeue",
        requeue_count=verdict.requeue_count,
        requeue_seq=verdict.requeue_seq,
        due_at=now_ms + verdict.delay_ms,
        observed_seq=verdict.observed_seq,
        produced_at=now_ms,
    )
    send = wakeup_send(rules.names.delay(verdict.delay_ms), wakeup)
    requeue = Requeue(send, verdict.requeue_count, verdict.delay_ms)
    return Plan(run_id, Outcome.REQUEUED, requeue, Outcome.CONFLICT, version)


def force_fail_refused(plan: Plan) -> Plan:
    """The force-fail write matched nothing: the run moved since it was loaded (progress, or
    it ended), so it is not a livelock. The tries start again at once from fresh state; the
    next exhaustion sees the new seq."""
    return _started_again(plan.run_id, plan.expected_version)


def _started_again(run_id: str, version: int | None) -> Plan:
    return Plan(run_id, Outcome.CONFLICT, TryAgain(0, 0), Outcome.CONFLICT, version)


def force_fail_write(
    run: LoadedRun, reason: ForceFailReason, now_ms: int, names: TopicNames
) -> ForceFailWrite | None:
    """The terminal write that force-fails ``run`` as loaded (the livelock guard's, the stuck
    sweep's), or None when it ended already. Its end is the end of every child attempt in
    flight (cancelled, and woken to see it), and, for a child, its parent's step result (the
    parent woken at once): core/children.py, rule 4."""
    failed = force_fail(run.state, reason)
    if failed is None:
        return None
    cancelled = (
        children_to_cancel(run.run_id, run.wf, run.state, failed) if run.wf.has_children else []
    )
    effects = child_wakeups(run, [], cancelled, now_ms, names)
    if run.parent is not None:
        effects += parent_wakeup(run, now_ms, names)
    return ForceFailWrite(run.run_id, run.stored_checksum, failed, tuple(cancelled), effects)


def poisoned(item: BatchItem, detail: str, rules: Rules) -> Plan:
    """The run made a statement fail on what it holds (isolated from its batch): its records
    are dead-lettered and the run quarantined, so that it never holds the runs batched with it
    again."""
    reason = DeadLetterReason.POISON
    return _dead_letter(item.run_id, item.records, reason, detail, rules, quarantine=True)


def failed_unexpectedly(item: BatchItem, detail: str, rules: Rules) -> Plan:
    """Deciding or writing the run raised an exception nobody foresaw (the shell caught it,
    isolated from its batch): as for poison, its records are dead-lettered and the run
    quarantined, so that the sweeps stop waking it and it never holds its batch again."""
    reason = DeadLetterReason.UNEXPECTED_ERROR
    return _dead_letter(item.run_id, item.records, reason, detail, rules, quarantine=True)


def dead_letter(
    run_id: str, records: tuple[Inbound, ...], reason: DeadLetterReason, detail: str, rules: Rules
) -> Plan:
    """Every record of a work to the dead-letter topic, with why: the shell's plan for a
    work whose own plan could not be carried out."""
    return _dead_letter(run_id, records, reason, detail, rules)


def database_failed(item: BatchItem, retry_in_ms: int) -> Plan:
    """Nothing was decided for the run (a genuine error): try it again after ``retry_in_ms``
    (the shell's backoff through a database outage; 0 when the database answers again)."""
    return Plan(item.run_id, Outcome.ERROR, TryAgain(retry_in_ms, item.tries))


def retry_after(plan: Plan, retry_in_ms: int) -> Plan:
    """A retry put off to ``retry_in_ms`` (the shell's backoff, once it knows the database's
    state: an outage, commits that keep losing their connection); a plan that settles is
    left as it is (only a retry waits)."""
    payload = plan.payload
    if not isinstance(payload, TryAgain):
        return plan
    return replace(plan, payload=TryAgain(retry_in_ms, payload.tries))


# -- records that never reach a tick --------------------------------------------------------


def reject(record: Inbound, reason: DeadLetterReason, detail: str, rules: Rules) -> Plan:
    """A record refused at intake goes to the dead-letter topic."""
    return _dead_letter("", (record,), reason, detail, rules)


def hop(record: Inbound, target_ms: int, now_ms: int, names: TopicNames) -> Plan:
    """A wakeup that must wait until ``target_ms`` (a timer that came due on a rung before
    its target, a wakeup-tier record with a due time ahead): sent on along the delay ladder."""
    wakeup = record.wakeup
    assert wakeup is not None
    send = timer(wakeup.run_id, target_ms, now_ms, wakeup.reason, names)
    return Plan(wakeup.run_id, Outcome.HOPPED, Produce((send,)))


def _dead_letter(
    run_id: str,
    records: tuple[Inbound, ...],
    reason: DeadLetterReason,
    detail: str,
    rules: Rules,
    quarantine: bool = False,
    version: int | None = None,
) -> Plan:
    """Every record to the dead-letter topic (core/effects.py), ``quarantine``: the run's row
    flagged as unusable at ``version``."""
    sends = dead_letter_sends(records, reason, detail, rules.names.dlq, rules.dlq_max_bytes)
    letters = DeadLettered(reason, detail, sends, quarantine)
    return Plan(run_id, Outcome.DEAD_LETTERED, letters, expected_version=version)


__all__ = [
    "database_failed",
    "dead_letter",
    "decide",
    "failed_unexpectedly",
    "force_fail_refused",
    "force_fail_write",
    "hop",
    "poisoned",
    "reject",
    "retry_after",
    "tick_batch",
]
