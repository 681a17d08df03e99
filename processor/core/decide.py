"""What becomes of each run's wakeups, decided as frozen plans the shell carries out.

A batch goes through the commit path (engine/executor.py). Between its database steps, the
decisions are made here, without I/O, clock or randomness:

- ``tick_batch``: the tick of every loaded run, and the rows to commit with the records each
  transition must produce (step dispatches, retry timers), which go into the outbox in the
  same statement (step 2);
- ``decide``: once the commit answered, one ``Plan`` per run: which records to produce (the
  transition's, a requeue, dead letters), whether to try again after a backoff, whether to
  force-fail; ``force_fail_refused`` when that write found the run moved on;
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
   each attempt from freshly loaded state; when those attempts are used up, the run is
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
from dataclasses import dataclass, replace

from processor.core.backoff import retry_delay_s
from processor.core.children import ChildStart, children_started, children_to_cancel
from processor.core.dataflow import OutputRefs, data_at_hand, dependency_attempts, output_refs
from processor.core.dead_letters import dead_letter_headers, truncate_dead_letter
from processor.core.envelope import Wakeup
from processor.core.limits import NO_LIMITS, LimitInputs, RunLimits, admit
from processor.core.model import (
    Loaded,
    LoadedRun,
    NodeState,
    RunState,
    UnknownWorkflow,
    UnreadableRun,
)
from processor.core.outcomes import DeadLetterReason, ForceFailReason, Outcome
from processor.core.policy import ForceFail, after_exhausted_conflicts, retry_wait_ms
from processor.core.records import Inbound
from processor.core.routing import TopicNames, rung_for_delay
from processor.core.step_task import MapItem, encode_task
from processor.core.tick import Decision, force_fail, tick_run
from processor.core.workflow import StepDef

Attributes = tuple[tuple[str, str | int], ...]


@dataclass(frozen=True, slots=True)
class Send:
    """One record to produce. ``by_run``: on the partition of that run's wakeups (the shell
    knows the partition counts); None: wherever the client's partitioner puts the key."""

    topic: str
    key: bytes | None
    value: bytes | None
    by_run: str | None = None
    headers: tuple[tuple[str, bytes], ...] = ()
    attributes: Attributes = ()  # for the record's PRODUCER span

    # Written out (as for Commit, Plan and BatchItem): the compiled build compiles it, where
    # the dataclass decorator's own is interpreted Python, ~20 x dearer, and each tick builds
    # several. tests/unit/test_dataclass_inits.py holds each to its fields.
    def __init__(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        by_run: str | None = None,
        headers: tuple[tuple[str, bytes], ...] = (),
        attributes: Attributes = (),
    ) -> None:
        object.__setattr__(self, "topic", topic)
        object.__setattr__(self, "key", key)
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "by_run", by_run)
        object.__setattr__(self, "headers", headers)
        object.__setattr__(self, "attributes", attributes)


@dataclass(frozen=True, slots=True)
class Commit:
    """One run's share of a batched commit: its new state, the version it was computed from,
    and the records the transition must produce (written to the outbox with it)."""

    run_id: str
    expected_version: int
    state: RunState
    effects: tuple[Send, ...] = ()
    # Set only on the commit that ends a run succeeded whose workflow declares an output: the
    # step results the statement reads it from (dataflow.py).
    output: OutputRefs | None = None
    # Wait steps the transition ended, (node, attempt, signal id): the statement records each
    # as the step's result, the signal's payload its output.
    signalled: tuple[tuple[str, int, str], ...] = ()
    # Child runs the transition starts (the statement writes their rows), and those it
    # cancels (a cancel signal each): core/children.py.
    children: tuple[ChildStart, ...] = ()
    cancel_children: tuple[str, ...] = ()
    # Map steps the transition ended, (node, attempt, how many items): the statement records
    # each one's output, its items' outputs in order (core/tick.py, rule 6).
    mapped: tuple[tuple[str, int, int], ...] = ()
    # What the commit writes of the run's limits (core/limits.py); None: nothing.
    limits: RunLimits | None = None
    # Map items the transition took out of the state, succeeded: (map step, index, attempt),
    # which the statement records (eec_map_item) for the map's output.
    items: tuple[tuple[str, int, int], ...] = ()
    # Attempts the transition fails that no worker started, (node, attempt): the statement
    # marks each never to be started, and writes the run only if it could, that is, only if
    # no worker claimed one meanwhile (io/postgres/store.py); else the run lost a race, a conflict.
    unstarted: tuple[tuple[str, int], ...] = ()

    def __init__(
        self,
        run_id: str,
        expected_version: int,
        state: RunState,
        effects: tuple[Send, ...] = (),
        output: OutputRefs | None = None,
        signalled: tuple[tuple[str, int, str], ...] = (),
        children: tuple[ChildStart, ...] = (),
        cancel_children: tuple[str, ...] = (),
        mapped: tuple[tuple[str, int, int], ...] = (),
        limits: RunLimits | None = None,
        items: tuple[tuple[str, int, int], ...] = (),
        unstarted: tuple[tuple[str, int], ...] = (),
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "expected_version", expected_version)
        object.__setattr__(self, "state", state)
        object.__setattr__(self, "effects", effects)
        object.__setattr__(self, "output", output)
        object.__setattr__(self, "signalled", signalled)
        object.__setattr__(self, "children", children)
        object.__setattr__(self, "cancel_children", cancel_children)
        object.__setattr__(self, "mapped", mapped)
        object.__setattr__(self, "limits", limits)
        object.__setattr__(self, "items", items)
        object.__setattr__(self, "unstarted", unstarted)


@dataclass(frozen=True, slots=True)
class ForceFailWrite:
    """The terminal write a plan needs before it holds: conditioned on the loaded checksum,
    so it applies only if the run did not move since it was loaded. The same statement
    cancels ``cancel_children`` (a cancel signal each) and keeps ``effects`` in the outbox
    (their wakeups, and its parent's for a child): core/children.py, rule 4."""

    run_id: str
    loaded_checksum: str
    state: RunState
    cancel_children: tuple[str, ...] = ()
    effects: tuple[Send, ...] = ()


@dataclass(frozen=True, slots=True)
class Plan:
    """What the shell does with one run's work.

    ``outcome`` is what becomes of the work: it settles (committed, noop, requeued,
    force_failed, dead_lettered, hopped) once every record in ``sends`` is acknowledged, or it
    waits ``retry_in_ms`` for another attempt (conflict, error). ``attempt`` is the outcome of
    the tick attempt itself (committed, noop or conflict; None when nothing was ticked).
    """

    run_id: str
    outcome: Outcome
    attempt: Outcome | None = None
    sends: tuple[Send, ...] = ()
    outboxed_seq: int | None = None  # committed with an outbox row: delete it once all acked
    retry_in_ms: int | None = None
    attempts: int = 0  # the work's in-process attempts from now on
    expected_version: int | None = None
    requeue_count: int | None = None  # requeued: the new envelope's count
    rung_ms: int | None = None  # requeued: the delay rung
    reason: ForceFailReason | DeadLetterReason | None = None  # force-failed, dead-lettered: why
    detail: str = ""  # dead-lettered: what exactly was wrong
    force_fail: ForceFailWrite | None = None  # a write to make before the plan holds
    # The run's row cannot be used (dead-lettered for what it holds): flag it, so the sweeps
    # stop re-waking it. Written before the plan is carried out, like ``force_fail``.
    quarantine: bool = False

    def __init__(
        self,
        run_id: str,
        outcome: Outcome,
        attempt: Outcome | None = None,
        sends: tuple[Send, ...] = (),
        outboxed_seq: int | None = None,
        retry_in_ms: int | None = None,
        attempts: int = 0,
        expected_version: int | None = None,
        requeue_count: int | None = None,
        rung_ms: int | None = None,
        reason: ForceFailReason | DeadLetterReason | None = None,
        detail: str = "",
        force_fail: ForceFailWrite | None = None,
        quarantine: bool = False,
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "outcome", outcome)
        object.__setattr__(self, "attempt", attempt)
        object.__setattr__(self, "sends", sends)
        object.__setattr__(self, "outboxed_seq", outboxed_seq)
        object.__setattr__(self, "retry_in_ms", retry_in_ms)
        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "expected_version", expected_version)
        object.__setattr__(self, "requeue_count", requeue_count)
        object.__setattr__(self, "rung_ms", rung_ms)
        object.__setattr__(self, "reason", reason)
        object.__setattr__(self, "detail", detail)
        object.__setattr__(self, "force_fail", force_fail)
        object.__setattr__(self, "quarantine", quarantine)

    @property
    def settles(self) -> bool:
        return self.retry_in_ms is None


@dataclass(frozen=True, slots=True)
class BatchItem:
    """A run's work as the commit path sees it (a snapshot: the database thread reads it)."""

    run_id: str
    attempts: int
    records: tuple[Inbound, ...]
    locked: int = 0  # commits in a row that found its row held by another transaction
    prior_version: int | None = None  # the version its previous attempt loaded

    def __init__(
        self,
        run_id: str,
        attempts: int,
        records: tuple[Inbound, ...],
        locked: int = 0,
        prior_version: int | None = None,
    ) -> None:
        object.__setattr__(self, "run_id", run_id)
        object.__setattr__(self, "attempts", attempts)
        object.__setattr__(self, "records", records)
        object.__setattr__(self, "locked", locked)
        object.__setattr__(self, "prior_version", prior_version)

    def lineage(self) -> Wakeup:
        """The envelope whose requeue history this work continues: the most requeued one."""
        wakeups = [r.wakeup for r in self.records if r.wakeup is not None]
        return max(wakeups, key=lambda w: (w.requeue_count, w.attempt))


@dataclass(frozen=True, slots=True)
class Rules:
    """What the decisions depend on besides their inputs (fixed at start)."""

    names: TopicNames
    livelock_requeues: int
    # The largest dead letter the producer and the dead-letter topic both take (key, value and
    # headers); a larger record is dead-lettered truncated, with its size in a header.
    dlq_max_bytes: int = 1_000_000


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
        effects = _effects(run, decision, now_ms, names)
        output = output_refs(run.wf, new_state)
        started: list[ChildStart] = []
        cancelled: list[str] = []
        if run.wf.has_children:
            started = children_started(run_id, run.wf, run.state, new_state)
            cancelled = children_to_cancel(run_id, run.wf, run.state, new_state)
            effects += _child_wakeups(run, started, cancelled, now_ms, names)
        if run.parent is not None and new_state.status.terminal:
            effects += _parent_wakeup(run, now_ms, names)
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
        plan = _dead_letter(item.run_id, item.records, reason, str(loaded), rules)
        return replace(plan, quarantine=True, expected_version=loaded.version)
    if isinstance(loaded, UnreadableRun) or not loaded.checksum_ok:
        detail = (
            str(loaded)
            if isinstance(loaded, UnreadableRun)
            else "state_checksum does not match the row: changed out of band"
        )
        reason = DeadLetterReason.CHECKSUM_MISMATCH
        plan = _dead_letter(item.run_id, item.records, reason, detail, rules)
        return replace(plan, quarantine=True, expected_version=loaded.version)
    version = loaded.version
    if commit is None:
        return Plan(item.run_id, Outcome.NOOP, Outcome.NOOP, expected_version=version)
    if committed:
        return Plan(
            item.run_id,
            Outcome.COMMITTED,
            Outcome.COMMITTED,
            commit.effects,
            outboxed_seq=commit.state.seq if commit.effects else None,
            expected_version=version,
        )
    if held:
        return _after_lock(item, loaded, now_ms, rules)
    return _after_conflict(item, loaded, now_ms, rules)


_LOCKED_FIRST_RETRY_S = 0.01


def _after_lock(item: BatchItem, run: LoadedRun, now_ms: int, rules: Rules) -> Plan:
    """Another transaction held the run's row, so the commit skipped it. If the work already
    lost a race, or the run's version moved since its previous attempt loaded it, whoever
    holds the row is writing it: a lost race like any other (a conflict, which the livelock
    guard counts). Otherwise the row is only held (an operator's lock, a repair script): try
    again after a backoff that doubles while it is (10 ms, 20 ms ... 5 s: another instance's
    commit holds a row for milliseconds, an operator's lock for minutes), from fresh state,
    its conflict attempts untouched; never a force-fail, never a quarantine."""
    moved = item.prior_version is not None and item.prior_version != run.version
    if item.attempts or moved:
        return _after_conflict(item, run, now_ms, rules)
    retry_in_ms = int(retry_delay_s(item.locked, first_s=_LOCKED_FIRST_RETRY_S) * 1000)
    return Plan(
        item.run_id,
        Outcome.LOCKED,
        Outcome.LOCKED,
        retry_in_ms=retry_in_ms,
        attempts=item.attempts,
        expected_version=run.version,
    )


def _after_conflict(item: BatchItem, run: LoadedRun, now_ms: int, rules: Rules) -> Plan:
    attempts = item.attempts + 1
    conflict = Plan(
        item.run_id,
        Outcome.CONFLICT,
        attempt=Outcome.CONFLICT,
        attempts=attempts,
        expected_version=run.version,
    )
    wait_ms = retry_wait_ms(attempts)
    if wait_ms is not None:
        return replace(conflict, retry_in_ms=wait_ms)
    lineage = item.lineage()
    verdict = after_exhausted_conflicts(
        requeue_count=lineage.requeue_count,
        attempt=lineage.attempt,
        observed_seq=lineage.observed_seq,
        current_seq=run.state.seq,
        livelock_requeues=rules.livelock_requeues,
    )
    if isinstance(verdict, ForceFail):
        write = force_fail_write(run, verdict.reason, now_ms, rules.names)
        if write is None:  # it ended meanwhile: nothing to fail, try again from fresh state
            return force_fail_refused(conflict)
        return replace(
            conflict,
            outcome=Outcome.FORCE_FAILED,
            reason=verdict.reason,
            force_fail=write,
            # Produced once the write landed; its outbox row is deleted once they are in.
            sends=write.effects,
            outboxed_seq=write.state.seq if write.effects else None,
        )
    wakeup = Wakeup(
        run_id=item.run_id,
        reason="requeue",
        requeue_count=verdict.requeue_count,
        attempt=verdict.attempt,
        due_at=now_ms + verdict.delay_ms,
        observed_seq=verdict.observed_seq,
        produced_at=now_ms,
    )
    return replace(
        conflict,
        outcome=Outcome.REQUEUED,
        sends=(_wakeup_send(rules.names.delay(verdict.delay_ms), wakeup),),
        requeue_count=verdict.requeue_count,
        rung_ms=verdict.delay_ms,
    )


def force_fail_refused(plan: Plan) -> Plan:
    """The force-fail write matched nothing: the run moved since it was loaded (progress, or
    it ended), so it is not a livelock. The attempts start again at once from fresh state; the
    next exhaustion sees the new seq."""
    return replace(
        plan,
        outcome=Outcome.CONFLICT,
        retry_in_ms=0,
        attempts=0,
        reason=None,
        force_fail=None,
        sends=(),
        outboxed_seq=None,
    )


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
    effects = _child_wakeups(run, [], cancelled, now_ms, names)
    if run.parent is not None:
        effects += _parent_wakeup(run, now_ms, names)
    return ForceFailWrite(run.run_id, run.stored_checksum, failed, tuple(cancelled), effects)


def poisoned(item: BatchItem, detail: str, rules: Rules) -> Plan:
    """The run made a statement fail on what it holds (isolated from its batch): its records
    are dead-lettered and the run quarantined, so that it never holds the runs batched with it
    again."""
    plan = _dead_letter(item.run_id, item.records, DeadLetterReason.POISON, detail, rules)
    return replace(plan, quarantine=True)


def failed_unexpectedly(item: BatchItem, detail: str, rules: Rules) -> Plan:
    """Deciding or writing the run raised an exception nobody foresaw (the shell caught it,
    isolated from its batch): as for poison, its records are dead-lettered and the run
    quarantined, so that the sweeps stop waking it and it never holds its batch again."""
    reason = DeadLetterReason.UNEXPECTED_ERROR
    plan = _dead_letter(item.run_id, item.records, reason, detail, rules)
    return replace(plan, quarantine=True)


def dead_letter(
    run_id: str, records: tuple[Inbound, ...], reason: DeadLetterReason, detail: str, rules: Rules
) -> Plan:
    """Every record of a work to the dead-letter topic, with why: the shell's plan for a
    work whose own plan could not be carried out."""
    return _dead_letter(run_id, records, reason, detail, rules)


def database_failed(item: BatchItem, retry_in_ms: int) -> Plan:
    """Nothing was decided for the run (a genuine error): try it again after ``retry_in_ms``
    (the shell's backoff through a database outage; 0 when the database answers again)."""
    return Plan(item.run_id, Outcome.ERROR, retry_in_ms=retry_in_ms, attempts=item.attempts)


# -- records that never reach a tick --------------------------------------------------------


def reject(record: Inbound, reason: DeadLetterReason, detail: str, rules: Rules) -> Plan:
    """A record refused at intake goes to the dead-letter topic."""
    return _dead_letter("", (record,), reason, detail, rules)


def hop(record: Inbound, target_ms: int, now_ms: int, names: TopicNames) -> Plan:
    """A wakeup that must wait until ``target_ms`` (a timer that came due on a rung before
    its target, a wakeup-tier record with a due time ahead): sent on along the delay ladder."""
    wakeup = record.wakeup
    assert wakeup is not None
    send = _timer(wakeup.run_id, target_ms, now_ms, wakeup.reason, names)
    return Plan(wakeup.run_id, Outcome.HOPPED, sends=(send,))


# -- effects --------------------------------------------------------------------------------


def _effects(
    run: LoadedRun, decision: Decision, now_ms: int, names: TopicNames
) -> tuple[Send, ...]:
    sends = []
    if decision.dispatches:
        assert decision.new_state is not None
        step_of = run.wf.step_for if run.wf.has_maps else run.wf.step_map.__getitem__
        nodes: dict[str, NodeState] | None = None  # built only for a step with dependencies
        key = run.run_id.encode()
        for d in decision.dispatches:
            step = step_of(d.node)
            if step.depends_on:
                nodes = nodes or decision.new_state.node_map()
                deps = dependency_attempts(step, nodes)
            else:
                deps = ()
            data = data_at_hand(run, step)
            start_by = close_by = None
            if step.schedule_to_start_ms is not None or step.schedule_to_close_ms is not None:
                nodes = nodes or decision.new_state.node_map()
                start_by, close_by = _bounds_of(step, nodes[d.node])
            # Encoded straight from the dispatch: no StepTask object per dispatch.
            task = encode_task(
                run.run_id,
                d.node,
                d.attempt,
                d.step_type,
                d.deadline_ms,
                run.tier,
                deps,
                data,
                step.heartbeat_timeout_ms,
                _item_of(step, d.node),
                step.timeout_ms,
                start_by,
                close_by,
            )
            attributes = (("ductor.node", d.node), ("ductor.attempt", d.attempt))
            topic = names.steps_for(step.queue, run.tier)
            sends.append(Send(topic, key=key, value=task, attributes=attributes))
    if decision.timers:
        sends += [_timer(run.run_id, due, now_ms, "timer", names) for due in decision.timers]
    return tuple(sends)


def _bounds_of(step: StepDef, node: NodeState) -> tuple[int | None, int | None]:
    """A dispatched attempt's schedule-to-start and schedule-to-close bounds as its task
    carries them (epoch ms): by when a worker may take it, and by when it must end."""
    close_by = None
    if step.schedule_to_close_ms is not None and node.first_ms is not None:
        close_by = node.first_ms + step.schedule_to_close_ms
    start_by = close_by
    if step.schedule_to_start_ms is not None and node.since_ms is not None:
        start_by = node.since_ms + step.schedule_to_start_ms
        if close_by is not None:
            start_by = min(start_by, close_by)
    return start_by, close_by


def _item_of(step: StepDef, node: str) -> MapItem | None:
    """Which item a dispatch of a map step is (None: not a map's)."""
    if not step.maps:
        return None
    return MapItem(step.items_from, int(node[node.rindex("[") + 1 : -1]))


def _child_wakeups(
    run: LoadedRun,
    started: list[ChildStart],
    cancelled: list[str],
    now_ms: int,
    names: TopicNames,
) -> tuple[Send, ...]:
    """The start wakeups of the child runs a transition starts, and the wakeups of those it
    cancels, on the parent's tier (a child runs on its parent's)."""
    topic = names.wakeup(run.tier)
    wakeups = [Wakeup(c.run_id, reason="start", produced_at=now_ms) for c in started]
    wakeups += [Wakeup(c, reason="signal", produced_at=now_ms) for c in cancelled]
    return tuple(_wakeup_send(topic, w) for w in wakeups)


def _parent_wakeup(run: LoadedRun, now_ms: int, names: TopicNames) -> tuple[Send, ...]:
    """The wakeup of a child's parent once the child ended (its end is the parent's step
    result), on the child's tier (its parent's)."""
    assert run.parent is not None
    parent = Wakeup(run.parent.run_id, reason="step_result", produced_at=now_ms)
    return (_wakeup_send(names.wakeup(run.tier), parent),)


def _timer(run_id: str, due_ms: int, now_ms: int, reason: str, names: TopicNames) -> Send:
    """A wakeup at ``due_ms`` on the delay ladder: on the largest rung that fits the wait, and
    hopping on (``target_at``) when the wait is longer than the top rung."""
    wait = max(0, due_ms - now_ms)
    rung = rung_for_delay(wait)
    hop_due = now_ms + min(wait, rung)
    wakeup = Wakeup(
        run_id=run_id,
        reason=reason,
        due_at=hop_due,
        target_at=due_ms if due_ms > hop_due else None,
        produced_at=now_ms,
    )
    return _wakeup_send(names.delay(rung), wakeup)


def _wakeup_send(topic: str, wakeup: Wakeup) -> Send:
    key = wakeup.key()
    attributes: Attributes = (
        ("ductor.requeue_count", wakeup.requeue_count),
        ("ductor.attempt", wakeup.attempt),
        ("messaging.kafka.message.key", key.decode()),
    )
    return Send(topic, key, wakeup.encode(), by_run=wakeup.run_id, attributes=attributes)


def _dead_letter(
    run_id: str,
    records: tuple[Inbound, ...],
    reason: DeadLetterReason,
    detail: str,
    rules: Rules,
) -> Plan:
    """Every record to the dead-letter topic with its original key, value (a tombstone stays a
    tombstone) and headers, plus the reason and where it came from; one too large for the
    dead-letter topic goes truncated (``truncate_dead_letter``)."""
    sends = []
    for r in records:
        headers = dead_letter_headers(r.headers, reason, detail, r.tp[0], r.tp[1], r.offset)
        value, headers = truncate_dead_letter(r.key, r.value, headers, rules.dlq_max_bytes)
        attributes: Attributes = (("ductor.reason", reason.value),)
        sends.append(
            Send(rules.names.dlq, r.key, value, headers=tuple(headers), attributes=attributes)
        )
    return Plan(run_id, Outcome.DEAD_LETTERED, sends=tuple(sends), reason=reason, detail=detail)


__all__ = [
    "BatchItem",
    "Commit",
    "ForceFailWrite",
    "Plan",
    "Rules",
    "Send",
    "database_failed",
    "dead_letter",
    "decide",
    "failed_unexpectedly",
    "force_fail_refused",
    "force_fail_write",
    "hop",
    "poisoned",
    "reject",
    "tick_batch",
]
