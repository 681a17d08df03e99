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
    RunNotFinished,
    StartNotAnnounced,
)
from processor.core.bounds import render_path
from processor.core.model import SignalKind, UnknownWorkflow
from processor.core.requests import Request as IntakeRequest
from processor.core.requests import SignalRequest, StartRequest
from processor.core.scopes import scope_refusal
from processor.io.config.settings import Settings
from processor.ui import auth
from processor.ui.api_answers import (
    Body,
    Handler,
    Refusal,
    error_answer,
    failed_answer,
    instant,
    json_answer,
    query_number,
    read_body,
    shortened,
)
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

# Results waited for at once: each wait holds a thread of the server's pool (40, shared with
# the pages) for up to MAX_WAIT_S; past this many the next is told to ask again (429).
MAX_WAITS = 16


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
            "upgradeRun": self.upgrade,
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
                    body = await read_body(request)
                    wrong = best_match(validator.iter_errors(body))
                    if wrong is not None:
                        where = render_path(list(wrong.absolute_path))
                        said = shortened(wrong.message)
                        raise Refusal(400, "invalid_body", f"the body at {where}: {said}")
                status, document = await handler(request, body)
            except Refusal as refusal:
                return error_answer(refusal.status, refusal.error, refusal.reason, refusal.headers)
            except (ClientError, UnknownWorkflow, psycopg.Error, KafkaException) as exc:
                return failed_answer(request, exc)
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
        start_at = instant(body.get("start_at"))
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
                body.get("timeout_ms"),
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

    async def upgrade(self, request: Request, body: Body) -> tuple[int, Any]:
        latest, to_version = bool(body.get("latest")), body.get("to_version")
        if latest == (to_version is not None):
            raise Refusal(400, "invalid_body", "give to_version (with step) or latest: true")
        moved = await run_in_threadpool(
            client.upgrade_run,
            self.settings,
            request.path_params["run_id"],
            body.get("step"),
            to_version,
        )
        moves = [
            {"step": m.step, "type": m.step_type, "from": m.old, "to": m.new} for m in moved.moves
        ]
        return 200, {"run_id": moved.run_id, "moves": moves}

    async def result(self, request: Request, _body: Body) -> tuple[int, Any]:
        run_id = request.path_params["run_id"]
        wait = query_number(request.query_params.get("wait"), "wait", 0.0, MAX_WAIT_S)
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
        limit = int(
            query_number(params.get("limit"), "limit", 1, MAX_SEARCH_LIMIT, whole=True) or 50
        )
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


def _client(request: Request) -> str:
    return request.client.host if request.client else "?"


def _now_ms() -> int:
    return int(time.time() * 1000)
