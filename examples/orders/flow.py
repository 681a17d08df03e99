"""The orders workflow written in Python (processor/authoring.py), on the step functions of
steps.py: the same definition as workflow.json beside this file (a test holds them equal).
From this directory:

    ductor workflows register flow:orders
    ductor worker --app flow:orders

A step's type is its function's name; its options sit beside it. A module of your own would
define the functions here and decorate them: ``@orders.step(after=[validate_order])``.
"""

from __future__ import annotations

from steps import confirm_order, price_order, reserve_stock, validate_order

from processor import Retry, Workflow

orders = Workflow(
    "orders",
    version=1,
    description=(
        "an order: validate it, then price it and reserve its stock in parallel, then confirm it"
    ),
    output={"confirmation": "confirm", "charges": "price"},
)

# A bad order fails at once: trying again cannot help.
orders.step(name="validate", retry=Retry(max_attempts=1))(validate_order)
orders.step(name="price", after=["validate"])(price_order)
# The warehouse may be briefly away: three attempts, 200 ms apart at first.
orders.step(name="reserve", after=["validate"], retry=Retry(3, backoff="200ms"))(reserve_stock)
orders.step(name="confirm", after=["price", "reserve"])(confirm_order)
