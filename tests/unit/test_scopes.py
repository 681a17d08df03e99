"""Scopes (core/scopes.py): what the requests topic and each trigger may ask for. A request
outside its door's scope is refused as a value (``not_allowed``, the detail naming the door
and what it may do) before anything is written; a signal trigger must have a run-id prefix;
the operator's lists are read and refused as the other settings are."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from processor.core.intake import Reject, Requested, admit, admit_trigger
from processor.core.outcomes import DeadLetterReason
from processor.core.requests import Request, SignalRequest, StartRequest
from processor.core.scopes import (
    ANY_DOOR,
    Scope,
    format_scope_list,
    parse_scope_list,
    scope_refusal,
)
from processor.core.triggers import parse_trigger, trigger_scope
from processor.io.config.settings import Settings, load_settings
from processor.io.config.values import ConfigError

from .fakes import MAX_BYTES, NAMES, NOW_MS, FakeMessage
from .strategies import FAST

SHOP = Scope("the requests topic", ("orders",), ("order-", "shop-"), ("cancel",))


@pytest.mark.parametrize(
    ("request_", "refused_for"),
    [
        (StartRequest("order-1", "orders"), None),
        (SignalRequest("shop-7", "cancel", "s"), None),
        (StartRequest("order-1", "payroll"), "may not start workflow 'payroll'"),
        (StartRequest("bank-1", "orders"), "may not start run 'bank-1'"),
        (SignalRequest("order-1", "approve", "s"), "may not send signal 'approve'"),
        (SignalRequest("bank-1", "cancel", "s"), "may not signal run 'bank-1'"),
    ],
)
def test_a_request_outside_its_doors_scope_is_not_allowed(
    request_: Request, refused_for: str | None
) -> None:
    refused = scope_refusal(SHOP, request_)
    if refused_for is None:
        assert refused is None
        return
    assert refused is not None and refused.reason is DeadLetterReason.NOT_ALLOWED
    assert refused.detail.startswith(f"the requests topic {refused_for}")


def test_an_empty_list_allows_nothing_and_says_so() -> None:
    closed = Scope("the requests topic", (), (), ())
    start = scope_refusal(closed, StartRequest("a", "w"))
    assert start is not None and start.detail.endswith("it may start no workflow")
    signal = scope_refusal(Scope("d", None, (), None), SignalRequest("a", "cancel", "s"))
    assert signal is not None and signal.detail.endswith("it may reach no run")
    assert closed.describe() == (
        "the requests topic: may start no workflow; may send no signal; reaches no run id"
    )


def test_the_requests_topic_is_unscoped_unless_the_operator_says_otherwise() -> None:
    scope = Settings().requests_scope
    assert scope.unscoped and scope == Scope(scope.door)
    assert "unscoped" in scope.describe()
    for request in (StartRequest("x", "any"), SignalRequest("y", "approve", "s", {"ok": 1})):
        assert scope_refusal(scope, request) is None


_NAMES = st.sampled_from(["a", "b", "orders", "cancel", "approve"])
_LISTS = st.none() | st.lists(_NAMES, max_size=3).map(tuple)
_PREFIXES = st.none() | st.lists(st.sampled_from(["a", "ab", "o-", ""]), max_size=2).map(
    lambda items: tuple(p for p in items if p)
)
_IDS = st.sampled_from(["a", "ab-1", "o-1", "x"])
_REQUESTS = st.one_of(
    st.tuples(_IDS, _NAMES).map(lambda t: StartRequest(t[0], t[1])),
    st.tuples(_IDS, _NAMES).map(lambda t: SignalRequest(t[0], t[1], "s")),
)


@FAST
@given(_LISTS, _PREFIXES, _LISTS, _REQUESTS)
def test_a_request_is_allowed_exactly_when_each_list_holds_it(
    workflows: tuple[str, ...] | None,
    prefixes: tuple[str, ...] | None,
    signals: tuple[str, ...] | None,
    request: Request,
) -> None:
    scope = Scope("d", workflows, prefixes, signals)
    if isinstance(request, StartRequest):
        named_ok = workflows is None or request.workflow in workflows
    else:
        named_ok = signals is None or request.name in signals
    run_ok = prefixes is None or any(request.run_id.startswith(p) for p in prefixes)
    assert (scope_refusal(scope, request) is None) is (named_ok and run_ok)


# -- the requests topic at the intake -------------------------------------------------------


def _requests_record(request: Request) -> FakeMessage:
    return FakeMessage(NAMES.requests, 11, request.encode(), 1, request.run_id.encode())


def test_the_intake_refuses_a_request_outside_the_scope_before_anything_is_written() -> None:
    forged = SignalRequest("payroll-9", "approve", "forged", {"amount": 10**6})
    verdict = admit(_requests_record(forged), NAMES, MAX_BYTES, NOW_MS, SHOP)
    assert isinstance(verdict, Reject) and verdict.reason is DeadLetterReason.NOT_ALLOWED
    assert "may not send signal 'approve'" in verdict.detail
    assert verdict.record.offset == 11  # the record, kept for its dead letter
    allowed = admit(_requests_record(StartRequest("order-1", "orders")), NAMES, MAX_BYTES, NOW_MS)
    assert isinstance(allowed, Requested)
    # Unscoped by default: the same forged signal is a request.
    assert isinstance(admit(_requests_record(forged), NAMES, MAX_BYTES, NOW_MS), Requested)
    assert ANY_DOOR.unscoped


# -- triggers ---------------------------------------------------------------------------------


def _signal_trigger(**extra: Any) -> dict[str, Any]:
    return {"trigger_version": 1, "topic": "t", "action": "signal", "run_id": "$.run", **extra}


def test_a_signal_trigger_without_a_run_id_prefix_is_refused() -> None:
    with pytest.raises(ValueError, match="a signal trigger needs a run-id prefix"):
        parse_trigger("cancels-in", _signal_trigger())
    with pytest.raises(ValueError, match="needs a run-id prefix"):
        parse_trigger("cancels-in", _signal_trigger(run_id_prefix=""))


def test_a_triggers_definition_is_its_scope() -> None:
    cancels = parse_trigger("cancels-in", _signal_trigger(run_id_prefix="order-"))
    assert trigger_scope(cancels) == Scope("trigger cancels-in", (), ("order-",), ("cancel",))
    start = {"trigger_version": 1, "topic": "o", "action": "start", "workflow": "checkout"}
    orders = parse_trigger("orders-in", start)
    assert trigger_scope(orders) == Scope("trigger orders-in", ("checkout",), None, ())
    # What it maps a record to is always inside its scope: requested.
    message = FakeMessage("t", 3, b'{"run": "1"}', 0)
    verdict = admit_trigger(message, cancels, MAX_BYTES)
    assert isinstance(verdict, Requested) and verdict.request.run_id == "order-1"


# -- the settings -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "items"),
    [
        ("*", None),
        (" * ", None),
        ("", ()),
        ("  ", ()),
        ("orders", ("orders",)),
        (" orders , billing,orders ", ("orders", "billing")),
    ],
)
def test_a_scope_list_is_any_none_or_its_items(text: str, items: tuple[str, ...] | None) -> None:
    assert parse_scope_list("workflows", text) == items
    assert parse_scope_list("workflows", format_scope_list(items)) == items


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("DUCTOR_REQUESTS_WORKFLOWS", "orders,,billing", "an empty item"),
        ("DUCTOR_REQUESTS_WORKFLOWS", "orders,*", "'*' stands alone"),
        ("DUCTOR_REQUESTS_SIGNALS", "cancel,stop now", "'stop now' is not a signal name"),
        ("DUCTOR_REQUESTS_RUN_ID_PREFIXES", "x" * 200, "as long as a run id may be"),
    ],
)
def test_a_scope_setting_that_cannot_be_read_is_refused_naming_it(
    variable: str, value: str, words: str
) -> None:
    with pytest.raises(ConfigError, match=words) as refused:
        load_settings({variable: value})
    assert str(refused.value).startswith(f"{variable}=")


def test_the_scope_settings_make_the_requests_topics_scope() -> None:
    settings = load_settings(
        {
            "DUCTOR_REQUESTS_WORKFLOWS": "orders",
            "DUCTOR_REQUESTS_RUN_ID_PREFIXES": "order-,shop-",
            "DUCTOR_REQUESTS_SIGNALS": "cancel",
        }
    )
    scope = settings.requests_scope
    assert (scope.workflows, scope.run_id_prefixes, scope.signals) == (
        ("orders",),
        ("order-", "shop-"),
        ("cancel",),
    )
    assert scope.describe() == (
        "the requests topic (DUCTOR_REQUESTS_*): may start 'orders'; may send 'cancel';"
        " reaches run ids beginning with 'order-', 'shop-'"
    )
