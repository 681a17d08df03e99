"""The engine's decisions without a broker or a database: records are plain fake messages
(tests/unit/fakes.py), and what is checked is what the core decides and the bookkeeping the
executor relies on: coalescing, the conflict ladder, dead letters, offsets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.dead_letters import (
    REASON,
    RECORD_OVERHEAD_BYTES,
    SOURCE_OFFSET,
    SOURCE_PARTITION,
    SOURCE_TOPIC,
    TRUNCATED,
    dead_letter_headers,
    truncate_dead_letter,
)
from processor.core.decide import (
    database_failed,
    decide,
    failed_unexpectedly,
    force_fail_refused,
    hop,
    poisoned,
    reject,
    tick_batch,
)
from processor.core.envelope import Wakeup, decode_wakeup
from processor.core.intake import Accepted, Hop, NotDue, Reject, admit
from processor.core.model import Loaded, UnknownWorkflow, UnreadableRun
from processor.core.offsets import OffsetTracker
from processor.core.outcomes import DLQ_REASONS, DeadLetterReason, ForceFailReason, Outcome
from processor.core.pending import RunBook
from processor.core.plans import (
    DeadLettered,
    ForceFailed,
    Plan,
    Produce,
    Rules,
    TryAgain,
    payload_of,
)
from processor.core.policy import IN_PROCESS_BACKOFF_MS, MAX_IN_PROCESS_TRIES
from processor.core.records import Inbound
from processor.core.request_plans import Refused, request_plan
from processor.core.routing import DELAY_RUNGS_MS, requeue_delay_ms
from processor.core.run_state import RunStatus, initial_state

from .fakes import (
    MAX_BYTES,
    NAMES,
    NOW_MS,
    WF,
    FakeMessage,
    accepted,
    item,
    loaded,
    wakeup_message,
)
from .strategies import FAST

RULES = Rules(NAMES, livelock_requeues=3)


def _start(run_id: str, offset: int, **fields: int) -> FakeMessage:
    return wakeup_message(offset, Wakeup(run_id, "start", produced_at=NOW_MS, **fields))


# -- intake ---------------------------------------------------------------------------------


def test_each_record_gets_one_verdict() -> None:
    assert isinstance(admit(_start("r", 1), NAMES, MAX_BYTES, NOW_MS), Accepted)
    delay = NAMES.delay(DELAY_RUNGS_MS[0])
    due = wakeup_message(2, Wakeup("r", "timer", due_at=NOW_MS + 70), topic=delay)
    verdict = admit(due, NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, NotDue) and verdict.wait_ms == 70
    far = Wakeup("r", "timer", due_at=NOW_MS, target_at=NOW_MS + 60_000)
    assert isinstance(admit(wakeup_message(3, far, topic=delay), NAMES, MAX_BYTES, NOW_MS), Hop)
    garbage = FakeMessage(NAMES.wakeup("t0"), 4, b"{")
    verdict = admit(garbage, NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Reject) and verdict.reason is DeadLetterReason.NOT_JSON
    assert verdict.record.tier == "t0" and verdict.record.tp == (NAMES.wakeup("t0"), 0)


def test_a_hop_travels_on_toward_its_target() -> None:
    target = NOW_MS + 25_000
    message = wakeup_message(
        1, Wakeup("r", "timer", due_at=NOW_MS, target_at=target), NAMES.delay(10000)
    )
    verdict = admit(message, NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Hop) and verdict.target_ms == target
    plan = hop(verdict.record, verdict.target_ms, NOW_MS, NAMES)
    assert plan.outcome is Outcome.HOPPED and plan.settles
    (send,) = plan.sends
    onward = decode_wakeup(send.value, MAX_BYTES)
    assert isinstance(onward, Wakeup)
    assert send.topic == NAMES.delay(DELAY_RUNGS_MS[-1]) and send.by_run == "r"
    assert onward.due_at == NOW_MS + DELAY_RUNGS_MS[-1] and onward.target_at == target


def test_a_wakeup_tier_record_due_later_goes_to_the_ladder_instead_of_pausing_its_tier() -> None:
    message = wakeup_message(1, Wakeup("r", "start", due_at=NOW_MS + 5_000))
    verdict = admit(message, NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Hop) and verdict.target_ms == NOW_MS + 5_000
    (send,) = hop(verdict.record, verdict.target_ms, NOW_MS, NAMES).sends
    assert send.topic == NAMES.delay(3200)  # the largest rung that fits the wait


def test_a_wakeup_tier_record_due_soon_hops_toward_the_target_it_carries() -> None:
    target = NOW_MS + 30_000
    message = wakeup_message(1, Wakeup("r", "start", due_at=NOW_MS + 2_000, target_at=target))
    verdict = admit(message, NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Hop) and verdict.target_ms == target
    (send,) = hop(verdict.record, verdict.target_ms, NOW_MS, NAMES).sends
    onward = decode_wakeup(send.value, MAX_BYTES)
    assert isinstance(onward, Wakeup) and onward.target_at == target


@pytest.mark.parametrize(
    ("topic", "wakeup", "bound"),
    [
        # A wakeup tier: never due later than the longest rung (plus the clock tolerance).
        (NAMES.wakeup("t1"), Wakeup("r", "start", due_at=NOW_MS + 3_600_000), "due_at"),
        # A delay record: never due later than its own rung.
        (NAMES.delay(100), Wakeup("r", "timer", due_at=NOW_MS + 600_000), "due_at"),
        # A timer's target: never further than the longest retry wait a workflow may declare.
        (NAMES.delay(100), Wakeup("r", "timer", target_at=NOW_MS + 10**12), "target_at"),
        # ... even when the record is not due yet: it is not held, nor hopped, for nothing.
        (
            NAMES.delay(100),
            Wakeup("r", "timer", due_at=NOW_MS + 50, target_at=NOW_MS + 10**12),
            "target_at",
        ),
        (
            NAMES.wakeup("t0"),
            Wakeup("r", "start", due_at=NOW_MS + 2_000, target_at=NOW_MS + 10**12),
            "target_at",
        ),
    ],
)
def test_a_due_time_past_its_horizon_is_out_of_bounds(
    topic: str, wakeup: Wakeup, bound: str
) -> None:
    verdict = admit(wakeup_message(1, wakeup, topic=topic), NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Reject) and verdict.reason is DeadLetterReason.OUT_OF_BOUNDS
    assert verdict.detail.startswith(bound)


_ENVELOPE = '{"envelope_version":1,"reason":"requeue",'


@pytest.mark.parametrize(
    ("body", "names_the"),
    [
        (_ENVELOPE + '"run_id":"a\\u0000b"}', "NUL"),
        (_ENVELOPE + '"run_id":"r","attempt":18446744073709551615}', "attempt"),
        (_ENVELOPE + '"run_id":"r","produced_at":99999999999999999}', "produced_at"),
    ],
)
def test_values_nothing_downstream_could_hold_are_out_of_bounds(body: str, names_the: str) -> None:
    message = FakeMessage(NAMES.wakeup("t1"), 1, body.encode())
    verdict = admit(message, NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Reject) and verdict.reason is DeadLetterReason.OUT_OF_BOUNDS
    assert names_the in verdict.detail


def test_a_record_cannot_bring_its_own_dead_letter_verdict() -> None:
    forged = FakeMessage(
        NAMES.wakeup("t1"), 3, b"junk", headers_=[(REASON, b"unknown_run"), ("trace", b"x")]
    )
    verdict = admit(forged, NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Reject)
    (send,) = reject(verdict.record, verdict.reason, verdict.detail, RULES).sends
    reasons = [v for k, v in send.headers if k == REASON]
    assert reasons == [b"not_json"] and ("trace", b"x") in send.headers


# -- dead letters ---------------------------------------------------------------------------


def _rejected_at_intake(value: bytes | None) -> Callable[[], Plan]:
    def plan() -> Plan:
        verdict = admit(FakeMessage(NAMES.wakeup("t1"), 7, value, 2), NAMES, MAX_BYTES, NOW_MS)
        assert isinstance(verdict, Reject)
        return reject(verdict.record, verdict.reason, verdict.detail, RULES)

    return plan


def _refused_after_load(load: Loaded | None) -> Callable[[], Plan]:
    def plan() -> Plan:
        record = accepted(wakeup_message(7, Wakeup("r", "start"), partition=2))
        commits = tick_batch({"r": load} if load is not None else {}, NOW_MS, NAMES)
        return decide(item("r", [record]), load, commits.get("r"), False, NOW_MS, RULES)

    return plan


def _request_rejected_at_intake(value: bytes) -> Callable[[], Plan]:
    def plan() -> Plan:
        verdict = admit(FakeMessage(NAMES.requests, 7, value, 2), NAMES, MAX_BYTES, NOW_MS)
        assert isinstance(verdict, Reject)
        return reject(verdict.record, verdict.reason, verdict.detail, RULES)

    return plan


DEAD_LETTERS: dict[DeadLetterReason, Callable[[], Plan]] = {
    DeadLetterReason.NOT_JSON: _rejected_at_intake(b"not json"),
    DeadLetterReason.WRONG_SCHEMA: _rejected_at_intake(b'{"envelope_version": 1, "run_id": 3}'),
    DeadLetterReason.UNKNOWN_ENVELOPE_VERSION: _rejected_at_intake(b'{"envelope_version": 9}'),
    DeadLetterReason.OVERSIZE: _rejected_at_intake(b" " * (MAX_BYTES + 1)),
    DeadLetterReason.POISON: lambda: poisoned(
        item("r", [accepted(wakeup_message(7, Wakeup("r", "start"), partition=2))]),
        "DataError: a statement failed on this run",
        RULES,
    ),
    DeadLetterReason.UNEXPECTED_ERROR: lambda: failed_unexpectedly(
        item("r", [accepted(wakeup_message(7, Wakeup("r", "start"), partition=2))]),
        "TypeError: Recursion limit reached",
        RULES,
    ),
    DeadLetterReason.OUT_OF_BOUNDS: _rejected_at_intake(
        b'{"envelope_version": 1, "run_id": "r", "reason": "start", "attempt": 4294967296}'
    ),
    DeadLetterReason.RESERVED_RUN_ID: _request_rejected_at_intake(
        b'{"request_version": 1, "kind": "start", "run_id": "p/s#1", "workflow": "w"}'
    ),
    DeadLetterReason.UNKNOWN_RUN: _refused_after_load(None),
    DeadLetterReason.UNKNOWN_WORKFLOW: _refused_after_load(UnknownWorkflow("not registered")),
    DeadLetterReason.CHECKSUM_MISMATCH: _refused_after_load(loaded("r", tampered=True)),
    DeadLetterReason.CONFLICTING_START: lambda: request_plan(
        accepted(wakeup_message(7, Wakeup("r", "start"), partition=2)),
        "r",
        Refused(DeadLetterReason.CONFLICTING_START, "run 'r' exists already with another input"),
        NOW_MS,
        RULES,
    ),
    DeadLetterReason.NOT_ALLOWED: lambda: request_plan(
        accepted(wakeup_message(7, Wakeup("r", "start"), partition=2)),
        "r",
        Refused(
            DeadLetterReason.NOT_ALLOWED,
            "the requests topic may not start workflow 'w': it may start 'orders'",
        ),
        NOW_MS,
        RULES,
    ),
    DeadLetterReason.INVALID_INPUT: lambda: request_plan(
        accepted(wakeup_message(7, Wakeup("r", "start"), partition=2)),
        "r",
        Refused(
            DeadLetterReason.INVALID_INPUT,
            "the input does not match the input_schema of workflow 'w' v1 at $.n: 'x' is not"
            " of type 'integer'",
        ),
        NOW_MS,
        RULES,
    ),
    DeadLetterReason.RUN_ENDED: lambda: request_plan(
        accepted(wakeup_message(7, Wakeup("r", "start"), partition=2)),
        "r",
        Refused(DeadLetterReason.RUN_ENDED, "run 'r' has ended (succeeded)"),
        NOW_MS,
        RULES,
    ),
    DeadLetterReason.UNKNOWN_SIGNAL: lambda: request_plan(
        accepted(wakeup_message(7, Wakeup("r", "start"), partition=2)),
        "r",
        Refused(DeadLetterReason.UNKNOWN_SIGNAL, "no step of workflow 'w' waits for 'aproved'"),
        NOW_MS,
        RULES,
    ),
}


def test_every_dead_letter_reason_is_reachable_here() -> None:
    assert sorted(r.value for r in DEAD_LETTERS) == sorted(DLQ_REASONS)


@pytest.mark.parametrize("reason", list(DeadLetterReason))
def test_a_dead_letter_keeps_the_record_and_says_why_and_where(reason: DeadLetterReason) -> None:
    plan = DEAD_LETTERS[reason]()
    assert plan.outcome is Outcome.DEAD_LETTERED and plan.settles
    assert payload_of(plan, DeadLettered).reason is reason
    (send,) = plan.sends
    assert send.topic == NAMES.dlq and send.by_run is None
    headers = dict(send.headers)
    assert headers[REASON] == reason.value.encode()
    assert headers[SOURCE_TOPIC] in {NAMES.wakeup("t1").encode(), NAMES.requests.encode()}
    assert (headers[SOURCE_PARTITION], headers[SOURCE_OFFSET]) == (b"2", b"7")


def test_an_unreadable_row_is_dead_lettered_as_a_checksum_mismatch() -> None:
    plan = _refused_after_load(UnreadableRun("node_states cannot be read"))()
    letters = payload_of(plan, DeadLettered)
    assert letters.reason is DeadLetterReason.CHECKSUM_MISMATCH
    assert "cannot be read" in letters.detail
    assert plan.quarantine


# A run whose row exists but cannot be used is flagged so the sweeps stop re-waking it; a record
# refused before (or without) a row has nothing to flag.
_QUARANTINED = {
    DeadLetterReason.POISON,
    DeadLetterReason.UNEXPECTED_ERROR,
    DeadLetterReason.UNKNOWN_WORKFLOW,
    DeadLetterReason.CHECKSUM_MISMATCH,
}


@pytest.mark.parametrize("reason", list(DeadLetterReason))
def test_only_a_run_whose_row_cannot_be_used_is_quarantined(reason: DeadLetterReason) -> None:
    assert DEAD_LETTERS[reason]().quarantine is (reason in _QUARANTINED)


def test_a_tombstone_stays_a_tombstone() -> None:
    plan = _rejected_at_intake(None)()
    assert payload_of(plan, DeadLettered).reason is DeadLetterReason.WRONG_SCHEMA
    assert plan.sends[0].value is None


# -- coalescing -----------------------------------------------------------------------------


def test_duplicate_wakeups_of_a_run_coalesce_into_one_tick() -> None:
    book: RunBook[None] = RunBook()
    for offset, reason in enumerate(["start", "start", "step_result", "signal"]):
        book.add(accepted(wakeup_message(offset, Wakeup("r", reason))))
    book.add(accepted(_start("other", 9)))
    works = book.take_ready(now=0.0, limit=10)
    assert sorted((w.run_id, len(w.records)) for w in works) == [("other", 1), ("r", 4)]
    assert len(book) == 0
    commits = tick_batch({"r": loaded("r"), "other": loaded("other")}, NOW_MS, NAMES)
    assert list(commits) == ["r", "other"]  # one row per run, however many records
    (r,) = [w for w in works if w.run_id == "r"]
    plan = decide(item("r", r.records), loaded("r"), commits["r"], True, NOW_MS, RULES)
    assert plan.outcome is Outcome.COMMITTED
    assert [s.topic for s in plan.sends] == [NAMES.steps]  # `first` dispatched once


def test_a_batch_takes_only_ready_runs_and_at_most_its_limit() -> None:
    book: RunBook[None] = RunBook()
    for i in range(5):
        book.add(accepted(_start(f"r{i}", i)))
    (parked,) = book.take_ready(now=0.0, limit=1)
    book.park(parked, ready_at=10.0)
    assert book.ready_count(now=0.0) == 4 and book.next_ready_at() == 0.0
    assert parked not in book.take_ready(now=0.0, limit=10)
    assert book.take_ready(now=10.0, limit=10) == [parked]


def test_records_that_came_while_in_flight_are_not_held_by_the_backoff() -> None:
    book: RunBook[None] = RunBook()
    book.add(accepted(_start("r", 1)))
    (in_flight,) = book.take_ready(now=0.0, limit=10)
    book.add(accepted(wakeup_message(2, Wakeup("r", "step_result"))))  # meanwhile
    book.park(in_flight, ready_at=1.0)  # the in-flight attempt conflicted
    (merged,) = book.take_ready(now=0.0, limit=10)
    assert merged is in_flight and [r.offset for r in merged.records] == [1, 2]


def test_revoked_partitions_leave_the_book() -> None:
    book: RunBook[None] = RunBook()
    book.add(accepted(wakeup_message(1, Wakeup("a", "start"), partition=0)))
    book.add(accepted(wakeup_message(2, Wakeup("b", "start"), partition=1)))
    book.add(accepted(wakeup_message(3, Wakeup("b", "signal"), partition=0)))
    emptied = book.drop_partitions({(NAMES.wakeup("t1"), 0)})
    assert [w.run_id for w in emptied] == ["a"]
    (left,) = book.take_ready(now=0.0, limit=10)
    assert left.run_id == "b" and [r.offset for r in left.records] == [2]


# -- the conflict ladder --------------------------------------------------------------------


def _conflict(records: list[Inbound], attempts: int, seq: int = 0) -> Plan:
    """The plan for a commit of run ``r`` (at ``seq``) that matched no row."""
    run = loaded("r", replace(initial_state(WF), seq=seq))
    commits = tick_batch({"r": run}, NOW_MS, NAMES)
    return decide(item("r", records, attempts), run, commits["r"], False, NOW_MS, RULES)


def _due(message: FakeMessage) -> Inbound:
    """The record accepted once it is due."""
    wakeup = decode_wakeup(message.value(), MAX_BYTES)
    assert isinstance(wakeup, Wakeup)
    return accepted(message, now_ms=max(NOW_MS, wakeup.due_at or 0))


def test_conflicts_are_retried_in_process_with_the_seeds_backoff_then_requeued() -> None:
    records = [accepted(_start("r", 1))]
    for tries in range(MAX_IN_PROCESS_TRIES - 1):
        plan = _conflict(records, tries)
        assert (plan.outcome, plan.tick_outcome) == (Outcome.CONFLICT, Outcome.CONFLICT)
        retry = payload_of(plan, TryAgain)
        assert retry.retry_in_ms == IN_PROCESS_BACKOFF_MS[tries + 1]
        assert retry.tries == tries + 1 and not plan.sends
    plan = _conflict(records, MAX_IN_PROCESS_TRIES - 1)
    assert (plan.outcome, plan.tick_outcome) == (
        Outcome.REQUEUED,
        Outcome.CONFLICT,
    ) and plan.settles
    (send,) = plan.sends
    assert send.topic == NAMES.delay(requeue_delay_ms(0)) and send.key == b"r:1"
    requeued = decode_wakeup(send.value, MAX_BYTES)
    assert isinstance(requeued, Wakeup)
    assert (requeued.requeue_count, requeued.requeue_seq, requeued.observed_seq) == (1, 1, 0)
    assert requeued.due_at == NOW_MS + requeue_delay_ms(0)


def test_a_run_that_keeps_conflicting_without_progress_is_force_failed() -> None:
    """Requeue after requeue with the same seq: the key changes every time (run_id:requeue_seq),
    the rung climbs, and after ``livelock_requeues`` rounds the run is force-failed."""
    message = wakeup_message(1, Wakeup("r", "start"))
    keys = []
    for _round in range(RULES.livelock_requeues):
        plan = _conflict([_due(message)], MAX_IN_PROCESS_TRIES - 1)
        assert plan.outcome is Outcome.REQUEUED
        (send,) = plan.sends
        keys.append(send.key)
        message = FakeMessage(send.topic, 1, send.value, key_=send.key)
    assert len(set(keys)) == len(keys), "requeues must never share a key"
    plan = _conflict([_due(message)], MAX_IN_PROCESS_TRIES - 1)
    failed = payload_of(plan, ForceFailed)
    assert (plan.outcome, failed.reason) == (Outcome.FORCE_FAILED, ForceFailReason.LIVELOCK)
    assert not plan.sends
    assert failed.write.state.status is RunStatus.FAILED
    assert failed.write.loaded_checksum == loaded("r").stored_checksum
    # The write found the run moved: not a livelock. Attempts start again at once.
    refused = force_fail_refused(plan)
    assert (refused.outcome, payload_of(refused, TryAgain)) == (Outcome.CONFLICT, TryAgain(0, 0))


def test_progress_since_the_last_requeue_restarts_the_count() -> None:
    requeued = Wakeup("r", "requeue", requeue_count=2, requeue_seq=2, observed_seq=0)
    record = accepted(wakeup_message(1, requeued))
    plan = _conflict([record], MAX_IN_PROCESS_TRIES - 1, seq=5)
    assert plan.outcome is Outcome.REQUEUED
    again = decode_wakeup(plan.sends[0].value, MAX_BYTES)
    assert isinstance(again, Wakeup)
    assert (again.requeue_count, again.requeue_seq, again.observed_seq) == (1, 3, 5)


def test_a_database_error_decides_nothing_and_retries_later() -> None:
    plan = database_failed(item("r", [accepted(_start("r", 1))], tries=2), 1000)
    retry = payload_of(plan, TryAgain)
    assert (plan.outcome, plan.tick_outcome, retry.tries) == (Outcome.ERROR, None, 2)
    assert retry.retry_in_ms and not plan.sends


def test_a_committed_tick_dispatches_and_a_noop_does_nothing() -> None:
    run = loaded("r")
    commits = tick_batch({"r": run}, NOW_MS, NAMES)
    plan = decide(item("r", []), run, commits["r"], True, NOW_MS, RULES)
    assert plan.outcome is Outcome.COMMITTED and plan.expected_version == run.version
    task = orjson.loads(plan.sends[0].value or b"")
    assert (task["node"], task["attempt"], task["tier"]) == ("first", 1, "t1")
    commit = commits["r"]
    assert commit.expected_version == run.version and commit.state.status is RunStatus.RUNNING
    assert commit.effects == plan.sends  # what goes to the outbox is what gets produced
    assert payload_of(plan, Produce).outboxed_seq == commit.state.seq
    started = loaded("r", commit.state)
    assert tick_batch({"r": started}, NOW_MS, NAMES) == {}  # nothing changes: a no-op
    plan = decide(item("r", []), started, None, False, NOW_MS, RULES)
    assert (plan.outcome, plan.sends, plan.settles) == (Outcome.NOOP, (), True)


# -- offsets --------------------------------------------------------------------------------


def test_the_offset_never_passes_a_record_still_waiting_in_a_queue() -> None:
    """Offset 5 is accepted and waits in its tier queue; 6 is dead-lettered and done at once.
    The stored position stays at 5 until 5 itself is done."""
    tracker = OffsetTracker()
    tp = (NAMES.wakeup("t1"), 0)
    waiting = accepted(_start("r", 5))
    tracker.started(waiting.tp, waiting.offset)  # taken at intake, as the processor does
    bad = admit(FakeMessage(tp[0], 6, b"garbage"), NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(bad, Reject)
    tracker.started(bad.record.tp, bad.record.offset)
    tracker.done(bad.record.tp, bad.record.offset)  # its dead letter was acknowledged
    assert tracker.committable() == {tp: 5}
    tracker.done(waiting.tp, waiting.offset)
    assert tracker.committable() == {tp: 7}


@st.composite
def _arrivals(draw: st.DrawFn) -> tuple[list[bool], list[int]]:
    """For each offset, whether its record is good (queued, done later) or garbage (done at
    once); and the order in which the good ones finish."""
    good = draw(st.lists(st.booleans(), min_size=1, max_size=30))
    order = draw(st.permutations([i for i, ok in enumerate(good) if ok]))
    return good, list(order)


@FAST
@given(_arrivals(), st.data())
def test_the_stored_position_never_passes_an_unfinished_record(
    arrivals: tuple[list[bool], list[int]], data: st.DataObject
) -> None:
    good, order = arrivals
    tracker = OffsetTracker()
    tp = (NAMES.wakeup("t1"), 0)
    unfinished: set[int] = set()
    position = 0  # the stored position: the next offset to read after a restart

    def check() -> None:
        nonlocal position
        position = tracker.committable().get(tp, position)
        assert position <= min(unfinished, default=position)

    for offset, ok in enumerate(good):
        value = Wakeup(f"r{offset}", "start").encode() if ok else b"\xff garbage"
        verdict = admit(FakeMessage(tp[0], offset, value), NAMES, MAX_BYTES, NOW_MS)
        tracker.started(verdict.record.tp, verdict.record.offset)
        if isinstance(verdict, Reject):
            tracker.done(tp, offset)  # dead-lettered and acknowledged at once
        else:
            unfinished.add(offset)
        check()
    for offset in order:
        tracker.done(tp, offset)
        if data.draw(st.booleans()):
            tracker.done(tp, offset)  # a second acknowledgement changes nothing
        unfinished.discard(offset)
        check()
    assert position == len(good)  # everything done: nothing is redelivered


@FAST
@given(
    st.binary(max_size=3000),
    st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=400)), max_size=5),
    st.integers(2000, 6000),  # the smallest real limits are a thousand times larger
)
def test_a_dead_letter_always_fits_and_says_when_it_was_cut(
    value: bytes, own: list[tuple[str, bytes]], limit: int
) -> None:
    headers = dead_letter_headers(own, "oversize", "too big", NAMES.wakeup("t1"), 0, 5)
    cut, kept = truncate_dead_letter(b"key", value, headers, limit)
    size = 3 + (len(cut) if cut is not None else 0) + sum(len(k) + len(v) for k, v in kept)
    sizes = dict(kept)
    if cut == value:
        assert kept == headers and TRUNCATED not in sizes
    else:
        assert size + RECORD_OVERHEAD_BYTES <= limit
        assert cut is not None and value.startswith(cut)
        assert sizes[TRUNCATED] == str(len(value)).encode() and sizes[REASON] == b"oversize"
