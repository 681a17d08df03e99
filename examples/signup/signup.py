"""The signup example: a customer signs up for a plan, in a workflow that decides
(processor.Workflow). From this directory:

    ductor workflows register signup:signup
    ductor worker --app signup:signup

One signup per customer at a time, the others waiting in line; a seat is reserved, then the
card is charged (version 2 of the charge: it adds VAT); a team plan gets a workspace, the
others skip it; the welcome waits a second for the e-mail to be confirmed and goes on
without; a declined card fails the run: support is told and the seat released (a saga). A
run must end within two minutes of its start.
"""

from __future__ import annotations

from typing import Any

from processor import Concurrency, NonRetryable, StepContext, Workflow

PRICES_CENTS = {"solo": 900, "team": 4900}
VAT_PERCENT = 19


def notify_support(ctx: StepContext) -> dict[str, Any]:
    """Run once when a signup fails; ctx.deps["failure"] says which step failed and why."""
    failure = ctx.deps["failure"]
    return {"ticket": f"signup of {ctx.input['customer']}: {failure['step']} failed"}


signup = Workflow(
    "signup",
    output={"charge": "charge_card", "workspace": "create_workspace", "welcome": "welcome"},
    concurrency=Concurrency(1, key="customer"),
    timeout="2m",
    on_failure=notify_support,
)


def release_seat(ctx: StepContext) -> dict[str, Any]:
    """Undoes reserve_seat: ctx.deps["reserve_seat"] is what it returned."""
    return {"released": ctx.deps["reserve_seat"]["seat"]}


@signup.step(compensate=release_seat)
def reserve_seat(ctx: StepContext) -> dict[str, Any]:
    """A seat on the plan; the run is tagged with it, so `runs list --tag plan=team` finds it."""
    plan = ctx.input["plan"]
    if plan not in PRICES_CENTS:
        raise NonRetryable(f"no plan named {plan!r}")
    ctx.tag("plan", plan)
    return {"seat": f"{plan}-{ctx.input['customer']}"}


@signup.step(after=[reserve_seat], version=2)
def charge_card(ctx: StepContext) -> dict[str, Any]:
    """Version 2 of the charge: the plan's price and VAT. A declined card fails the step at
    once (NonRetryable: no retry would change the bank's answer)."""
    if ctx.input.get("card") == "declined":
        raise NonRetryable(f"card of {ctx.input['customer']} declined")
    net = PRICES_CENTS[ctx.input["plan"]]
    return {"net_cents": net, "total_cents": net + net * VAT_PERCENT // 100}


@signup.step(after=[charge_card], when='$.input.plan == "team"')
def create_workspace(ctx: StepContext) -> dict[str, Any]:
    """Only for a team plan; skipped (no output, never run) for the others."""
    return {"workspace": f"ws-{ctx.input['customer']}"}


signup.wait(
    "email_confirmed",
    signal="email_confirmed",
    timeout="1s",
    on_timeout="continue",
    default={"confirmed": False},
    after=[charge_card],
)


@signup.step(after=[create_workspace, "email_confirmed"], run_if="all_done")
def welcome(ctx: StepContext) -> dict[str, Any]:
    """Runs once both ended, the workspace created or skipped, the e-mail confirmed or not."""
    confirmed = bool(ctx.deps["email_confirmed"].get("confirmed"))
    return {"to": ctx.input["customer"], "confirmed_email": confirmed}
