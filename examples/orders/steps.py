"""The step functions of the orders example (workflow.json beside this file). Run them with
`ductor worker --app steps:registry` from this directory.

Each step is plain Python: it reads the run's input (``ctx.input``) and the outputs of the
steps it depends on (``ctx.deps["step name"]``) and returns a JSON-serialisable output, or
raises ``StepFailed`` to fail its attempt. Money is in integer cents.

``reserve`` stands for a call to a warehouse: it refuses an item whose SKU is listed in
``out_of_stock.txt`` beside this file (one SKU a line; no file: everything is in stock). A run
that orders such an item fails once the step's retries are spent; restock (remove the line)
and ``ductor runs retry RUN_ID`` finishes the run without running its other steps again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from processor import StepContext, StepFailed, StepRegistry

OUT_OF_STOCK = Path(__file__).with_name("out_of_stock.txt")
TAX_PERCENT = {"DE": 19, "FR": 20, "NL": 21}  # the countries we ship to, and their VAT
SHIPPING_CENTS = 495
FREE_SHIPPING_FROM_CENTS = 5000

registry = StepRegistry()


@registry.step("validate_order")
def validate_order(ctx: StepContext) -> dict[str, Any]:
    """The run's input, checked: one line per item with its amount, and the subtotal. A bad
    order fails here, once (its retry policy allows one attempt: trying again cannot help)."""
    order = _object(ctx.input, "the run input")
    for key in ("order_id", "customer"):
        if not isinstance(order.get(key), str):
            raise StepFailed(f"the order needs {key!r}, a string")
    country = order.get("country", "DE")
    if country not in TAX_PERCENT:
        raise StepFailed(f"we do not ship to {country!r}")
    items = order.get("items")
    if not isinstance(items, list) or not items:
        raise StepFailed("the order has no items")
    lines = []
    for item in items:
        line = _object(item, "an item")
        quantity, unit_cents = line.get("qty"), line.get("unit_cents")
        if not isinstance(quantity, int) or quantity < 1 or not isinstance(unit_cents, int):
            raise StepFailed(f"item {line.get('sku')!r} needs a qty >= 1 and unit_cents")
        lines.append(
            {"sku": str(line["sku"]), "qty": quantity, "amount_cents": quantity * unit_cents}
        )
    return {
        "country": country,
        "lines": lines,
        "subtotal_cents": sum(line["amount_cents"] for line in lines),
    }


@registry.step("price_order")
def price_order(ctx: StepContext) -> dict[str, Any]:
    """Shipping and VAT on the validated order."""
    order = ctx.deps["validate"]
    subtotal = order["subtotal_cents"]
    shipping = 0 if subtotal >= FREE_SHIPPING_FROM_CENTS else SHIPPING_CENTS
    # VAT on goods and shipping, rounded half up to the cent.
    tax = ((subtotal + shipping) * TAX_PERCENT[order["country"]] + 50) // 100
    return {
        "subtotal_cents": subtotal,
        "shipping_cents": shipping,
        "tax_cents": tax,
        "total_cents": subtotal + shipping + tax,
    }


@registry.step("reserve_stock")
def reserve_stock(ctx: StepContext) -> dict[str, Any]:
    """Reserves the order's items. The reservation is named after the run, so an attempt
    that runs again (a retry, a redelivered task) reserves the same stock, not more."""
    order = ctx.deps["validate"]
    skus = sorted({line["sku"] for line in order["lines"]})
    unavailable = _out_of_stock()
    missing = [sku for sku in skus if sku in unavailable]
    if missing:
        raise StepFailed(f"out of stock: {', '.join(missing)}")
    return {
        "reservation": f"res-{ctx.run_id}",
        "skus": skus,
        "units": sum(line["qty"] for line in order["lines"]),
    }


@registry.step("confirm_order")
def confirm_order(ctx: StepContext) -> dict[str, Any]:
    """The confirmation sent to the customer, from the price and the reservation (and, in
    approval.json's workflow, the approval: the payload of the signal its wait step got)."""
    total = ctx.deps["price"]["total_cents"]
    reservation = ctx.deps["reserve"]
    order_id = ctx.input["order_id"]
    confirmation = {
        "order_id": order_id,
        "customer": ctx.input["customer"],
        "reservation": reservation["reservation"],
        "message": (
            f"order {order_id}: {reservation['units']} item(s),"
            f" {total // 100}.{total % 100:02d} EUR, confirmed"
        ),
    }
    if "approve" in ctx.deps:
        confirmation["approved_by"] = _object(ctx.deps["approve"], "the approval").get("by")
    return confirmation


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise StepFailed(f"{what} is not a JSON object")
    return value


def _out_of_stock() -> set[str]:
    try:
        return set(OUT_OF_STOCK.read_text().split())
    except FileNotFoundError:
        return set()
