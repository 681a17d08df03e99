"""The JSON API `ductor ui` serves beside its pages (docs/usage.md#the-http-api): start,
signal, cancel and retry runs, read a result with a bounded wait, find runs; for callers with
neither a Kafka client nor Python. Its routes are the rows of api_spec.OPERATIONS, the table
the OpenAPI document at /api/openapi.json is made from.

Every operation calls the client function its command calls (`ductor start` is
``client.start_run``, `ductor signal` ``client.send_signal``, …), so the bounds and refusals
are the other doors': the client's checks of stored JSON (core/bounds.py) and of reserved run
ids (core/run_ids.py) before anything is written, and the requests topic's scope
(DUCTOR_REQUESTS_*, core/scopes.py) for what a producer may start and signal. A refusal is an
``Error`` document with the HTTP status that fits (``_STATUS``).

Who may call: the token of the page's buttons (DUCTOR_UI_TOKEN), as ``Authorization: Bearer``,
for every write, and for reads when DUCTOR_UI_READ_TOKEN_REQUIRED says reading needs it. Wrong
tokens count against the login form's limit (processor/ui/login_limit.py): the API is no way
around it. No cookie is taken, so another site's page cannot make a browser call it; the Host
check (processor/ui/hosts.py) runs before any route, as for the pages.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import datetime
from typing import Any

import orjson
import psycopg
from confluent_kafka import KafkaException
from jsonschema.exceptions import best_match
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from processor import client
from processor.client import (
    ClientError,
    InvalidArgument,
    InvalidInput,
    OutOfBounds,
    ReservedRunId,
    RetryRefused,
    RunExists,
    RunNotFinished,
    RunNotFound,
    SignalRefused,
    StartNotAnnounced,
)
from processor.core.bounds import literal_problem, render_path
from processor.core.model import SignalKind, UnknownWorkflow
from processor.core.outcomes import DeadLetterReason
from processor.core.requests import Request as IntakeRequest
from processor.core.requests import SignalRequest, StartRequest
from processor.core.scopes import scope_refusal
from processor.io.config.settings import Settings
from processor.io.telemetry.logs import first_line
from processor.ui import auth
from processor.ui.api_spec import (
    MAX_SEARCH_LIMIT,
    MAX_WAIT_S,
    OPERATIONS,
    Operation,
    body_validator,
    openapi_document,
)
from processor.ui.login_limit import LoginLimiter

log = logging.getLogger("ductor.ui")

# A body holds at most a run's input or a signal's payload (1 MiB as compact JSON, the bound
# of stored JSON) and a few short fields; indented JSON is larger than compact, so more is read
# before the bound of stored JSON, not this one, says what is wrong.
MAX_BODY_BYTES = 4 * 1024 * 1024
# Results waited for at once: each wait holds a thread of the server's pool (40, shared with
# the pages) for up to MAX_WAIT_S; past this many the next is told to ask again (429).
MAX_WAITS = 16
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


class Api:
    """The operations' handlers, with the settings, the token and the login limit (shared
    with the page's login form)."""

    def __init__(self, settings: Settings, logins: LoginLimiter) -> None:
        self.settings = settings
        self.token = settings.ui_token
        self.logins = logins
        self.waiting = 0
        self.scope = replace(settings.requests_scope, door="the HTTP API (DUCTOR_REQUESTS_*)")
        self.document = orjson.dumps(openapi_document())
        self._handlers: dict[str, Handler] = {
            "startRun": self.start,
            "searchRuns": self.search,
            "getResult": self.result,
            "signalRun": self.signal,
            "cancelRun": self.cancel,
            "retryRun": self.retry,
            "openapi": self.openapi,
        }

    def routes(self) -> list[Route]:
        """One route per row of the table (a row without a handler is an error at start)."""
        return [
            Route(
                op.route_path,
                self._endpoint(op, self._handlers[op.operation_id]),
                methods=[op.method],
            )
            for op in OPERATIONS
        ]

    def _endpoint(
        self, op: Operation, handler: Handler
    ) -> Callable[[Request], Awaitable[Response]]:
        validator = None if op.body is None else body_validator(op.body)

        async def endpoint(request: Request) -> Response:
            try:
                self._check_token(request, op)
                body: Body = {}
                if validator is not None:
                    body = await _read_body(request)
                    wrong = best_match(validator.iter_errors(body))
                    if wrong is not None:
                        where = render_path(list(wrong.absolute_path))
                        said = _shortened(wrong.message)
                        raise Refusal(400, "invalid_body", f"the body at {where}: {said}")
                status, document = await handler(request, body)
            except Refusal as refusal:
                return error_answer(refusal.status, refusal.error, refusal.reason, refusal.headers)
            except (ClientError, UnknownWorkflow, psycopg.Error, KafkaException) as exc:
                return _failed(request, exc)
            if op.method == "POST":
                log.info(
                    "api %s",
                    op.operation_id,
                    extra={"path": request.url.path, "status": status, "client": _client(request)},
                )
            return json_answer(status, document)

        return endpoint

    # -- who may call ---------------------------------------------------------------------

    def _check_token(self, request: Request, op: Operation) -> None:
        """Refusal unless the request may call ``op`` (see the module's rules)."""
        if op.access == "open" or (
            op.access == "read" and not self.settings.ui_read_token_required
        ):
            return
        if not self.token:
            raise Refusal(
                403, "read_only", "no token is configured (DUCTOR_UI_TOKEN): the API is read-only"
            )
        who = _client(request)
        # No await from the check to the count (login_limit.py).
        wait = self.logins.retry_after(who)
        if wait is not None:
            seconds = max(1, int(wait + 0.999))
            raise Refusal(
                429,
                "too_many_tries",
                f"too many wrong tokens: try again in {seconds} s",
                {"Retry-After": str(seconds)},
            )
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        challenge = {"WWW-Authenticate": 'Bearer realm="ductor"'}
        if scheme.lower() != "bearer" or not given.strip():
            raise Refusal(401, "no_token", "give the token: Authorization: Bearer TOKEN", challenge)
        if not auth.token_matches(self.token, given.strip()):
            self.logins.failed(who)
            log.warning("api refused: wrong token", extra={"client": who})
            raise Refusal(401, "wrong_token", "wrong token", challenge)
        self.logins.succeeded(who)

    def _in_scope(self, request: IntakeRequest) -> None:
        refused = scope_refusal(self.scope, request)
        if refused is not None:
            raise Refusal(403, "not_allowed", refused.detail)

    # -- the operations -------------------------------------------------------------------

    async def start(self, _request: Request, body: Body) -> tuple[int, Any]:
        run_id, workflow = body["run_id"], body["workflow"]
        tier = body.get("tier", "t1")
        self._in_scope(StartRequest(run_id, workflow, body.get("version"), None, tier))
        start_at = _instant(body.get("start_at"))
        try:
            started = await run_in_threadpool(
                client.start_run,
                self.settings,
                workflow,
                run_id,
                body.get("input"),
                tier,
                body.get("version"),
                body.get("if_exists"),
                start_at,
                body.get("tags"),
            )
        except StartNotAnnounced as exc:
            return 202, {"run_id": run_id, "created": bool(exc.inserted), "announced": False}
        status = 201 if started.created else 200
        return status, {"run_id": run_id, "created": started.created, "announced": True}

    async def signal(self, request: Request, body: Body) -> tuple[int, Any]:
        run_id = request.path_params["run_id"]
        name = body["name"]
        self._in_scope(SignalRequest(run_id, name, body.get("signal_id") or "", None))
        sent = await run_in_threadpool(
            client.send_signal,
            self.settings,
            run_id,
            name,
            body.get("signal_id"),
            body.get("payload"),
        )
        return (201 if sent.new else 200), {"signal_id": sent.signal_id, "new": sent.new}

    async def cancel(self, request: Request, _body: Body) -> tuple[int, Any]:
        run_id = request.path_params["run_id"]
        self._in_scope(SignalRequest(run_id, SignalKind.CANCEL.value, "", None))
        sent = await run_in_threadpool(client.send_signal, self.settings, run_id)
        return 201, {"signal_id": sent.signal_id, "new": sent.new}

    async def retry(self, request: Request, _body: Body) -> tuple[int, Any]:
        retried = await run_in_threadpool(
            client.retry_run, self.settings, request.path_params["run_id"]
        )
        return 200, {"run_id": retried.run_id, "steps": list(retried.steps), "seq": retried.seq}

    async def result(self, request: Request, _body: Body) -> tuple[int, Any]:
        run_id = request.path_params["run_id"]
        wait = _number(request.query_params.get("wait"), "wait", 0.0, MAX_WAIT_S)
        if not wait:
            found = await run_in_threadpool(client.get_run, self.settings, run_id)
            return 200, client.result_document(found)
        if self.waiting >= MAX_WAITS:
            raise Refusal(
                429,
                "too_many_waits",
                f"{MAX_WAITS} results are being waited for already: ask again, or without wait",
                {"Retry-After": "1"},
            )
        self.waiting += 1
        try:
            found = await run_in_threadpool(client.wait_for_run, self.settings, run_id, wait)
        except RunNotFinished as exc:
            found = exc.result
        finally:
            self.waiting -= 1
        return 200, client.result_document(found)

    async def search(self, request: Request, _body: Body) -> tuple[int, Any]:
        params = request.query_params
        limit = int(_number(params.get("limit"), "limit", 1, MAX_SEARCH_LIMIT, whole=True) or 50)
        try:
            wanted = client.parse_filter(
                now_ms=_now_ms(),
                workflow=params.get("workflow"),
                statuses=params.getlist("status"),
                since=params.get("since"),
                until=params.get("until"),
                id_prefix=params.get("id_prefix"),
                tags=params.getlist("tag"),
                step_failed=params.get("step_failed"),
            )
            cursor = params.get("cursor")
            after = None if cursor is None else client.Cursor.decode(cursor)
        except ValueError as exc:
            raise Refusal(400, "invalid_query", str(exc)) from None
        page = await run_in_threadpool(client.search_runs, self.settings, wanted, limit, after)
        return 200, {
            "runs": [client.summary_document(run) for run in page.runs],
            "next_cursor": None if page.next_cursor is None else page.next_cursor.encode(),
        }

    async def openapi(self, _request: Request, _body: Body) -> tuple[int, Any]:
        return 200, orjson.Fragment(self.document)


def _failed(request: Request, exc: Exception) -> Response:
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


async def _read_body(request: Request) -> Body:
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


def _shortened(message: str) -> str:
    """A validator's message, which quotes the value it refused, cut to a sentence's length:
    a body of megabytes is not echoed back."""
    if len(message) <= _MESSAGE_CHARS:
        return message
    return f"{message[: _MESSAGE_CHARS // 2]} … {message[-_MESSAGE_CHARS // 2 :]}"


def _number(
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


def _instant(text: str | None) -> datetime | None:
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


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"


def _now_ms() -> int:
    return int(time.time() * 1000)
