"""A workflow's declared input (``input_schema``, JSON Schema draft 2020-12): what a definition
may declare, what an input is refused for and how the refusal reads, the same schema from
JSON, from a dict in code and from a pydantic model, and a step reading its input as a type."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from jsonschema import Draft202012Validator
from pydantic import BaseModel, Field

from processor import StepContext, Workflow
from processor.core.run_input import input_problem
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import ValidationError

ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["order_id", "items"],
    "properties": {
        "order_id": {"type": "string", "minLength": 1},
        "items": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["sku", "qty"],
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 1}},
            },
        },
    },
}


def _orders(schema: Any = ORDER_SCHEMA) -> dict[str, Any]:
    return {
        "name": "typed",
        "version": 3,
        "input_schema": schema,
        "steps": [{"name": "a", "type": "a"}],
    }


def test_a_declared_schema_is_kept_and_written_back() -> None:
    wf = parse_workflow(_orders())
    assert wf.input_schema is not None
    assert workflow_to_json(wf)["input_schema"] == ORDER_SCHEMA
    assert parse_workflow(workflow_to_json(wf)) == wf
    # Key order does not make another definition (the schema is kept as canonical text).
    reordered = dict(reversed(list(ORDER_SCHEMA.items())))
    assert parse_workflow(_orders(reordered)) == wf
    assert hash(parse_workflow(_orders(reordered))) == hash(wf)


@pytest.mark.parametrize(
    ("schema", "message"),
    [
        ([1], "workflow.input_schema: expected a JSON Schema object"),
        ({"type": "bogus"}, "workflow.input_schema.type: not a valid JSON Schema"),
        ({"properties": {"n": {"minimum": "one"}}}, "workflow.input_schema.properties.n.minimum"),
        ({"required": "order_id"}, "workflow.input_schema.required: not a valid JSON Schema"),
    ],
)
def test_a_schema_that_is_not_one_is_refused_where_it_is_wrong(schema: Any, message: str) -> None:
    with pytest.raises(ValidationError, match=message.replace(".", r"\.")):
        parse_workflow(_orders(schema))


@pytest.mark.parametrize(
    ("value", "where", "what"),
    [
        ({"order_id": 7, "items": [{"sku": "b", "qty": 1}]}, "$.order_id", "7 is not of type"),
        ({"order_id": "1", "items": [{"sku": "b", "qty": 0}]}, "$.items[0].qty", "minimum of 1"),
        ({"order_id": "1", "items": [{"sku": "b"}]}, "$.items[0]", "'qty' is a required"),
        ({"order_id": "1"}, "$", "'items' is a required property"),
        ([], "$", "is not of type 'object'"),
    ],
)
def test_an_input_off_the_schema_is_refused_saying_where(value: Any, where: str, what: str) -> None:
    problem = input_problem(parse_workflow(_orders()), value)
    assert problem is not None
    assert problem.startswith(
        f"the input does not match the input_schema of workflow 'typed' v3 at {where}: "
    )
    assert what in problem


def test_a_matching_input_and_a_workflow_without_a_schema_pass() -> None:
    good = {"order_id": "1", "items": [{"sku": "b", "qty": 2}], "note": "extra keys are fine"}
    assert input_problem(parse_workflow(_orders()), good) is None
    untyped = parse_workflow({"name": "u", "version": 1, "steps": [{"name": "a", "type": "a"}]})
    assert untyped.input_schema is None
    assert input_problem(untyped, {"anything": [1, None]}) is None


def test_a_huge_offending_value_is_not_quoted_whole() -> None:
    problem = input_problem(parse_workflow(_orders()), {"order_id": "x" * 0, "items": "y" * 9999})
    assert problem is not None and len(problem) < 500


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(), st.lists, max_leaves=8))
def test_the_check_agrees_with_the_schema(value: Any) -> None:
    assert (input_problem(parse_workflow(_orders()), value) is None) == Draft202012Validator(
        ORDER_SCHEMA
    ).is_valid(value)


class Item(BaseModel):
    sku: str
    qty: int = Field(ge=1)


class Order(BaseModel):
    order_id: str
    items: list[Item]


def test_a_workflow_in_code_declares_its_input_as_a_schema_or_a_model() -> None:
    as_dict = Workflow("typed", version=3, input_schema=ORDER_SCHEMA)
    as_dict.step(name="a", type="a")(lambda ctx: None)
    assert as_dict.definition() == parse_workflow(_orders())
    as_model = Workflow("typed-model", input_schema=Order)
    as_model.step(name="a", type="a")(lambda ctx: None)
    wf = as_model.definition()
    assert input_problem(wf, {"order_id": "1", "items": [{"sku": "b", "qty": 1}]}) is None
    problem = input_problem(wf, {"order_id": "1", "items": [{"sku": "b", "qty": 0}]})
    assert problem is not None and "at $.items[0].qty: 0 is less than the minimum of 1" in problem
    with pytest.raises(ValidationError, match="a model class with model_json_schema"):
        Workflow("wrong", input_schema=int)


@dataclass
class Plain:
    order_id: str
    items: list[dict[str, Any]]


def test_a_step_reads_its_input_as_a_model_a_dataclass_or_a_type() -> None:
    value = {"order_id": "1", "items": [{"sku": "b", "qty": 2}]}
    ctx = StepContext("r", "a", 1, 0, value)
    order = ctx.input_as(Order)
    assert isinstance(order, Order) and order.items[0].qty == 2
    assert ctx.input_as(Plain) == Plain("1", [{"sku": "b", "qty": 2}])
    assert ctx.input_as(dict) == value
    assert StepContext("r", "a", 1, 0, "42").input_as(int) == 42
