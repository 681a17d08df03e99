"""The chaos run's hostile records (processor/tools/chaos_hostile.py): each kind is refused
at intake with the reason the run expects of it, under the scope the processors of the run
read the requests topic with, but the two the database decides (a colliding start, an
approval of a run that waits for none), which the scope lets through; the run's own traffic
fits the scope."""

from __future__ import annotations

import pytest

from processor.core.outcomes import DeadLetterReason
from processor.core.requests import SignalRequest, StartRequest, decode_request
from processor.core.scopes import scope_refusal
from processor.io.config.settings import Settings
from processor.tools.chaos_hostile import map_run_id, map_workflow, scoped
from processor.tools.chaos_hostile_kinds import APPROVAL, KINDS, MAP_WORKFLOW, Kind, Target

TOPIC_PREFIX = "chaos-ab12cd"
SETTINGS = scoped(Settings(), TOPIC_PREFIX)
SCOPE = SETTINGS.requests_scope
TARGET = Target(7, f"{TOPIC_PREFIX}-17", TOPIC_PREFIX, map_run_id(TOPIC_PREFIX))
# Decided by the request statement, against the runs as they are: past the intake.
IN_THE_DATABASE = {DeadLetterReason.CONFLICTING_START, DeadLetterReason.UNKNOWN_SIGNAL}


def _intake(value: bytes) -> DeadLetterReason | None:
    """What the processor's intake says of a record of the requests topic (None: it passes)."""
    request = decode_request(value, SETTINGS.max_record_bytes)
    if isinstance(request, StartRequest | SignalRequest):
        refused = scope_refusal(SCOPE, request)
        return None if refused is None else refused.reason
    return request.reason


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.name)
def test_each_hostile_kind_meets_the_refusal_the_chaos_run_expects(kind: Kind) -> None:
    _key, value = kind.build(TARGET)
    expected = None if kind.reason in IN_THE_DATABASE else kind.reason
    assert _intake(value) == expected


def test_the_kinds_cover_deep_reserved_colliding_and_forged_records() -> None:
    reasons = {k.reason for k in KINDS}
    assert {
        DeadLetterReason.OUT_OF_BOUNDS,
        DeadLetterReason.RESERVED_RUN_ID,
        DeadLetterReason.CONFLICTING_START,
        DeadLetterReason.NOT_ALLOWED,
        DeadLetterReason.UNKNOWN_SIGNAL,
    } <= reasons
    assert len({k.name for k in KINDS}) == len(KINDS)


def test_the_runs_own_traffic_fits_the_scope_and_a_10000_item_map_fits_a_record() -> None:
    map_id = map_run_id(TOPIC_PREFIX)
    start = StartRequest(map_id, MAP_WORKFLOW, input=list(range(10_000))).encode()
    approval = SignalRequest(map_id, APPROVAL, f"{map_id}:approval", {"by": "chaos"}).encode()
    for value in (start, approval):
        assert _intake(value) is None
    wf = map_workflow(60.0)
    assert wf.step("items").max_items == 10_000 and wf.signals == frozenset({APPROVAL})
    # Beside the ordinary runs' prefix, whose checks count every run under it.
    assert not map_id.startswith(f"{TOPIC_PREFIX}-")
