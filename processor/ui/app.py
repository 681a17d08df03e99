"""The web page of `ductor ui` (docs/operations/web-ui.md), a Starlette application: the runs
with the filters of `ductor runs list`, a run with its DAG, timeline and attempts (what
`inspect -o json` prints), the workflows and the workers (processor/ui/listings.py), the dead
letters and the schedules, and retry and cancel buttons for who gave the token
(processor/ui/auth.py); with DUCTOR_UI_READ_TOKEN_REQUIRED, reading needs it too.
Beside them, under /api/, the JSON API (processor/ui/api.py) with the same token and checks.

Before any page: a request addressed to a name the page is not served as is refused
(processor/ui/hosts.py: DNS rebinding). The login form takes a few wrong tokens a minute
(processor/ui/login_limit.py). A look at the runs or the dead letters reads a window of time
(processor/ui/window.py), never the whole history.

The pages call the client and io functions the commands call, on the server's thread pool (each
opens its own connection, as a command does: a page is a person's click, not a hot path, so no
pool is kept). Every answer carries a Content-Security-Policy that allows no script but the
page's own file (static/ui.js: it reads the page again every few seconds and swaps in what
changed; every page is whole without it), no framing (the buttons cannot be overlaid by another
site) and forms posted to this site only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Any
from urllib.parse import urlencode

import psycopg
from confluent_kafka import KafkaException
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from processor import client
from processor.client import ClientError, Cursor, RunFilter, RunNotFound, RunPage
from processor.core.run_state import RunStatus
from processor.io.config.settings import Settings
from processor.io.postgres.schedules import Schedule, list_schedules
from processor.io.telemetry.logs import first_line
from processor.ui import auth
from processor.ui.api import Api
from processor.ui.dag import layout, step_states
from processor.ui.http import (
    HostCheck,
    at,
    client_host,
    now_ms,
    now_s,
    page_size,
    read_form,
    run_filter,
    secured,
)
from processor.ui.listings import Listings
from processor.ui.login_limit import LoginLimiter, LoginLimits
from processor.ui.pages import environment, run_url, script, stylesheet
from processor.ui.run_view import run_sections
from processor.ui.timeline import timeline
from processor.ui.window import Window, as_duration, span, window

log = logging.getLogger("ductor.ui")

_LIVE = (RunStatus.PENDING.value, RunStatus.RUNNING.value)
_DONE = {"retry": "Retried: the failed steps run again.", "cancel": "Cancel sent."}
# How often a page reads itself again (static/ui.js), milliseconds: a live run's page often,
# an ended one seldom (it may be retried from elsewhere), the lists in between. Each read is
# the queries of one look at the page, as a reload would be.
REFRESH_LIVE_RUN_MS = 2000
REFRESH_ENDED_RUN_MS = 10_000
REFRESH_LIST_MS = 5000

Handler = Callable[[Request], Awaitable[Response]]


class Site:
    """The handlers, with the settings, the token and the login limiter they share."""

    def __init__(self, settings: Settings, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.token = settings.ui_token
        self.templates = environment()
        self.css = stylesheet()
        self.js = script()
        self.logins = LoginLimiter(LoginLimits(), clock)

    # -- answers --------------------------------------------------------------------------

    def page(
        self,
        request: Request,
        name: str,
        status: int = 200,
        refresh_ms: int = 0,
        **context: Any,
    ) -> Response:
        """The page ``name``; ``refresh_ms``: how often its script reads it again (0: never)."""
        logged_in = auth.session_valid(self.token, request.cookies.get(auth.COOKIE), now_s())
        html = self.templates.get_template(name).render(
            refresh_ms=refresh_ms,
            token_configured=bool(self.token),
            read_token_required=self.settings.ui_read_token_required,
            logged_in=logged_in,
            here=request.url.path,
            **context,
        )
        return secured(HTMLResponse(html, status_code=status))

    def problem(self, request: Request, status: int, message: str) -> Response:
        return self.page(request, "problem.html", status, message=message)

    async def stylesheet(self, _request: Request) -> Response:
        return secured(Response(self.css, media_type="text/css"))

    async def script(self, _request: Request) -> Response:
        return secured(Response(self.js, media_type="text/javascript"))

    # -- read-only pages ------------------------------------------------------------------

    async def runs(self, request: Request) -> Response:
        params = request.query_params
        pairs = [(k, v) for k, v in params.multi_items() if k != "cursor" and v.strip()]
        form: dict[str, Any] = {
            "workflow": params.get("workflow", ""),
            "statuses": params.getlist("status"),
            "since": params.get("since", ""),
            "until": params.get("until", ""),
            "id_prefix": params.get("id_prefix", ""),
            "tags": [t for t in params.getlist("tag") if t.strip()],
            "step_failed": params.get("step_failed", ""),
            "limit": params.get("limit", ""),
        }
        context: dict[str, Any] = {
            "form": form,
            "pairs": pairs,
            "all_statuses": [s.value for s in RunStatus],
        }
        context["default_since"] = as_duration(self.settings.ui_window_s)
        try:
            wanted = run_filter(form)
            look = self.window(wanted.since_ms, wanted.until_ms, "`ductor runs list`")
            limit = page_size(form["limit"])
            cursor = params.get("cursor")
            after = Cursor.decode(cursor) if cursor else None
        except ValueError as exc:
            return self.page(request, "runs.html", 400, error=str(exc), page=None, **context)
        bounded = replace(wanted, since_ms=look.since_ms)
        page, total = await run_in_threadpool(self._search, bounded, limit, after)
        return self.page(
            request,
            "runs.html",
            refresh_ms=REFRESH_LIST_MS,
            page=page,
            total=total,
            error=None,
            **self.shown(look),
            **context,
        )

    def shown(self, look: Window) -> dict[str, Any]:
        """What the pages say of the window they read."""
        return {
            "window_since": at(look.since_ms),
            "window_until": None if look.until_ms is None else at(look.until_ms),
            "max_window": span(self.settings.ui_max_window_s),
        }

    def window(self, since_ms: int | None, until_ms: int | None, instead: str) -> Window:
        return window(
            since_ms,
            until_ms,
            now_ms=now_ms(),
            default_s=self.settings.ui_window_s,
            max_s=self.settings.ui_max_window_s,
            instead=instead,
        )

    def _search(self, wanted: RunFilter, limit: int, after: Cursor | None) -> tuple[RunPage, int]:
        return (
            client.search_runs(self.settings, wanted, limit, after),
            client.count_runs(self.settings, wanted),
        )

    async def run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        try:
            document = await run_in_threadpool(client.inspect_run, self.settings, run_id)
        except RunNotFound as exc:
            return self.problem(request, 404, str(exc))
        states = step_states(document)
        live = document["status"] in _LIVE
        return self.page(
            request,
            "run.html",
            refresh_ms=REFRESH_LIVE_RUN_MS if live else REFRESH_ENDED_RUN_MS,
            run=document,
            dag=layout(states) if states else None,
            timeline=timeline(document, time.time()),
            can_retry=document["status"] == RunStatus.FAILED.value,
            can_cancel=document["status"] in _LIVE,
            done=_DONE.get(request.query_params.get("did", "")),
            **run_sections(document),
        )

    async def schedules(self, request: Request) -> Response:
        schedules = await run_in_threadpool(self._schedules)
        return self.page(request, "schedules.html", refresh_ms=REFRESH_LIST_MS, schedules=schedules)

    def _schedules(self) -> list[Schedule]:
        with client.connect(self.settings) as conn:
            return list_schedules(conn)

    # -- the token, and what it allows ----------------------------------------------------

    async def login_form(self, request: Request) -> Response:
        target = auth.safe_next(request.query_params.get("next"))
        return self.page(request, "login.html", target=target, error=None)

    async def login(self, request: Request) -> Response:
        refused = self._refused(request, need_session=False)
        if refused is not None:
            return refused
        form = await read_form(request)
        target = auth.safe_next(form.get("next"))
        who = client_host(request)
        # No await from the limiter's check to its count: concurrent tries cannot all pass
        # the check before the first is counted.
        wait = self.logins.retry_after(who)
        if wait is not None:
            log.warning("ui login refused: too many wrong tokens", extra={"client": who})
            seconds = max(1, int(wait + 0.999))
            answer = self.page(
                request,
                "login.html",
                429,
                target=target,
                error=f"Too many wrong tokens: try again in {seconds} s.",
            )
            answer.headers["Retry-After"] = str(seconds)
            return answer
        if not auth.token_matches(self.token, form.get("token", "")):
            self.logins.failed(who)
            log.warning("ui login refused: wrong token", extra={"client": who})
            return self.page(request, "login.html", 403, target=target, error="Wrong token.")
        self.logins.succeeded(who)
        answer = secured(RedirectResponse(target, status_code=303))
        answer.set_cookie(
            auth.COOKIE,
            auth.new_session(self.token, now_s()),
            max_age=auth.SESSION_S,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return answer

    async def logout(self, request: Request) -> Response:
        refused = self._refused(request, need_session=False)
        if refused is not None:
            return refused
        answer = secured(RedirectResponse("/", status_code=303))
        answer.delete_cookie(auth.COOKIE, httponly=True, samesite="strict")
        return answer

    async def retry(self, request: Request) -> Response:
        return await self._act(
            request, "retry", lambda run_id: client.retry_run(self.settings, run_id)
        )

    async def cancel(self, request: Request) -> Response:
        return await self._act(
            request, "cancel", lambda run_id: client.send_signal(self.settings, run_id)
        )

    async def _act(self, request: Request, verb: str, action: Callable[[str], object]) -> Response:
        refused = self._refused(request, need_session=True)
        if refused is not None:
            return refused
        run_id = (await read_form(request)).get("run_id", "")
        try:
            await run_in_threadpool(action, run_id)
        except RunNotFound as exc:
            return self.problem(request, 404, str(exc))
        except ClientError as exc:
            return self.problem(request, 409, str(exc))
        log.info("ui %s", verb, extra={"run_id": run_id, "client": client_host(request)})
        return secured(RedirectResponse(f"{run_url(run_id)}?did={verb}", status_code=303))

    def reader(self, handler: Handler) -> Handler:
        """``handler``, behind the login when reading needs the token."""
        if not self.settings.ui_read_token_required:
            return handler

        async def guarded(request: Request) -> Response:
            cookie = request.cookies.get(auth.COOKIE)
            if auth.session_valid(self.token, cookie, now_s()):
                return await handler(request)
            # The path as it was sent (a run id's '/' stays %2F), then the query.
            raw = request.scope.get("raw_path") or request.url.path.encode()
            here = raw.decode("latin-1") + (f"?{request.url.query}" if request.url.query else "")
            target = "/login?" + urlencode({"next": here})
            return secured(RedirectResponse(target, status_code=303))

        return guarded

    def _refused(self, request: Request, need_session: bool) -> Response | None:
        """Why a POST is refused (403), or None: no token configured (the page is read-only),
        a request from another site, or no valid session where one is needed."""
        if not self.token:
            return self.problem(
                request, 403, "This page is read-only: no token is configured (DUCTOR_UI_TOKEN)."
            )
        if not auth.same_origin(request.headers.get("origin"), request.headers.get("host")):
            return self.problem(request, 403, "Refused: the form was sent from another site.")
        cookie = request.cookies.get(auth.COOKIE)
        if need_session and not auth.session_valid(self.token, cookie, now_s()):
            return self.problem(request, 403, "Log in with the token first.")
        return None


def create_app(
    settings: Settings, hosts: tuple[str, ...], clock: Callable[[], float] = time.monotonic
) -> Starlette:
    """The application, answering to the names ``hosts`` (hosts.served_hosts); ``clock``
    times the login limit."""
    site = Site(settings, clock)
    listings = Listings(site)
    routes = [
        Route("/", site.reader(site.runs)),
        Route("/runs/{run_id:path}", site.reader(site.run)),
        Route("/dead-letters", site.reader(listings.dead_letters)),
        Route("/schedules", site.reader(site.schedules)),
        Route("/workflows", site.reader(listings.workflows)),
        Route("/workflows/{name:path}/{version:int}", site.reader(listings.workflow)),
        Route("/workers", site.reader(listings.workers)),
        Route("/login", site.login_form, methods=["GET"]),
        Route("/login", site.login, methods=["POST"]),
        Route("/logout", site.logout, methods=["POST"]),
        Route("/actions/retry", site.retry, methods=["POST"]),
        Route("/actions/cancel", site.cancel, methods=["POST"]),
        Route("/static/ui.css", site.stylesheet),
        Route("/static/ui.js", site.script),
        *Api(settings, site.logins).routes(),
    ]
    middleware = [Middleware(HostCheck, hosts=hosts)]

    async def failed(request: Request, exc: Exception) -> Response:
        # A service the page reads is away (Postgres, Kafka): one sentence, not a traceback.
        # The client's sentences hide secrets; a driver's own text (hosts, users) is for the
        # log only, as the health endpoints do.
        log.warning("ui page failed", extra={"path": request.url.path, "error": first_line(exc)})
        if isinstance(exc, ClientError):
            return site.problem(request, 503, str(exc))
        service = "Postgres" if isinstance(exc, psycopg.Error) else "Kafka"
        return site.problem(
            request, 503, f"{service} failed ({type(exc).__name__}); the server's log says why."
        )

    unavailable = (ClientError, psycopg.Error, KafkaException)
    return Starlette(
        routes=routes,
        middleware=middleware,
        exception_handlers=dict.fromkeys(unavailable, failed),
    )
