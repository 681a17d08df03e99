"""The reports example (examples/reports) without services: its workflow, built in Python, is
valid and matches the JSON schema; its step functions, called as plain functions, give the
report its README shows."""

from __future__ import annotations

import json

import pytest
from jsonschema import Draft202012Validator

from processor import StepContext, StepFailed
from tests.example_modules import REPO, example_module

FLOWS = example_module("reports/flows.py", "reports_example_flows")


def test_the_workflow_is_valid_and_maps_over_the_regions() -> None:
    schema = json.loads((REPO / "schemas" / "workflow.schema.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(FLOWS.report.to_json())) == []
    wf = FLOWS.report.definition()
    summarize = wf.step("summarize")
    assert summarize.maps and summarize.items_from == "regions" and summarize.parallelism == 3
    assert FLOWS.report.registry.types() == ["publish", "regions", "summarize"]


def test_the_steps_give_the_report_the_readme_shows() -> None:
    run_input = {"regions": ["north", "south", "east", "west"]}
    regions = FLOWS.regions(StepContext("r", "regions", 1, 0, run_input))
    summaries = [
        FLOWS.summarize(StepContext("r", f"summarize[{i}]", 1, 0, run_input, item=r, index=i))
        for i, r in enumerate(regions)
    ]
    report = FLOWS.publish(StepContext("r", "publish", 1, 0, run_input, {"summarize": summaries}))
    assert report == {
        "lines": [
            "north: 1234.50 EUR",
            "south: 980.00 EUR",
            "east: 1502.75 EUR",
            "west: 871.25 EUR",
        ],
        "total": "4588.50 EUR",
    }
    with pytest.raises(StepFailed, match="no sales figures for region 'mars'"):
        FLOWS.summarize(StepContext("r", "summarize[0]", 1, 0, run_input, item="mars", index=0))
    with pytest.raises(StepFailed, match="needs 'regions'"):
        FLOWS.regions(StepContext("r", "regions", 1, 0, {}))
