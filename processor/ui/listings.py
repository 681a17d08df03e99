"""The web page's listings of what the services hold, beside the runs (app.py serves them):
the registered workflow versions with how many of their runs are in each status (the runs
created within the runs page's window: processor/ui/window.py), a version's definition as
stored and drawn as its DAG, with the Python it was registered from if it came from code;
every live worker with its queues, the partitions it holds, its step types and how many tasks
it holds of its slots; the dead letters of a window of time."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from processor import client
from processor.client import RunFilter
from processor.core.outcomes import DLQ_REASONS
from processor.core.run_state import RunStatus
from processor.core.shapes import WorkflowKey
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import DeadLetter, read_dead_letters
from processor.io.kafka.errors import DlqError
from processor.io.postgres.run_search import counts_by_workflow
from processor.io.postgres.worker_registry import WorkerLoad, worker_loads
from processor.io.postgres.workflows import (
    StoredVersion,
    WorkflowVersion,
    stored_version,
    workflow_versions,
)
from processor.ui.dag import layout, step_states
from processor.ui.http import at, now_ms
from processor.ui.window import Window, as_duration

REFRESH_MS = 5000
# The dead letters of the window, from its start: the page shows the first ones and says how
# to list them all.
DEAD_LETTERS_SHOWN = 200


class ListingsSite(Protocol):
    """What the listings use of the site (processor/ui/app.py)."""

    @property
    def settings(self) -> Settings: ...

    def page(
        self, request: Request, name: str, status: int = 200, refresh_ms: int = 0, **context: Any
    ) -> Response: ...

    def problem(self, request: Request, status: int, message: str) -> Response: ...

    def window(self, since_ms: int | None, until_ms: int | None, instead: str) -> Window: ...

    def shown(self, look: Window) -> Mapping[str, Any]: ...


class Listings:
    """The workflows', workers' and dead letters' handlers, on the site's settings and
    templates."""

    def __init__(self, site: ListingsSite) -> None:
        self.site = site

    async def workflows(self, request: Request) -> Response:
        look = self.site.window(None, None, "`ductor runs count --workflow W`")
        versions, counts = await run_in_threadpool(self._workflows, look.since_ms)
        return self.site.page(
            request,
            "workflows.html",
            refresh_ms=REFRESH_MS,
            versions=versions,
            counts=counts,
            statuses=[s.value for s in RunStatus],
            since=as_duration(self.site.settings.ui_window_s),
            window_since=at(look.since_ms),
        )

    def _workflows(
        self, since_ms: int
    ) -> tuple[list[WorkflowVersion], dict[WorkflowKey, dict[str, int]]]:
        with client.connect(self.site.settings) as conn:
            versions = workflow_versions(conn)
            counts = counts_by_workflow(conn, RunFilter(since_ms=since_ms))
        return versions, counts

    async def workflow(self, request: Request) -> Response:
        name, version = request.path_params["name"], int(request.path_params["version"])
        found = await run_in_threadpool(self._version, name, version)
        if found is None:
            return self.site.problem(
                request, 404, f"no workflow {name!r} version {version} is registered"
            )
        steps = step_states({"steps": _steps(found.definition), "nodes": []})
        try:
            dag = layout(steps) if steps else None
        except ValueError:  # a definition written by hand that no run could take
            dag = None
        return self.site.page(
            request,
            "workflow.html",
            wf_name=name,
            version=version,
            definition=found.definition,
            registered_at=found.registered_at,
            source=found.source,
            dag=dag,
        )

    def _version(self, name: str, version: int) -> StoredVersion | None:
        with client.connect(self.site.settings) as conn:
            return stored_version(conn, name, version)

    async def workers(self, request: Request) -> Response:
        loads = await run_in_threadpool(self._workers)
        return self.site.page(
            request,
            "workers.html",
            refresh_ms=REFRESH_MS,
            loads=loads,
            gone_after_s=self.site.settings.instance_timeout_s,
        )

    def _workers(self) -> list[WorkerLoad]:
        with client.connect(self.site.settings) as conn:
            return worker_loads(conn, self.site.settings.instance_timeout_s)

    async def dead_letters(self, request: Request) -> Response:
        params = request.query_params
        reason = params.get("reason") or None
        if reason is not None and reason not in DLQ_REASONS:
            return self.site.problem(request, 400, f"no dead-letter reason is called {reason!r}")
        since, until = params.get("since", "").strip(), params.get("until", "").strip()
        try:
            times = client.parse_filter(now_ms=now_ms(), since=since or None, until=until or None)
            look = self.site.window(times.since_ms, times.until_ms, "`ductor dlq list`")
        except ValueError as exc:
            return self.site.problem(request, 400, str(exc))
        try:
            letters = await run_in_threadpool(self._dead_letters, reason, look)
        except DlqError as exc:
            return self.site.problem(request, 503, str(exc))
        return self.site.page(
            request,
            "dead_letters.html",
            letters=letters,
            reason=reason,
            reasons=DLQ_REASONS,
            shown=DEAD_LETTERS_SHOWN,
            since=since,
            until=until,
            default_since=as_duration(self.site.settings.ui_window_s),
            **self.site.shown(look),
        )

    def _dead_letters(self, reason: str | None, look: Window) -> list[DeadLetter]:
        return read_dead_letters(
            self.site.settings,
            reason=reason,
            limit=DEAD_LETTERS_SHOWN,
            since_ms=look.since_ms,
            until_ms=look.until_ms,
        )


def _steps(definition: Any) -> list[dict[str, Any]]:
    """The definition's steps as `inspect -o json` lists a run's (name, kind, type, after)."""
    steps = definition.get("steps") if isinstance(definition, dict) else None
    if not isinstance(steps, list):
        return []
    return [
        {
            "name": str(s.get("name")),
            "kind": str(s.get("kind", "task")),
            "type": str(s.get("type", "")),
            "after": [str(d) for d in s.get("depends_on", [])],
        }
        for s in steps
        if isinstance(s, dict)
    ]
