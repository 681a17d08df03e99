"""The HTTP API's table and its OpenAPI document (processor/ui/api_spec.py): the document is
valid OpenAPI 3.1, the server serves exactly the table's routes, every status an operation
documents is a refusal or success it can give, the request bodies are checked against the
document's own schemas, and the bounds the schemas state are the client's constants. The
answers themselves are validated against the document on a real server
(tests/integration/test_http_api.py)."""

from __future__ import annotations

import re

import pytest
from jsonschema.exceptions import best_match
from openapi_spec_validator import validate
from starlette.routing import Route

from processor.core.envelope import MAX_RUN_ID_LENGTH
from processor.core.workflow_def import SIGNAL_NAME
from processor.io.config.settings import Settings
from processor.ui.api import Api
from processor.ui.api_answers import shortened
from processor.ui.api_schemas import SCHEMAS
from processor.ui.api_spec import OPERATIONS, body_validator, openapi_document
from processor.ui.app import create_app
from processor.ui.login_limit import LoginLimiter, LoginLimits


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi_document()
    assert document["openapi"].startswith("3.1")
    validate(document)


def test_the_server_serves_exactly_the_operations_of_the_table() -> None:
    app = create_app(Settings(ui_token="t"), ("127.0.0.1",))
    served = {
        (method, route.path)
        for route in app.routes
        if isinstance(route, Route) and route.path.startswith("/api/")
        for method in route.methods or ()
        if method != "HEAD"
    }
    documented = {
        (method.upper(), re.sub(r"\{run_id\}", "{run_id:path}", path))
        for path, item in openapi_document()["paths"].items()
        for method in item
    }
    assert served == documented
    assert len(Api(Settings(), LoginLimiter(LoginLimits(), lambda: 0.0)).routes()) == len(
        OPERATIONS
    )


def test_every_schema_a_document_names_is_in_it() -> None:
    text = str(openapi_document())
    for name in re.findall(r"#/components/schemas/(\w+)", text):
        assert name in SCHEMAS, name


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ({"workflow": "w"}, "'run_id' is a required property"),
        ({"workflow": "w", "run_id": "r", "surprise": 1}, "'surprise' was unexpected"),
        ({"workflow": "w", "run_id": "x" * (MAX_RUN_ID_LENGTH + 1)}, "is too long"),
        ({"workflow": "w", "run_id": "r", "tier": "t9"}, "'t9' is not one of"),
        ({"workflow": "w", "run_id": "r", "tags": {"bad key": "v"}}, "does not match"),
        ({"workflow": "w", "run_id": "r", "version": 0}, "less than the minimum"),
    ],
)
def test_a_start_body_is_held_to_its_schema(body: dict[str, object], said: str) -> None:
    wrong = best_match(body_validator("StartRequest").iter_errors(body))
    assert wrong is not None and said in wrong.message


def test_the_schemas_state_the_clients_own_bounds() -> None:
    start = SCHEMAS["StartRequest"]["properties"]
    assert start["run_id"]["maxLength"] == MAX_RUN_ID_LENGTH
    assert SCHEMAS["SignalRequest"]["properties"]["name"]["pattern"] == f"^{SIGNAL_NAME.pattern}$"
    fine = {"workflow": "w", "run_id": "r", "input": {"any": ["json", 1, None]}}
    assert best_match(body_validator("StartRequest").iter_errors(fine)) is None
    assert best_match(body_validator("SignalRequest").iter_errors({"name": "approved"})) is None


def test_a_refusal_quotes_no_more_than_a_sentence_of_the_body() -> None:
    wrong = best_match(
        body_validator("StartRequest").iter_errors({"workflow": "w", "run_id": ["x" * 10_000]})
    )
    assert wrong is not None
    said = shortened(wrong.message)
    assert len(said) < 320 and said.endswith("is not of type 'string'")
