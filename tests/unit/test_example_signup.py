"""The signup example (examples/signup) without services: its workflow, built in Python, is
valid, matches the JSON schema and says what its README says it does (one run per customer, a
deadline, a versioned charge, a condition, a wait that goes on, a failure handler and a
compensation); its step functions, called as plain functions, give what the README shows."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from processor import NonRetryable, StepContext
from tests.example_modules import REPO, example_module

SIGNUP = example_module("signup/signup.py", "signup_example")


def test_the_workflow_is_valid_and_declares_what_the_readme_shows() -> None:
    raw = SIGNUP.signup.to_json()
    schema = json.loads((REPO / "schemas" / "workflow.schema.json").read_text())
    assert list(Draft202012Validator(schema).iter_errors(raw)) == []
    assert raw["concurrency"] == {"limit": 1, "key": "customer"}
    assert raw["timeout_ms"] == 120_000
    assert raw["on_failure"]["type"] == "notify_support"
    steps = {step["name"]: step for step in raw["steps"]}
    assert steps["reserve_seat"]["compensate"]["type"] == "release_seat"
    assert steps["charge_card"]["version"] == 2
    assert steps["create_workspace"]["when"] == '$.input.plan == "team"'
    assert steps["email_confirmed"]["on_timeout"] == "continue"
    assert steps["welcome"]["run_if"] == "all_done"
    SIGNUP.signup.definition()  # parsed as a registration parses it


def _ctx(step: str, run_input: dict[str, Any], deps: dict[str, Any] | None = None) -> StepContext:
    return StepContext("signup-x", step, 1, 0, run_input, deps or {})


def test_the_steps_give_what_the_readme_shows() -> None:
    team = {"customer": "ada", "plan": "team"}
    seat = SIGNUP.reserve_seat(_ctx("reserve_seat", team))
    assert seat == {"seat": "team-ada"}
    assert SIGNUP.charge_card(_ctx("charge_card", team)) == {
        "net_cents": 4900,
        "total_cents": 5831,
    }
    assert SIGNUP.release_seat(_ctx("undo(reserve_seat)", team, {"reserve_seat": seat})) == {
        "released": "team-ada"
    }
    declined = {"customer": "bob", "plan": "solo", "card": "declined"}
    with pytest.raises(NonRetryable, match="card of bob declined"):
        SIGNUP.charge_card(_ctx("charge_card", declined))
    with pytest.raises(NonRetryable, match="no plan named 'gold'"):
        SIGNUP.reserve_seat(_ctx("reserve_seat", {"customer": "x", "plan": "gold"}))
    failure = {"step": "charge_card", "reason": "...", "attempt": 1, "error": "..."}
    assert SIGNUP.notify_support(_ctx("on_failure", declined, {"failure": failure})) == {
        "ticket": "signup of bob: charge_card failed"
    }
