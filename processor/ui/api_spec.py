"""The JSON API's one table of operations (pure), and the OpenAPI 3.1 document built from it.

The server's routes (processor/ui/api.py) are made from ``OPERATIONS`` and the document served
at ``/api/openapi.json`` is made from the same rows, so neither can name a path, a method or a
status the other lacks; the request bodies are checked against the document's own schemas
(``body_validator``) before a handler sees them. The bounds the schemas state (a run id's
length, a signal's name, the tiers) come from the constants the client checks against: the
client's own checks still run after them (core/bounds.py, core/run_ids.py), so the schemas add
shape (types, required and unknown fields), not a second copy of the rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from jsonschema import Draft202012Validator

from processor.core.envelope import MAX_RUN_ID_LENGTH
from processor.core.run_state import RunStatus
from processor.ui.api_schemas import SCHEMAS

API_VERSION = "1"
# The longest a result may be waited for in one request (``?wait=``); a caller that needs
# longer asks again. Each wait holds a thread of the server's (api.py bounds how many).
MAX_WAIT_S = 60.0
MAX_SEARCH_LIMIT = 1000

# Who may call an operation: ``write`` needs the token (always), ``read`` needs it when
# DUCTOR_UI_READ_TOKEN_REQUIRED says reading does, ``open`` never (the document itself).
Access = Literal["write", "read", "open"]


@dataclass(frozen=True)
class Param:
    name: str
    where: Literal["path", "query"]
    schema: dict[str, Any]
    description: str
    required: bool = False


@dataclass(frozen=True)
class Operation:
    operation_id: str
    method: Literal["GET", "POST"]
    path: str  # OpenAPI's form: /api/runs/{run_id}/result
    summary: str
    access: Access
    responses: dict[int, tuple[str, str]]  # status: (description, component schema)
    body: str | None = None  # the component schema of the JSON body, when it takes one
    params: tuple[Param, ...] = field(default_factory=tuple)

    @property
    def route_path(self) -> str:
        """Starlette's form: a run id may hold '/' (a child run's id), sent as %2F."""
        return self.path.replace("{run_id}", "{run_id:path}")


_RUN_ID = Param(
    "run_id",
    "path",
    {"type": "string", "minLength": 1, "maxLength": MAX_RUN_ID_LENGTH},
    "the run's id, percent-encoded (a child run's '/' as %2F, '#' as %23)",
    required=True,
)

# The answers every operation may give besides its own (the Host check, the token, the
# services being away). 413 and 415 only where a body is read.
_COMMON: dict[int, tuple[str, str]] = {
    400: (
        "refused: the request names a host this server does not answer to, or is malformed",
        "Error",
    ),
    503: ("Postgres or Kafka could not be reached; nothing may have been done", "Error"),
}
_READ_AUTH: dict[int, tuple[str, str]] = {
    401: (
        "reading needs the token (DUCTOR_UI_READ_TOKEN_REQUIRED): none or a wrong one given",
        "Error",
    ),
    429: ("too many wrong tokens from this address or overall: Retry-After says when", "Error"),
}
_WRITE_AUTH: dict[int, tuple[str, str]] = {
    401: ("no token or a wrong one (Authorization: Bearer TOKEN)", "Error"),
    403: ("no token is configured (DUCTOR_UI_TOKEN): the server is read-only", "Error"),
    429: ("too many wrong tokens from this address or overall: Retry-After says when", "Error"),
}
_BODY: dict[int, tuple[str, str]] = {
    413: ("the body is larger than the server reads", "Error"),
    415: ("the body is not application/json", "Error"),
}


def _answers(
    own: dict[int, tuple[str, str]], access: Access, body: bool
) -> dict[int, tuple[str, str]]:
    auth = _WRITE_AUTH if access == "write" else _READ_AUTH if access == "read" else {}
    return {**_COMMON, **auth, **(_BODY if body else {}), **own}


OPERATIONS: tuple[Operation, ...] = (
    Operation(
        "startRun",
        "POST",
        "/api/runs",
        "Start a run (idempotent by run id)",
        "write",
        _answers(
            {
                201: ("the run was created and woken", "StartedRun"),
                200: (
                    "a run with this id and the same start exists already; it is left as is",
                    "StartedRun",
                ),
                202: (
                    "the run was created but its wakeup not delivered: a processor's sweep"
                    " starts it shortly",
                    "StartedRun",
                ),
                400: (
                    "refused input (the path to it in the reason): a value beyond the bounds"
                    " of stored JSON, a reserved run id, an input the workflow's schema"
                    " refuses; nothing was written",
                    "Error",
                ),
                404: ("no workflow of this name (or version) is registered", "Error"),
                409: (
                    "the run id exists already: of another workflow, with another input,"
                    " or at all with if_exists=fail",
                    "Error",
                ),
            },
            "write",
            body=True,
        ),
        body="StartRequest",
    ),
    Operation(
        "searchRuns",
        "GET",
        "/api/runs",
        "Find runs, newest first (the filters of `ductor runs list`)",
        "read",
        _answers({200: ("a page of runs and the cursor of the next", "RunPage")}, "read", False),
        params=(
            Param("workflow", "query", {"type": "string"}, "only runs of this workflow"),
            Param(
                "status",
                "query",
                {"type": "array", "items": {"enum": [s.value for s in RunStatus]}},
                "only runs in this status (repeat for several)",
            ),
            Param(
                "since",
                "query",
                {"type": "string"},
                "created at or after: ISO 8601 with its offset, or a duration ago (15m, 2h, 7d)",
            ),
            Param("until", "query", {"type": "string"}, "created before (as since)"),
            Param("id_prefix", "query", {"type": "string"}, "only runs whose id starts so"),
            Param(
                "tag",
                "query",
                {"type": "array", "items": {"type": "string"}},
                "KEY=VALUE: only runs with this tag, given at start or set by a step (repeat:"
                " all of them)",
            ),
            Param("step_failed", "query", {"type": "string"}, "only runs where this step failed"),
            Param(
                "limit",
                "query",
                {"type": "integer", "minimum": 1, "maximum": MAX_SEARCH_LIMIT, "default": 50},
                "at most this many runs",
            ),
            Param("cursor", "query", {"type": "string"}, "the next_cursor of the page before"),
        ),
    ),
    Operation(
        "getResult",
        "GET",
        "/api/runs/{run_id}/result",
        "A run's status and output, waiting up to `wait` seconds for it to end",
        "read",
        _answers(
            {
                200: (
                    "where the run stands: finished false if it had not ended by the wait's end",
                    "RunResult",
                ),
                404: ("no run with this id", "Error"),
                429: (
                    "too many results are being waited for at once (or too many wrong"
                    " tokens): Retry-After says when to ask again",
                    "Error",
                ),
            },
            "read",
            False,
        ),
        params=(
            _RUN_ID,
            Param(
                "wait",
                "query",
                {"type": "number", "minimum": 0, "maximum": MAX_WAIT_S},
                f"seconds to wait for the run to end (0 or absent: look once; at most"
                f" {MAX_WAIT_S:g})",
            ),
        ),
    ),
    Operation(
        "signalRun",
        "POST",
        "/api/runs/{run_id}/signals",
        "Send a run a signal (what a wait step waits for, or cancel)",
        "write",
        _answers(
            {
                201: ("the signal was recorded and the run woken", "SignalSent"),
                200: (
                    "a signal with this signal_id was recorded before; not sent again",
                    "SignalSent",
                ),
                400: (
                    "refused input: a payload beyond the bounds of stored JSON, a name no"
                    " signal may have, or one no wait step of the run waits for"
                    " (unknown_signal); nothing was written",
                    "Error",
                ),
                404: ("no run with this id", "Error"),
                409: ("the run has ended (run_ended): a signal can change it no more", "Error"),
            },
            "write",
            body=True,
        ),
        body="SignalRequest",
        params=(_RUN_ID,),
    ),
    Operation(
        "cancelRun",
        "POST",
        "/api/runs/{run_id}/cancel",
        "Cancel a run (a cancel signal)",
        "write",
        _answers(
            {
                201: ("the cancel was recorded and the run woken", "SignalSent"),
                404: ("no run with this id", "Error"),
                409: ("the run has ended (run_ended)", "Error"),
            },
            "write",
            body=False,
        ),
        params=(_RUN_ID,),
    ),
    Operation(
        "retryRun",
        "POST",
        "/api/runs/{run_id}/retry",
        "Resume a failed run from its failed steps (`ductor runs retry`)",
        "write",
        _answers(
            {
                200: ("the run was resumed; these steps run again", "RetriedRun"),
                404: ("no run with this id", "Error"),
                409: ("the run is not failed, is quarantined, or kept changing", "Error"),
            },
            "write",
            body=False,
        ),
        params=(_RUN_ID,),
    ),
    Operation(
        "upgradeRun",
        "POST",
        "/api/runs/{run_id}/upgrade",
        "Move a running or failed run's steps to another version of their function, from"
        " their next attempt (`ductor runs upgrade`): `to_version` with `step`, or `latest`",
        "write",
        _answers(
            {
                200: ("what moved (nothing: the run had nothing to move)", "UpgradedRun"),
                400: ("neither to_version with step nor latest", "Error"),
                404: ("no run with this id", "Error"),
                409: (
                    "the run is not running or failed, is quarantined, or kept changing",
                    "Error",
                ),
            },
            "write",
            body=True,
        ),
        body="UpgradeRequest",
        params=(_RUN_ID,),
    ),
    Operation(
        "openapi",
        "GET",
        "/api/openapi.json",
        "This document",
        "open",
        _answers({200: ("the OpenAPI 3.1 document of this API", "Document")}, "open", False),
    ),
)


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``OPERATIONS``."""
    paths: dict[str, dict[str, Any]] = {}
    for op in OPERATIONS:
        paths.setdefault(op.path, {})[op.method.lower()] = _path_entry(op)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Ductor",
            "version": API_VERSION,
            "description": (
                "Start, signal, cancel and retry workflow runs, read their results and find"
                " them, over HTTP (docs/usage.md#the-http-api). Served by `ductor ui`. Writes"
                " need the token (DUCTOR_UI_TOKEN) as a bearer token; reads too when"
                " DUCTOR_UI_READ_TOKEN_REQUIRED is set."
            ),
        },
        "paths": paths,
        "components": {
            "schemas": SCHEMAS,
            "securitySchemes": {"token": {"type": "http", "scheme": "bearer"}},
        },
    }


def _path_entry(op: Operation) -> dict[str, Any]:
    """One operation of the document's ``paths``."""
    entry: dict[str, Any] = {
        "operationId": op.operation_id,
        "summary": op.summary,
        "responses": {
            str(status): {
                "description": description,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{ref}"}}
                },
            }
            for status, (description, ref) in sorted(op.responses.items())
        },
    }
    if op.params:
        entry["parameters"] = [
            {
                "name": p.name,
                "in": p.where,
                "required": p.required,
                "description": p.description,
                "schema": p.schema,
                **({"style": "form", "explode": True} if p.schema.get("type") == "array" else {}),
            }
            for p in op.params
        ]
    if op.body is not None:
        entry["requestBody"] = {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{op.body}"}}
            },
        }
    if op.access != "open":
        entry["security"] = [{"token": []}] if op.access == "write" else [{}, {"token": []}]
    return entry


def body_validator(name: str) -> Draft202012Validator:
    """A validator of a request body against the document's schema ``name``."""
    return Draft202012Validator(SCHEMAS[name])
