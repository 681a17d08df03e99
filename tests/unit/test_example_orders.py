"""The orders example (examples/orders) without services: its workflow is valid and every
step type it names has a function in its registry, and its step functions, called as plain
functions the way a user would test their own, give what the README shows."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from processor.core.workflow import parse_workflow
from processor.worker import StepContext, StepFailed, StepRegistry

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "orders"
WORKFLOW: dict[str, Any] = json.loads((EXAMPLE / "workflow.json").read_text())
ORDER = {
    "order_id": "1001",
    "customer": "ada@example.com",
    "country": "DE",
    "items": [
        {"sku": "book", "qty": 2, "unit_cents": 1250},
        {"sku": "mug", "qty": 1, "unit_cents": 899},
    ],
}


def _load_steps() -> ModuleType:
    """examples/orders/steps.py, loaded from its file (the example is not a package)."""
    spec = importlib.util.spec_from_file_location("orders_example_steps", EXAMPLE / "steps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


STEPS = _load_steps()
REGISTRY: StepRegistry = STEPS.registry


def _run(step_type: str, run_input: Any, deps: dict[str, Any] | None = None) -> Any:
    fn = REGISTRY.get(step_type)
    assert fn is not None
    return fn(StepContext("order-1001", step_type, 1, 0, run_input, deps or {}))


def test_the_workflow_is_valid_and_every_step_type_has_a_function() -> None:
    schema = json.loads((REPO / "schemas" / "workflow.schema.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(WORKFLOW)) == []
    wf = parse_workflow(WORKFLOW)
    assert sorted({step.step_type for step in wf.steps}) == REGISTRY.types()
    assert wf.step("confirm").depends_on == ("price", "reserve")


def test_the_steps_price_reserve_and_confirm_an_order() -> None:
    order = _run("validate_order", ORDER)
    assert order["subtotal_cents"] == 3399
    price = _run("price_order", ORDER, {"validate": order})
    assert price == {
        "subtotal_cents": 3399,
        "shipping_cents": 495,
        "tax_cents": 740,  # 19 % of 38.94 is 7.3986
        "total_cents": 4634,
    }
    reservation = _run("reserve_stock", ORDER, {"validate": order})
    assert reservation == {"reservation": "res-order-1001", "skus": ["book", "mug"], "units": 3}
    confirmation = _run("confirm_order", ORDER, {"price": price, "reserve": reservation})
    assert confirmation["message"] == "order 1001: 3 item(s), 46.34 EUR, confirmed"
    big = {**ORDER, "items": [{"sku": "desk", "qty": 1, "unit_cents": 5000}]}
    assert (
        _run("price_order", big, {"validate": _run("validate_order", big)})["shipping_cents"] == 0
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"country": "US"}, "we do not ship to 'US'"),
        ({"items": []}, "the order has no items"),
        ({"items": [{"sku": "book", "qty": 0, "unit_cents": 1}]}, "needs a qty >= 1"),
        ({"items": ["book"]}, "an item is not a JSON object"),
        ({"customer": None}, "the order needs 'customer', a string"),
    ],
)
def test_a_bad_order_fails_in_validate(edit: dict[str, Any], message: str) -> None:
    with pytest.raises(StepFailed, match=message):
        _run("validate_order", {**ORDER, **edit})
    with pytest.raises(StepFailed, match="the run input is not a JSON object"):
        _run("validate_order", [ORDER])


def test_the_workflow_written_in_python_is_the_json_one() -> None:
    """examples/orders/flow.py builds in code what workflow.json says, on steps.py's
    functions: the same definition, and a registry of the same step types."""
    sys.path.insert(0, str(EXAMPLE))
    try:
        spec = importlib.util.spec_from_file_location("orders_example_flow", EXAMPLE / "flow.py")
        assert spec is not None and spec.loader is not None
        flow = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(flow)
    finally:
        sys.path.remove(str(EXAMPLE))
    assert flow.orders.definition() == parse_workflow(WORKFLOW)
    assert flow.orders.to_json()["description"] == WORKFLOW["description"]
    assert flow.orders.registry.types() == REGISTRY.types()


def test_the_approval_variant_is_valid_and_waits_for_a_signal_before_it_confirms() -> None:
    raw = json.loads((EXAMPLE / "approval.json").read_text())
    schema = json.loads((REPO / "schemas" / "workflow.schema.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(raw)) == []
    wf = parse_workflow(raw)
    approve = wf.step("approve")
    assert approve.waits and approve.signal == "approved"
    assert "approve" in wf.step("confirm").depends_on
    assert {s.step_type for s in wf.steps if not s.waits} <= set(REGISTRY.types())
    confirmation = _run(
        "confirm_order",
        ORDER,
        {
            "price": {"total_cents": 4634},
            "reserve": {"reservation": "res-order-1001", "units": 3},
            "approve": {"by": "grace@example.com"},
        },
    )
    assert confirmation["approved_by"] == "grace@example.com"
