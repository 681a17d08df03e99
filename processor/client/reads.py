"""Reading runs: one's result (now, or once it has ended), its whole document, and
the runs a filter finds, a page at a time, or how many."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import psycopg

from processor.authoring import duration_ms
from processor.client.common import connection
from processor.client.errors import InvalidArgument, RunNotFinished, RunNotFound
from processor.core.run_search import Cursor, RunFilter, parse_tags, tags_problem
from processor.core.run_state import RunStatus
from processor.core.workflow_def import ValidationError
from processor.io.config.settings import Settings
from processor.io.postgres.run_document import inspect_document, read_run
from processor.io.postgres.run_search import RunPage
from processor.io.postgres.run_search import count_runs as _count_runs
from processor.io.postgres.run_search import search_runs as _search_runs
from processor.io.postgres.runs_admin import RunResult, RunSummary, run_result
from processor.io.postgres.store import Definitions

# How long `wait_for_run` waits between two reads of the run: from the first to the last,
# doubling (a run of fast steps ends in tens of milliseconds; a long one is not read 20 times
# a second for minutes).
# The channel a run's end is told on (schemas/migrations/0040_run_ended_notify.sql), and how
# often a wait reads the row all the same.
ENDED_CHANNEL = "ductor_run_ended"
RECHECK_S = 1.0


# The most runs `list_runs` gives at once (`ductor runs list --limit`).
MAX_LIST_LIMIT = 10_000


def get_run(settings: Settings, run_id: str) -> RunResult:
    """The run's status, output and failure reason now (RunNotFound if there is no such run)."""
    with connection(settings) as conn:
        return _read_result(conn, run_id)


def inspect_run(settings: Settings, run_id: str) -> dict[str, Any]:
    """What `ductor inspect RUN_ID -o json` prints: the run, its workflow's steps and
    their dependencies, its nodes and every attempt's timeline (io/postgres/run_document.py).
    RunNotFound if there is no such run."""
    with connection(settings) as conn:
        record = read_run(conn, Definitions(), run_id, settings.instance_timeout_s)
    if record is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return inspect_document(record)


def wait_for_run(settings: Settings, run_id: str, timeout_s: float) -> RunResult:
    """The run's result once it has ended (succeeded, failed or cancelled). RunNotFinished when
    it has not ended after ``timeout_s`` seconds (0: look once), RunNotFound if there is no such
    run. Told, not polling: the wait listens on ``ductor_run_ended`` (the row's change to a
    terminal status notifies it: schemas/migrations/0040_run_ended_notify.sql) and reads the
    row once listening, then when told and every RECHECK_S besides (a database migrated
    before that trigger existed is still waited for)."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    with connection(settings) as conn:
        conn.execute(f"LISTEN {ENDED_CHANNEL}")
        try:
            return _wait_told(conn, run_id, timeout_s, deadline)
        finally:
            with contextlib.suppress(psycopg.Error):  # a broken connection is not kept anyway
                conn.execute(f"UNLISTEN {ENDED_CHANNEL}")


def _wait_told(
    conn: psycopg.Connection[Any], run_id: str, timeout_s: float, deadline: float
) -> RunResult:
    while True:
        result = _read_result(conn, run_id)
        left = deadline - time.monotonic()
        if result.finished:
            return result
        if left <= 0:
            raise RunNotFinished(
                f"run {run_id!r} is still {result.status} after {timeout_s:g} s", result
            )
        recheck_at = time.monotonic() + min(RECHECK_S, left)
        while (wait := recheck_at - time.monotonic()) > 0:
            told = next(iter(conn.notifies(timeout=wait, stop_after=1)), None)
            if told is not None and told.payload == run_id:
                break


def list_runs(
    settings: Settings,
    workflow: str | None = None,
    status: RunStatus | None = None,
    limit: int = 50,
    tags: Mapping[str, str] | None = None,
) -> list[RunSummary]:
    """Up to ``limit`` runs, newest first, of ``workflow`` and in ``status`` when given, and
    with every tag of ``tags`` (``{"customer": "c-42"}``: given at the run's start or set by
    its steps with ``ctx.tag``)."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidArgument(f"the limit must be between 1 and {MAX_LIST_LIMIT}, not {limit}")
    problem = None if tags is None else tags_problem(tags)
    if problem is not None:
        raise InvalidArgument(problem)
    wanted = RunFilter(
        workflow=workflow,
        statuses=() if status is None else (status,),
        tags=tuple(sorted((tags or {}).items())),
    )
    return search_runs(settings, wanted, limit).runs


def search_runs(
    settings: Settings, wanted: RunFilter, limit: int = 50, after: Cursor | None = None
) -> RunPage:
    """Up to ``limit`` runs that ``wanted`` matches, newest first, and the cursor of the next
    page (None on the last): pass it as ``after`` to continue. Each filter is served by an
    index, so a search costs what it finds, not the size of the run table."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidArgument(f"the limit must be between 1 and {MAX_LIST_LIMIT}, not {limit}")
    with connection(settings) as conn:
        return _search_runs(conn, wanted, limit, after)


def parse_filter(
    *,
    now_ms: int,
    workflow: str | None = None,
    statuses: Sequence[str] = (),
    since: str | None = None,
    until: str | None = None,
    id_prefix: str | None = None,
    tags: Sequence[str] = (),
    step_failed: str | None = None,
    names: Mapping[str, str] | None = None,
) -> RunFilter:
    """The RunFilter a person wrote (`ductor runs list`'s flags, the web page's form): statuses
    by name (each once), times as ISO 8601 with their offset or a duration before ``now_ms``
    (``90s``, ``15m``, ``2h``, ``7d``), tags as ``KEY=VALUE``. ValueError saying what is wrong;
    ``names`` gives the words the message calls ``since`` and ``until`` by (``--since``)."""
    called = names or {}
    try:
        kept = tuple(RunStatus(s) for s in dict.fromkeys(statuses))
    except ValueError:
        known = ", ".join(s.value for s in RunStatus)
        raise ValueError(f"a status is one of {known}, not {list(statuses)!r}") from None
    return RunFilter(
        workflow=workflow,
        statuses=kept,
        since_ms=_time_bound(since, called.get("since", "since"), now_ms),
        until_ms=_time_bound(until, called.get("until", "until"), now_ms),
        id_prefix=id_prefix,
        tags=tuple(sorted(parse_tags(list(tags)).items())),
        step_failed=step_failed,
    )


def _time_bound(text: str | None, name: str, now_ms: int) -> int | None:
    """An ISO 8601 time with its offset, or a duration before now, as epoch ms."""
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        try:
            return now_ms - duration_ms(text, name)
        except ValidationError:
            raise ValueError(
                f"{name} {text!r}: expected an ISO 8601 time with its offset"
                " (2026-12-24T18:00:00Z) or a duration ago (90s, 15m, 2h, 7d)"
            ) from None
    if at.tzinfo is None:
        raise ValueError(f"{name} {text!r}: say the time's offset (Z, +01:00)")
    return round(at.timestamp() * 1000)


def count_runs(settings: Settings, wanted: RunFilter) -> int:
    """How many runs ``wanted`` matches."""
    with connection(settings) as conn:
        return _count_runs(conn, wanted)


def _read_result(conn: psycopg.Connection[Any], run_id: str) -> RunResult:
    result = run_result(conn, run_id)
    if result is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return result


def summary_document(run: RunSummary) -> dict[str, Any]:
    """A run as `ductor runs list -o json` and the HTTP API's search give it."""
    return {
        "run_id": run.run_id,
        "workflow": run.workflow[0],
        "version": run.workflow[1],
        "status": run.status.value,
        "created_at": None if run.created_at is None else run.created_at.isoformat(),
        "last_transition_at": run.last_transition_at.isoformat(),
        "failure_reason": run.failure_reason,
        "quarantined": run.quarantine_reason is not None,
        "tags": dict(run.tags),
    }


def result_document(result: RunResult) -> dict[str, Any]:
    """Where a run stands, as the HTTP API's result gives it (`ductor result` prints the
    output alone)."""
    return {
        "run_id": result.run_id,
        "status": result.status.value,
        "finished": result.finished,
        "output": result.output,
        "failure_reason": result.failure_reason,
        "compensation": result.compensation,
    }
