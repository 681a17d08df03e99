"""A run's input against its workflow's declared input schema (``WorkflowDef.input_schema``,
JSON Schema draft 2020-12): what is wrong and where, or nothing. Checked where a start enters
(the client and ``ductor start`` before any row is written; the processor's request desk
before a start from Kafka is applied), never in a tick: a run that exists has a valid input.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any

import orjson
from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from processor.core.workflow_def import ValidationError, WorkflowDef

# A problem quoted whole could be as large as the input; this is enough to see it.
_MESSAGE_LIMIT = 300


def input_problem(wf: WorkflowDef, value: Any) -> str | None:
    """Why ``value`` is not an input ``wf`` accepts, in one sentence with the path in it and
    what is wrong (``... at $.items[0].qty: 'two' is not of type 'integer'``), or None when it
    is one (always, for a workflow that declares no input schema). Of several problems the
    most telling is given (jsonschema's ``best_match``)."""
    if wf.input_schema is None:
        return None
    error = best_match(_validator(wf.input_schema).iter_errors(value))
    if error is None:
        return None
    message = error.message
    if len(message) > _MESSAGE_LIMIT:
        message = message[: _MESSAGE_LIMIT - 3] + "..."
    return (
        f"the input does not match the input_schema of workflow {wf.name!r} v{wf.version}"
        f" at {error.json_path}: {message}"
    )


@lru_cache(maxsize=256)
def _validator(schema: str) -> Draft202012Validator:
    """One validator per schema text (a registered definition's never changes)."""
    return Draft202012Validator(orjson.loads(schema))


def schema_of(source: Mapping[str, Any] | type) -> dict[str, Any]:
    """The JSON Schema ``source`` is or gives (a model class's ``model_json_schema()``)."""
    if isinstance(source, Mapping):
        return dict(source)
    produce = getattr(source, "model_json_schema", None)
    if not callable(produce):
        raise ValidationError(
            f"input_schema: expected a JSON Schema (a dict) or a model class with"
            f" model_json_schema() (a pydantic model), got {source!r}"
        )
    schema = produce()
    if not isinstance(schema, dict):
        raise ValidationError(f"input_schema: {source!r}.model_json_schema() gave {schema!r}")
    return schema
