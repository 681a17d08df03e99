"""The JSON schemas (schemas/*.json) against the sample workflow, parse_workflow and the
wakeup envelope encoder/decoder."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from processor.core.envelope import FIELDS, REASONS, Rejected, Wakeup, decode_wakeup
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import ValidationError

from .strategies import QUICK, workflow_json

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def _validator(name: str) -> Draft202012Validator:
    schema = json.loads((SCHEMAS / name).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


WORKFLOW = _validator("workflow.schema.json")
WAKEUP = _validator("wakeup.schema.json")
SAMPLE: dict[str, Any] = json.loads((SCHEMAS / "workflows" / "sample.json").read_text())


def _parses(raw: Any) -> bool:
    try:
        parse_workflow(raw)
    except ValidationError:
        return False
    return True


def test_the_sample_workflow_validates_and_parses() -> None:
    assert list(WORKFLOW.iter_errors(SAMPLE)) == []
    wf = parse_workflow(SAMPLE)
    assert [s.name for s in wf.steps] == ["fetch", "transform", "enrich", "publish"]
    assert wf.step("publish").depends_on == ("transform", "enrich")
    assert wf.step("transform").retry.max_attempts == 4


def _sample_with(edit: str) -> dict[str, Any]:
    raw = copy.deepcopy(SAMPLE)
    steps = raw["steps"]
    match edit:
        case "minimal":
            return {"name": "m", "version": 1, "steps": [{"name": "s", "type": "t"}]}
        case "full_retry":
            steps[0]["retry"] = {
                "max_attempts": 100,
                "backoff_ms": 0,
                "backoff_multiplier": 10,
                "max_backoff_ms": 0,
            }
        case "no_description":
            del raw["description"]
        case "missing_name":
            del raw["name"]
        case "version_zero":
            raw["version"] = 0
        case "version_string":
            raw["version"] = "1"
        case "no_steps":
            raw["steps"] = []
        case "unknown_top_field":
            raw["owner"] = "me"
        case "unknown_step_field":
            steps[0]["image"] = "x"
        case "step_without_type":
            del steps[0]["type"]
        case "empty_step_name":
            steps[0]["name"] = ""
        case "timeout_zero":
            steps[0]["timeout_ms"] = 0
        case "max_attempts_zero":
            steps[1]["retry"]["max_attempts"] = 0
        case "max_attempts_101":
            steps[1]["retry"]["max_attempts"] = 101
        case "negative_backoff":
            steps[1]["retry"]["backoff_ms"] = -1
        case "multiplier_below_one":
            steps[1]["retry"]["backoff_multiplier"] = 0.5
        case "unknown_retry_field":
            steps[1]["retry"]["jitter"] = True
        case "depends_on_not_strings":
            steps[1]["depends_on"] = [1]
        case "name_too_long":
            raw["name"] = "n" * 201
        case "description_not_string":
            raw["description"] = 5
        case "empty_step_type":
            steps[0]["type"] = ""
        case "duplicate_dependency":
            steps[1]["depends_on"] = ["fetch", "fetch"]
        case "output_one_step":
            raw["output"] = "publish"
        case "output_mapping":
            raw["output"] = {"published": "publish", "fetched": "fetch"}
        case "output_empty_name":
            raw["output"] = ""
        case "output_empty_mapping":
            raw["output"] = {}
        case "output_not_a_name":
            raw["output"] = {"x": 3}
        case "output_empty_key":
            raw["output"] = {"": "fetch"}
        case "output_list":
            raw["output"] = ["fetch"]
        case "output_unknown_step":
            raw["output"] = {"x": "nowhere"}
        case _:
            raise AssertionError(edit)
    return raw


@pytest.mark.parametrize(
    "edit", ["minimal", "full_retry", "no_description", "output_one_step", "output_mapping"]
)
def test_schema_and_parser_accept_the_same_valid_definitions(edit: str) -> None:
    raw = _sample_with(edit)
    assert WORKFLOW.is_valid(raw)
    assert _parses(raw)


@pytest.mark.parametrize(
    "edit",
    [
        "missing_name",
        "version_zero",
        "version_string",
        "no_steps",
        "unknown_top_field",
        "unknown_step_field",
        "step_without_type",
        "empty_step_name",
        "timeout_zero",
        "max_attempts_zero",
        "max_attempts_101",
        "negative_backoff",
        "multiplier_below_one",
        "unknown_retry_field",
        "depends_on_not_strings",
        "name_too_long",
        "output_empty_name",
        "output_empty_mapping",
        "output_not_a_name",
        "output_empty_key",
        "output_list",
    ],
)
def test_schema_and_parser_reject_the_same_invalid_definitions(edit: str) -> None:
    raw = _sample_with(edit)
    assert not WORKFLOW.is_valid(raw)
    assert not _parses(raw)


# Fixed (workflow.py parse_workflow): the parser accepts definitions that
# schemas/workflow.schema.json rejects, although its docstring points at that schema:
#   * "description" is never type-checked ({"description": 5} parses);
#   * a step "type" may be "" (the schema says minLength 1), and such a step is dispatched with
#     an empty step_type no worker can run;
#   * "depends_on" may repeat a step (the schema says uniqueItems).
@pytest.mark.parametrize(
    "edit", ["description_not_string", "empty_step_type", "duplicate_dependency"]
)
def test_parser_rejects_what_the_schema_rejects(edit: str) -> None:
    raw = _sample_with(edit)
    assert not WORKFLOW.is_valid(raw)
    assert not _parses(raw), f"parse_workflow accepted a schema-invalid definition ({edit})"


def test_graph_errors_are_beyond_the_schema_but_caught_by_the_parser() -> None:
    raw = _sample_with("minimal")
    raw["steps"] = [
        {"name": "a", "type": "t", "depends_on": ["b"]},
        {"name": "b", "type": "t", "depends_on": ["a"]},
    ]
    assert WORKFLOW.is_valid(raw)
    assert not _parses(raw)


def test_an_output_naming_an_unknown_step_is_beyond_the_schema_but_caught_by_the_parser() -> None:
    raw = _sample_with("output_unknown_step")
    assert WORKFLOW.is_valid(raw)
    with pytest.raises(ValidationError, match=r"workflow\.output\.x: 'nowhere' is not a step"):
        parse_workflow(raw)


@QUICK
@given(workflow_json(compensate=True))
def test_generated_definitions_and_their_canonical_json_validate(raw: dict[str, Any]) -> None:
    assert WORKFLOW.is_valid(raw)
    wf = parse_workflow(raw)
    assert list(WORKFLOW.iter_errors(workflow_to_json(wf))) == []


# ---------------------------------------------------------------------------------------------
# The wakeup envelope

optional_ms = st.one_of(st.none(), st.integers(0, 253_402_300_799_999))  # to the year 9999
wakeups = st.builds(
    Wakeup,
    run_id=st.text(
        st.characters(codec="utf-8", exclude_characters="\x00"),
        min_size=1,
        max_size=200,
    ),
    reason=st.sampled_from(sorted(REASONS)),
    requeue_count=st.integers(0, 10_000),
    requeue_seq=st.integers(0, 2**31 - 1),
    due_at=optional_ms,
    target_at=optional_ms,
    observed_seq=optional_ms,
    produced_at=optional_ms,
)


@QUICK
@given(wakeups)
def test_encoded_wakeups_validate_against_the_schema(wakeup: Wakeup) -> None:
    body = json.loads(wakeup.encode())
    assert list(WAKEUP.iter_errors(body)) == []
    assert decode_wakeup(wakeup.encode(), 1 << 20) == wakeup


# Objects around the schema's edges: right and wrong types for every field, unknown fields.
_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 3),
    st.integers(0, 2**53),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.sampled_from(sorted(REASONS)),
    st.lists(st.integers(0, 3), max_size=2),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
)
_fields = st.sampled_from([*sorted(FIELDS), "extra"])


@st.composite
def envelope_like(draw: st.DrawFn) -> dict[str, Any]:
    body: dict[str, Any] = {"envelope_version": 1, "run_id": "run-1", "reason": "start"}
    for _ in range(draw(st.integers(0, 3))):
        body[draw(_fields)] = draw(_values)
    for _ in range(draw(st.integers(0, 1))):
        del body[draw(st.sampled_from(sorted(body)))]
    return body


# Found two decoder bugs (fixed): a non-string "reason" such as [] raised TypeError, and
# "envelope_version": true was accepted.
@QUICK
@given(envelope_like())
def test_the_decoder_is_never_more_permissive_than_the_schema(body: dict[str, Any]) -> None:
    decoded = decode_wakeup(json.dumps(body).encode(), 1 << 20)
    if isinstance(decoded, Wakeup):
        assert WAKEUP.is_valid(body), f"decoder accepted a schema-invalid envelope: {body}"
    else:
        assert isinstance(decoded, Rejected)


# Fixed (envelope.py decode_wakeup): ``version != ENVELOPE_VERSION`` treats the JSON
# boolean true as the integer 1 (True == 1 in Python), so {"envelope_version": true, ...} is
# accepted, while the schema's "const": 1 rejects it (JSON Schema distinguishes booleans from
# numbers). Expected: Rejected("wrong_schema", ...). Actual: a Wakeup.
def test_envelope_version_true_is_rejected_like_the_schema_does() -> None:
    body = {"envelope_version": True, "run_id": "r", "reason": "start"}
    assert not WAKEUP.is_valid(body)
    decoded = decode_wakeup(json.dumps(body).encode(), 1 << 20)
    assert isinstance(decoded, Rejected) and decoded.reason == "wrong_schema"


def test_envelope_version_1_0_is_the_same_number_for_both() -> None:
    body = {"envelope_version": 1.0, "run_id": "r", "reason": "start"}
    assert WAKEUP.is_valid(body)
    assert isinstance(decode_wakeup(json.dumps(body).encode(), 1 << 20), Wakeup)
