"""What becomes of a request read from ductor.requests (processor/core/request_plans.py):
intake hands it over decoded, and each answer of the request statement makes one plan."""

from __future__ import annotations

import pytest

from processor.core.dead_letters import REASON, SOURCE_OFFSET, SOURCE_TOPIC
from processor.core.envelope import Wakeup, decode_wakeup
from processor.core.intake import Reject, Requested, admit
from processor.core.outcomes import DeadLetterReason, Outcome
from processor.core.plans import Rules
from processor.core.records import Inbound
from processor.core.request_plans import (
    Created,
    Kept,
    Refused,
    RequestAnswer,
    Signalled,
    StartedBefore,
    request_plan,
)
from processor.core.requests import SignalRequest, StartRequest

from .fakes import MAX_BYTES, NAMES, NOW_MS, FakeMessage

RULES = Rules(NAMES, livelock_requeues=3)
START = StartRequest("order-1", "checkout", input={"sku": "a"}, tier="t0")


def _requested(value: bytes, offset: int = 4) -> Requested:
    verdict = admit(FakeMessage(NAMES.requests, offset, value, 1), NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Requested)
    return verdict


def test_a_request_is_handed_over_decoded_with_its_record() -> None:
    verdict = _requested(START.encode())
    assert verdict.request == START
    assert verdict.record.tp == (NAMES.requests, 1) and verdict.record.offset == 4
    assert verdict.record.tier == "requests"


def test_a_wakeup_is_no_request_and_garbage_is_refused_at_intake() -> None:
    wakeup = b'{"envelope_version": 1, "run_id": "r", "reason": "start"}'
    verdict = admit(FakeMessage(NAMES.requests, 0, wakeup), NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Reject) and verdict.reason is DeadLetterReason.WRONG_SCHEMA
    verdict = admit(FakeMessage(NAMES.requests, 0, b"{nope"), NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(verdict, Reject) and verdict.reason is DeadLetterReason.NOT_JSON


def _record() -> Inbound:
    return _requested(START.encode()).record


@pytest.mark.parametrize(
    ("answer", "outcome", "reason"),
    [
        (Created("t0"), Outcome.ACCEPTED, "start"),
        (StartedBefore("t2"), Outcome.DUPLICATE, "start"),
        (Signalled("t1", new=True), Outcome.ACCEPTED, "signal"),
        (Signalled("t1", new=False), Outcome.DUPLICATE, "signal"),
    ],
)
def test_a_run_started_or_signalled_is_woken_on_its_own_tier(
    answer: RequestAnswer, outcome: Outcome, reason: str
) -> None:
    plan = request_plan(_record(), "order-1", answer, NOW_MS, RULES)
    assert plan.outcome is outcome and plan.run_id == "order-1"
    (send,) = plan.sends
    assert isinstance(answer, Created | StartedBefore | Signalled)
    assert send.topic == NAMES.wakeup(answer.tier) and send.by_run == "order-1"
    wakeup = decode_wakeup(send.value, MAX_BYTES)
    assert isinstance(wakeup, Wakeup)
    assert (wakeup.run_id, wakeup.reason, wakeup.produced_at) == ("order-1", reason, NOW_MS)


@pytest.mark.parametrize(("new", "outcome"), [(True, Outcome.ACCEPTED), (False, Outcome.DUPLICATE)])
def test_a_kept_signal_sends_nothing_yet(new: bool, outcome: Outcome) -> None:
    plan = request_plan(_record(), "order-1", Kept(new), NOW_MS, RULES)
    assert plan.outcome is outcome and plan.sends == ()


def test_a_refused_request_is_a_dead_letter_of_its_own_bytes() -> None:
    record = _record()
    refused = Refused(DeadLetterReason.CONFLICTING_START, "run 'order-1' exists already")
    plan = request_plan(record, "order-1", refused, NOW_MS, RULES)
    assert plan.outcome is Outcome.DEAD_LETTERED and not plan.quarantine
    (send,) = plan.sends
    assert send.topic == NAMES.dlq and send.value == START.encode()
    headers = dict(send.headers)
    assert headers[REASON] == b"conflicting_start"
    assert (headers[SOURCE_TOPIC], headers[SOURCE_OFFSET]) == (NAMES.requests.encode(), b"4")


def test_a_signal_round_trips_through_intake() -> None:
    signal = SignalRequest("order-1", "cancel", "sig-1", {"by": "ops"})
    assert _requested(signal.encode()).request == signal
