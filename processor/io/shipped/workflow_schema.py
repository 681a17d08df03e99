"""The JSON schema of a workflow definition (schemas/workflow.schema.json, shipped in the
package: io/shipped/files.py), checked on the raw document before ``parse_workflow`` builds
the definition, so that a document in the wrong shape is refused with the place in it that is
wrong."""

from __future__ import annotations

from functools import cache
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from processor.io.shipped.files import json_schema

_MESSAGE_LIMIT = 200  # a schema message quotes the offending value, which may be large


class WorkflowSchemaError(ValueError):
    """A workflow document that does not match the schema; the message names where."""


@cache
def workflow_validator() -> Draft202012Validator:
    """The schema's validator, read and checked once per process."""
    schema = json_schema("workflow.schema.json")
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def check_workflow_document(document: Any) -> None:
    """Raise WorkflowSchemaError, naming the path in the document (``$.steps[1].retry``), if
    ``document`` does not match the workflow schema. Of several errors the most telling one is
    reported (jsonschema's ``best_match``)."""
    error = best_match(workflow_validator().iter_errors(document))
    if error is None:
        return
    message = error.message
    if len(message) > _MESSAGE_LIMIT:
        message = message[: _MESSAGE_LIMIT - 3] + "..."
    raise WorkflowSchemaError(
        f"does not match schemas/workflow.schema.json at {error.json_path}: {message}"
    )
