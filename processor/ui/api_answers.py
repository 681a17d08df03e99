"""What a request of the HTTP API (api.py) gets back when it is not a success, and what it
sends that must be read first: ``Refusal`` (an answer decided before the client is called),
the ``Error`` document with the HTTP status each refusal of the client's gets (``_STATUS``),
the JSON body read within its bound, and the query's numbers and times checked."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

import orjson
import psycopg
from confluent_kafka import KafkaException
from starlette.requests import Request
from starlette.responses import Response

from processor.client import (
    ClientError,
    InvalidArgument,
    InvalidInput,
    OutOfBounds,
    ReservedRunId,
    RetryRefused,
    RunExists,
    RunNotFound,
    SignalRefused,
    UpgradeRefused,
)
from processor.core.bounds import literal_problem
from processor.core.model import UnknownWorkflow
from processor.core.outcomes import DeadLetterReason
from processor.io.telemetry.logs import first_line

log = logging.getLogger("ductor.ui")

# A body holds at most a run's input or a signal's payload (1 MiB as compact JSON, the bound
# of stored JSON) and a few short fields; indented JSON is larger than compact, so more is read
# before the bound of stored JSON, not this one, says what is wrong.
MAX_BODY_BYTES = 4 * 1024 * 1024
# How much of a schema validator's message a refusal quotes.
_MESSAGE_CHARS = 300
_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

# The status and name of each refusal the client raises (the first class that matches).
_STATUS: tuple[tuple[type[Exception], int, str], ...] = (
    (OutOfBounds, 400, "out_of_bounds"),
    (ReservedRunId, 400, "reserved_run_id"),
    (InvalidInput, 400, "invalid_input"),
    (InvalidArgument, 400, "invalid_argument"),
    (RunNotFound, 404, "run_not_found"),
    (UnknownWorkflow, 404, "unknown_workflow"),
    (RunExists, 409, "run_exists"),
    (RetryRefused, 409, "retry_refused"),
    (UpgradeRefused, 409, "upgrade_refused"),
    # Any other refusal of what was asked, before anything was written.
    (ValueError, 400, "refused"),
    # The services: the client's sentences hide secrets (a DSN's password).
    (ClientError, 503, "unavailable"),
)


class Refusal(Exception):
    """An answer other than success, decided here (the token, the body, a parameter)."""

    def __init__(
        self, status: int, error: str, reason: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(reason)
        self.status, self.error, self.reason = status, error, reason
        self.headers = headers or {}


Body = dict[str, Any]
Handler = Callable[[Request, Body], Awaitable[tuple[int, Any]]]


def json_answer(status: int, document: Any, headers: dict[str, str] | None = None) -> Response:
    answer = Response(orjson.dumps(document), status, media_type="application/json")
    answer.headers.update({**_HEADERS, **(headers or {})})
    return answer


def error_answer(
    status: int, error: str, reason: str, headers: dict[str, str] | None = None
) -> Response:
    return json_answer(status, {"status": status, "error": error, "reason": reason}, headers)


def failed_answer(request: Request, exc: Exception) -> Response:
    """The answer to what the client (or a service under it) raised."""
    if isinstance(exc, psycopg.Error | KafkaException):
        # A driver's own text (hosts, users) is for the log only, as on the pages.
        log.warning("api failed", extra={"path": request.url.path, "error": first_line(exc)})
        service = "Postgres" if isinstance(exc, psycopg.Error) else "Kafka"
        return error_answer(
            503,
            "unavailable",
            f"{service} failed ({type(exc).__name__}); the server's log says why",
        )
    if isinstance(exc, SignalRefused):
        # A run that ended can take no signal (a conflict with its state, 409); a name no
        # wait step of its workflow waits for is refused input (400). The dead-letter reason
        # the same signal gets on the requests topic names both.
        status = 409 if exc.reason is DeadLetterReason.RUN_ENDED else 400
        return error_answer(status, exc.reason.value, str(exc))
    for kind, status, error in _STATUS:
        if isinstance(exc, kind):
            if status == 503:
                log.warning("api failed", extra={"path": request.url.path, "error": str(exc)})
            return error_answer(status, error, str(exc))
    raise exc  # not reached: ClientError is the last row


async def read_body(request: Request) -> Body:
    """The request's JSON body: 415 if it is not JSON, 413 past MAX_BODY_BYTES, 400 if it cannot
    be read, or holds an integer beyond 64 bits (orjson would read another number)."""
    kind = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind != "application/json":
        raise Refusal(415, "not_json", f"the body must be application/json, not {kind or 'none'}")
    declared = request.headers.get("content-length", "")
    too_large = Refusal(413, "too_large", f"the body is larger than {MAX_BODY_BYTES} bytes")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    raw = bytearray()
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY_BYTES:
            raise too_large
    try:
        document = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refusal(400, "not_json", f"the body is not JSON: {exc}") from None
    problem = literal_problem(bytes(raw), lambda whole: whole)
    if problem is not None:
        raise Refusal(400, "out_of_bounds", problem.describe("the body") + "; nothing was written")
    if not isinstance(document, dict):
        raise Refusal(400, "invalid_body", "the body must be a JSON object")
    return document


def shortened(message: str) -> str:
    """A validator's message, which quotes the value it refused, cut to a sentence's length:
    a body of megabytes is not echoed back."""
    if len(message) <= _MESSAGE_CHARS:
        return message
    return f"{message[: _MESSAGE_CHARS // 2]} … {message[-_MESSAGE_CHARS // 2 :]}"


def query_number(
    text: str | None, name: str, least: float, most: float, whole: bool = False
) -> float | None:
    if text is None or not text.strip():
        return None
    try:
        value = int(text) if whole else float(text)
    except ValueError:
        value = None
    if value is None or not least <= value <= most:
        kind = "a whole number" if whole else "a number"
        raise Refusal(
            400, "invalid_query", f"{name}: {kind} from {least:g} to {most:g}, not {text!r}"
        )
    return value


def instant(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        at = None
    if at is None or at.tzinfo is None:
        raise Refusal(
            400,
            "invalid_body",
            f"start_at {text[:60]!r}: an ISO 8601 time with its offset (2026-12-24T18:00:00Z)",
        )
    return at
