"""What the pages of the web page (app.py) share that is not a page: the headers every answer
carries (a Content-Security-Policy that allows no script but the page's own file, and no
framing), the Host check run
before any route (hosts.py), a posted form read within its bound, and the runs' filter form
read as `ductor runs list` reads its flags."""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from processor import client
from processor.client import RunFilter
from processor.ui.api_answers import error_answer
from processor.ui.hosts import host_allowed

PAGE_SIZE = 50
MAX_PAGE_SIZE = 500  # a page is one table: `ductor runs list --limit` goes further
# Every form of the page is a few short fields.
_FORM_BYTES = 8192
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'self';"
        " img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    # The filters and cursors are in the addresses: no other site is told them. (Not
    # no-referrer: under it a browser sends "Origin: null" with the page's own forms.)
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
# Said to a request addressed to another name (the header is not echoed back).
_FOREIGN_HOST = (
    "Refused: this page is not served under the name this request was sent to (its Host"
    " header). DUCTOR_UI_ALLOWED_HOSTS lists the names it answers to.\n"
)


class HostCheck:
    """Refuses (400) every request whose Host header is not one of ``hosts``, before any page
    (processor/ui/hosts.py)."""

    def __init__(self, app: ASGIApp, hosts: tuple[str, ...]) -> None:
        self.app, self.hosts = app, hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            host = Headers(scope=scope).get("host")
            if not host_allowed(host, self.hosts):
                if str(scope.get("path", "")).startswith("/api/"):
                    refusal = error_answer(400, "foreign_host", _FOREIGN_HOST.strip())
                else:
                    refusal = secured(PlainTextResponse(_FOREIGN_HOST, status_code=400))
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)


def run_filter(form: Mapping[str, Any]) -> RunFilter:
    """The form's filter, as `ductor runs list` reads its flags (client.parse_filter)."""
    return client.parse_filter(
        now_ms=now_ms(),
        workflow=form["workflow"].strip() or None,
        statuses=form["statuses"],
        since=form["since"].strip() or None,
        until=form["until"].strip() or None,
        id_prefix=form["id_prefix"] if form["id_prefix"].strip() else None,
        tags=[t.strip() for t in form["tags"]],
        step_failed=form["step_failed"].strip() or None,
    )


def page_size(text: str) -> int:
    if not text.strip():
        return PAGE_SIZE
    if not text.strip().isdigit() or not 1 <= int(text) <= MAX_PAGE_SIZE:
        raise ValueError(f"runs per page: a number from 1 to {MAX_PAGE_SIZE}, not {text!r}")
    return int(text)


async def read_form(request: Request) -> dict[str, str]:
    """A urlencoded form's fields (the first value of each), at most _FORM_BYTES read."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > _FORM_BYTES:
            return {}
    fields = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


def secured(response: Response) -> Response:
    response.headers.update(HEADERS)
    return response


def client_host(request: Request) -> str:
    return request.client.host if request.client else "?"


def now_s() -> int:
    return int(time.time())


def now_ms() -> int:
    return int(time.time() * 1000)


def at(epoch_ms: int) -> datetime:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC)
