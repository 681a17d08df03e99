"""The web page's workflows and workers (app.py serves them beside the runs): the registered
versions with how many of their runs are in each status (the runs created within the runs
page's window: processor/ui/window.py), a version's definition as stored and drawn as its DAG,
and every live worker with its queues, the partitions it holds, its step types and how many
tasks it holds of its slots."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from processor import client
from processor.client import RunFilter
from processor.core.model import RunStatus
from processor.io.postgres.run_search import counts_by_workflow
from processor.io.postgres.worker_registry import WorkerLoad, worker_loads
from processor.io.postgres.workflows import WorkflowVersion, stored_definition, workflow_versions
from processor.ui.dag import layout, step_states
from processor.ui.http import at
from processor.ui.window import as_duration

if TYPE_CHECKING:
    from processor.ui.app import Site

REFRESH_MS = 5000


class Catalog:
    """The workflows' and workers' handlers, on the site's settings and templates."""

    def __init__(self, site: Site) -> None:
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
    ) -> tuple[list[WorkflowVersion], dict[tuple[str, int], dict[str, int]]]:
        with client.connect(self.site.settings) as conn:
            versions = workflow_versions(conn)
            counts = counts_by_workflow(conn, RunFilter(since_ms=since_ms))
        return versions, counts

    async def workflow(self, request: Request) -> Response:
        name, version = request.path_params["name"], int(request.path_params["version"])
        found = await run_in_threadpool(self._definition, name, version)
        if found is None:
            return self.site.problem(
                request, 404, f"no workflow {name!r} version {version} is registered"
            )
        definition, registered_at = found
        steps = step_states({"steps": _steps(definition), "nodes": []})
        try:
            dag = layout(steps) if steps else None
        except ValueError:  # a definition written by hand that no run could take
            dag = None
        return self.site.page(
            request,
            "workflow.html",
            wf_name=name,
            version=version,
            definition=definition,
            registered_at=registered_at,
            dag=dag,
        )

    def _definition(self, name: str, version: int) -> tuple[Any, datetime] | None:
        with client.connect(self.site.settings) as conn:
            return stored_definition(conn, name, version)

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
