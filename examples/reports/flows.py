"""The reports example: a daily report written in Python (processor.Workflow), with a map
step, started by a schedule. From this directory:

    ductor workflows register flows:report
    ductor worker --app flows:report
    ductor schedules create daily-report --cron "0 6 * * *" --tz Europe/Berlin \\
        --workflow report --input '{"regions": ["north", "south", "east", "west"]}'

``regions`` lists the regions from the run's input; ``summarize`` runs once per region, three
at once (each its own step attempt, retried on its own); ``publish`` reads the summaries in
the regions' order and writes the report, which is the run's output.
"""

from __future__ import annotations

from typing import Any

from processor import Retry, StepContext, StepFailed, Workflow

# What a warehouse would answer: sales by region, in cents.
SALES_CENTS = {"north": 123_450, "south": 98_000, "east": 150_275, "west": 87_125}

report = Workflow("report", version=1, output="publish")


@report.step(retry=Retry(max_attempts=1))
def regions(ctx: StepContext) -> list[str]:
    """The regions to report on, from the run's input (a schedule's fixed input)."""
    wanted = ctx.input.get("regions") if isinstance(ctx.input, dict) else None
    if not isinstance(wanted, list) or not all(isinstance(r, str) for r in wanted):
        raise StepFailed("the input needs 'regions', a list of region names")
    return wanted


@report.map(items_from=regions, parallelism=3, retry=Retry(3, backoff="500ms"))
def summarize(ctx: StepContext) -> dict[str, Any]:
    """One region's figures (ctx.item is the region's name)."""
    region = str(ctx.item)
    if region not in SALES_CENTS:
        raise StepFailed(f"no sales figures for region {region!r}")
    return {"region": region, "sales_cents": SALES_CENTS[region]}


@report.step(after=[summarize])
def publish(ctx: StepContext) -> dict[str, Any]:
    """The report: each region's line, in the input's order, and the total."""
    summaries = ctx.deps["summarize"]
    total = sum(s["sales_cents"] for s in summaries)
    return {
        "lines": [f"{s['region']}: {s['sales_cents'] / 100:.2f} EUR" for s in summaries],
        "total": f"{total / 100:.2f} EUR",
    }
