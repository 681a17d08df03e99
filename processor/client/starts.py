"""Starting runs: through the database (``start_runs``, ``start_run``: the rows, then
their wakeups) or through Kafka alone (``request_starts``, and ``request_signal``)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from processor.client.common import (
    check_json,
    check_run_id,
    check_text,
    check_tier,
    connection,
    produce_requests,
    wake,
)
from processor.client.errors import (
    ClientError,
    InvalidArgument,
    InvalidInput,
    ReservedRunId,
    RunExists,
    StartNotAnnounced,
)
from processor.client.records import StartedRun
from processor.core.deadlines import timeout_problem
from processor.core.model import SignalKind
from processor.core.requests import (
    MAX_NAME_LENGTH,
    SignalRequest,
    StartRequest,
)
from processor.core.run_ids import reserved_problem
from processor.core.run_input import input_problem
from processor.core.run_search import tags_problem
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import ExistingRun, insert_runs
from processor.io.postgres.store import Definitions


class IfExists(StrEnum):
    """What starting a run id that exists already does. Without a policy: an identical start
    (same workflow, same input) is ignored, a start with another input is refused. A run id
    of another workflow is refused whatever the policy."""

    IGNORE = "ignore"  # keep the existing run (and wake it), whatever input it was given
    FAIL = "fail"  # refuse to start a run id that exists at all


def start_runs(
    settings: Settings,
    workflow: str,
    run_ids: Sequence[str],
    run_input: Any = None,
    tier: str = "t1",
    version: int | None = None,
    if_exists: IfExists | str | None = None,
    start_at: datetime | None = None,
    tags: dict[str, str] | None = None,
    timeout_ms: int | None = None,
) -> list[str]:
    """Insert the runs and produce their first wakeups. Returns the ids created. A run id that
    exists already is kept as it is and woken again (its tick is then a no-op) when its start
    is the same, or when ``if_exists`` is ``ignore``; RunExists when it belongs to another
    workflow, was started with another input (unless ``ignore``), or exists at all with
    ``fail`` (the other ids of the call are started all the same). ``start_at`` (an aware
    datetime) starts them then, not before: a processor's sweep wakes them once it passed.
    ``tags`` (names to strings, core/run_search.tags_problem) are what `search_runs` finds
    them by; a run that exists already keeps its own. ``timeout_ms``: each run's deadline
    from its start (creation or ``start_at``), over the workflow's ``timeout_ms``."""
    _check_options(tags, timeout_ms)
    check_start(workflow, run_ids, run_input)
    policy = _policy(if_exists)
    start_ms = _start_ms(start_at)
    with connection(settings) as conn:
        definitions = Definitions()
        wf = (
            definitions.get(conn, (workflow, version))
            if version
            else definitions.latest(conn, workflow)
        )
        problem = input_problem(wf, run_input or {})
        if problem is not None:
            raise InvalidInput(problem)
        inserted: list[str] = []
        existing: list[ExistingRun] = []
        for start in range(0, len(run_ids), 5000):
            chunk = run_ids[start : start + 5000]
            runs = [(r, run_input or {}) for r in chunk]
            done = insert_runs(conn, wf, runs, tier, start_ms, tags, timeout_ms)
            inserted += done.created
            existing += done.existing
    refused = [e for e in existing if _refused(e, workflow, policy)]
    kept = {e.run_id for e in refused}
    later = start_ms is not None and start_ms > time.time() * 1000
    to_wake = [] if later else [r for r in run_ids if r not in kept]
    try:
        if to_wake:
            wake(settings, to_wake, tier, "start")
    except ClientError as exc:
        if not refused:
            raise StartNotAnnounced(
                f"{len(to_wake)} run(s) exist, but their start wakeups were not delivered"
                f" ({exc}): a processor's overdue sweep starts them shortly",
                inserted,
            ) from None
    if refused:
        raise RunExists(_refusal(refused, workflow, policy), refused, inserted)
    return inserted


def _check_options(tags: dict[str, str] | None, timeout_ms: int | None) -> None:
    problem = None if tags is None else tags_problem(tags)
    if problem is None and timeout_ms is not None:
        problem = timeout_problem(timeout_ms, "timeout_ms")
    if problem is not None:
        raise InvalidArgument(problem)


def check_start(workflow: str, run_ids: Sequence[str], run_input: Any) -> None:
    """What every door checks of a start before anything is written: the workflow's name and
    the run ids as texts Postgres can store (ClientError for a length, OutOfBounds for a NUL
    or a lone surrogate, as a request's dead letter says wrong_schema or out_of_bounds), no run
    id of a shape Ductor derives (ReservedRunId), and the input within the bounds of stored
    JSON (OutOfBounds)."""
    check_text("the workflow's name", workflow, MAX_NAME_LENGTH)
    for run_id in run_ids:
        check_run_id(run_id)
        reserved = reserved_problem(run_id)
        if reserved is not None:
            raise ReservedRunId(reserved)
    check_json("the input", run_input)


def _start_ms(start_at: datetime | None) -> int | None:
    if start_at is None:
        return None
    if start_at.tzinfo is None:
        raise InvalidArgument(
            f"start_at must say its time zone (an aware datetime), not {start_at.isoformat()}"
        )
    return round(start_at.timestamp() * 1000)


def _policy(if_exists: IfExists | str | None) -> IfExists | None:
    if if_exists is None or isinstance(if_exists, IfExists):
        return if_exists
    try:
        return IfExists(if_exists)
    except ValueError:
        raise InvalidArgument(
            f"if_exists must be one of {', '.join(p.value for p in IfExists)} (or None),"
            f" not {if_exists!r}"
        ) from None


def _refused(run: ExistingRun, workflow: str, policy: IfExists | None) -> bool:
    if run.workflow[0] != workflow or policy is IfExists.FAIL:
        return True
    return policy is None and not run.same_input


def _refusal(refused: list[ExistingRun], workflow: str, policy: IfExists | None) -> str:
    first = refused[0]
    more = f" (and {len(refused) - 1} more run id(s))" if len(refused) > 1 else ""
    if first.workflow[0] != workflow:
        return (
            f"run {first.run_id!r} exists already, of workflow {first.workflow[0]!r}{more}:"
            f" a run id belongs to one workflow; start {workflow!r} under another id"
        )
    if policy is IfExists.FAIL:
        return f"run {first.run_id!r} exists already{more} (if_exists=fail)"
    return (
        f"run {first.run_id!r} exists already with another input{more}; if_exists=ignore"
        " keeps the existing run, or start this one under another id"
    )


def start_run(
    settings: Settings,
    workflow: str,
    run_id: str,
    run_input: Any = None,
    tier: str = "t1",
    version: int | None = None,
    if_exists: IfExists | str | None = None,
    start_at: datetime | None = None,
    tags: dict[str, str] | None = None,
    timeout_ms: int | None = None,
) -> StartedRun:
    """Start one run of ``workflow`` (its latest version unless ``version``) with ``run_input``
    (JSON-serialisable; ``{}`` when None) on wakeup tier ``tier``. Idempotent by run id: the
    same start again leaves the run as it is (and wakes it, which changes nothing), and
    ``created`` says so. RunExists if that run belongs to another workflow or was started
    with another input (``if_exists``: see ``IfExists``). ``start_at``: not before then.
    ``tags``: what ``search_runs`` finds it by (``{"customer": "c-42"}``). ``timeout_ms``:
    its own deadline, over the workflow's (see ``start_runs``)."""
    check_tier(tier)
    created = bool(
        start_runs(
            settings,
            workflow,
            [run_id],
            run_input,
            tier,
            version,
            if_exists,
            start_at,
            tags,
            timeout_ms,
        )
    )
    return StartedRun(run_id, created)


def request_starts(
    settings: Settings,
    workflow: str,
    run_ids: Sequence[str],
    run_input: Any = None,
    tier: str = "t1",
    version: int | None = None,
) -> None:
    """Ask the processors to start the runs through Kafka alone (``ductor.requests``,
    docs/requests.md): no access to Postgres is needed. Returns once the broker has every
    request; the runs are created by a processor shortly after. Idempotent by run id like
    ``start_runs``, but what a start cannot do (an unknown workflow, a run id that exists with
    another workflow or input) is a dead letter, not an exception: nothing answers here."""
    # The input before it is encoded (orjson cannot write a value nested past 254 levels); the
    # rest as a processor decodes each request (produce_requests).
    check_json("the input", run_input)
    requests = [StartRequest(r, workflow, version, run_input, tier) for r in run_ids]
    produce_requests(settings, requests, "start request")


def request_signal(
    settings: Settings,
    run_id: str,
    kind: SignalKind | str = SignalKind.CANCEL,
    signal_id: str | None = None,
    payload: Any = None,
) -> str:
    """Ask the processors to signal the run through Kafka alone (``ductor.requests``): a
    cancel, or the signal named ``kind`` that a wait step waits for, with ``payload``. The
    signal id (a new one when None: the idempotency key). A signal for a run that does not
    exist yet is kept for its start: a cancel until the start comes, however late (the run
    then ends cancelled before any step), another for ``DUCTOR_KEPT_SIGNAL_TTL_S``, then
    dead-lettered."""
    name = str(kind)
    signal_id = signal_id or f"{name}-{uuid.uuid4().hex[:12]}"
    check_json("the payload", payload)
    produce_requests(settings, [SignalRequest(run_id, name, signal_id, payload)], "signal request")
    return signal_id
