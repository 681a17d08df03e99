"""A small Python client of Ductor: what a program (or the ``ductor`` command line) calls to
drive workflow runs from outside the processors: start runs, read and wait for their result,
list them, signal them, retry a failed one. ``request_starts`` and ``request_signal`` start and
signal through Kafka alone, as any producer may (docs/requests.md).

Every function takes the typed ``Settings`` (``processor.io.config.load_settings()`` reads
them from the ``DUCTOR_*`` variables) and opens what it needs for the call. Results are frozen
dataclasses; failures are ``ClientError`` (a RuntimeError) or one of its subclasses, with a
one-sentence message.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

import psycopg
from confluent_kafka import KafkaError, KafkaException, Producer

from processor.authoring import duration_ms
from processor.core.bounds import json_problem, text_problem
from processor.core.decide import Commit, Send
from processor.core.envelope import MAX_RUN_ID_LENGTH, Rejected, Wakeup
from processor.core.landing import landing_problem
from processor.core.model import LoadedRun, NodeStatus, RunStatus, SignalKind, UnknownWorkflow
from processor.core.outcomes import DeadLetterReason
from processor.core.requests import (
    MAX_NAME_LENGTH,
    Request,
    SignalRequest,
    StartRequest,
    decode_request,
    request_key,
)
from processor.core.routing import TIERS, TopicNames
from processor.core.run_ids import reserved_problem
from processor.core.run_input import input_problem
from processor.core.run_search import Cursor, RunFilter, parse_tags, tags_problem
from processor.core.tick import resume_failed
from processor.core.workflow import SIGNAL_NAME, ValidationError
from processor.io.config.settings import Settings
from processor.io.kafka.clients import choose_partition, produce, topic_partitions
from processor.io.kafka.configs import producer_config
from processor.io.kafka.logs import with_logger
from processor.io.postgres.outbox import delete_outbox
from processor.io.postgres.run_document import inspect_document, read_run
from processor.io.postgres.run_search import RunPage
from processor.io.postgres.run_search import count_runs as _count_runs
from processor.io.postgres.run_search import search_runs as _search_runs
from processor.io.postgres.run_signals import Signal, record_live_signals, signal_targets
from processor.io.postgres.runs_admin import (
    ExistingRun,
    RunResult,
    RunSummary,
    insert_cancels,
    insert_runs,
    release_quarantine,
    run_columns,
    run_result,
    run_tier,
)
from processor.io.postgres.store import Definitions, commit_batch, load_runs
from processor.io.telemetry.logs import first_line

__all__ = [
    "MAX_BULK_RUNS",
    "MAX_LIST_LIMIT",
    "BulkAction",
    "ClientError",
    "Cursor",
    "IfExists",
    "InvalidArgument",
    "InvalidInput",
    "OutOfBounds",
    "ReservedRunId",
    "RetriedRun",
    "RetryRefused",
    "RunExists",
    "RunFilter",
    "RunNotFinished",
    "RunNotFound",
    "RunPage",
    "RunResult",
    "RunSummary",
    "SignalRefused",
    "SignalSent",
    "StartNotAnnounced",
    "StartedRun",
    "cancel_runs",
    "connect",
    "count_runs",
    "get_run",
    "inspect_run",
    "list_runs",
    "parse_filter",
    "release_run",
    "request_signal",
    "request_starts",
    "result_document",
    "retry_run",
    "retry_runs",
    "search_runs",
    "send_signal",
    "start_run",
    "start_runs",
    "summary_document",
    "wait_for_run",
    "wake",
]

# How long `wait_for_run` waits between two reads of the run: from the first to the last,
# doubling (a run of fast steps ends in tens of milliseconds; a long one is not read 20 times
# a second for minutes).
_FIRST_POLL_S, _LAST_POLL_S = 0.05, 1.0
# The most runs `list_runs` gives at once (`ductor runs list --limit`).
MAX_LIST_LIMIT = 10_000
# The most runs a bulk cancel or retry acts on at once, unless told more (`--max`): a filter
# that matches more than expected is refused, not carried out.
MAX_BULK_RUNS = 10_000
_BULK_PAGE = 500
# A retry that lost the race for the run's row this many times gives up (only another retry
# of the same run writes a failed run's row), after these waits.
_RETRY_RACE_WAITS_S = (0.0, 0.01, 0.05, 0.2)


class ClientError(RuntimeError):
    """An operation that could not be done; the message says why, in one sentence."""


class RunNotFound(ClientError, LookupError):
    """There is no run with this id."""


class RunNotFinished(ClientError):
    """The run had not ended when the wait was over; ``result`` is where it stood then."""

    def __init__(self, message: str, result: RunResult) -> None:
        super().__init__(message)
        self.result = result


class StartNotAnnounced(ClientError):
    """The runs were created, but the broker did not take their start wakeups: they start
    anyway, once a processor's overdue sweep finds them (``DUCTOR_SWEEP_GRACE_S`` after their
    creation, plus a sweep interval). ``inserted``: the ids created by this call."""

    def __init__(self, message: str, inserted: list[str]) -> None:
        super().__init__(message)
        self.inserted = inserted


class IfExists(StrEnum):
    """What starting a run id that exists already does. Without a policy: an identical start
    (same workflow, same input) is ignored, a start with another input is refused. A run id
    of another workflow is refused whatever the policy."""

    IGNORE = "ignore"  # keep the existing run (and wake it), whatever input it was given
    FAIL = "fail"  # refuse to start a run id that exists at all


class InvalidArgument(ClientError, ValueError):
    """A call refused for what it asks before anything was written: a name or an id of the
    wrong length, a tier, a policy or a signal name that does not exist, tags of the wrong
    shape, a limit out of range (the HTTP API answers it 400)."""


class InvalidInput(ClientError, ValueError):
    """A start refused because its input does not match the workflow's input schema; the
    message says where it is wrong. Nothing was written."""


class OutOfBounds(ClientError, ValueError):
    """A value refused before anything was written because Ductor cannot store it: a run's
    input or a signal's payload beyond the bounds of stored JSON (nested deeper than 64 levels,
    larger than 1 MiB, a NUL character, a lone surrogate, an integer beyond 64 bits, something
    that is not JSON), or an id that holds a NUL or a lone surrogate (docs/requests.md#bounds).
    The message names the path: ``the input at $.a[0]... is nested deeper than 64 levels``."""


class ReservedRunId(ClientError, ValueError):
    """A start refused because its run id has the shape of an id only Ductor derives (a
    schedule's run ``NAME@TIME``, a child run ``PARENT/STEP#N``: docs/requests.md#reserved-run-ids).
    Nothing was written."""


class SignalRefused(ClientError, ValueError):
    """A signal refused before anything was written because it cannot land
    (core/landing.py): ``reason`` is ``run_ended`` (the run has ended: a signal can change it
    no more) or ``unknown_signal`` (no wait step of the run's workflow waits for that name: a
    typo), the dead-letter reason the same signal gets on the requests topic."""

    def __init__(self, message: str, reason: DeadLetterReason) -> None:
        super().__init__(message)
        self.reason = reason


class RunExists(ClientError):
    """A start refused because its run id exists already: under another workflow, with
    another input (no policy), or at all (``IfExists.FAIL``). ``existing``: each run refused;
    ``inserted``: the ids of the same call that were created (and woken) all the same."""

    def __init__(self, message: str, existing: list[ExistingRun], inserted: list[str]) -> None:
        super().__init__(message)
        self.existing = existing
        self.inserted = inserted

    @property
    def run_id(self) -> str:
        return self.existing[0].run_id


class RetryRefused(ClientError):
    """The run cannot be retried: it is not failed, or its row cannot be used."""


@dataclass(frozen=True)
class StartedRun:
    run_id: str
    created: bool  # False: a run with this id existed already (starting is idempotent)


@dataclass(frozen=True)
class SignalSent:
    signal_id: str
    new: bool  # False: a signal with this id was already recorded (and is not sent twice)


@dataclass(frozen=True)
class RetriedRun:
    run_id: str
    steps: tuple[str, ...]  # the steps that run again (all but the succeeded ones)
    seq: int  # the run's transition seq after the resume


@dataclass(frozen=True)
class BulkAction:
    """What a bulk cancel or retry found and did: the runs the filter matched among those the
    action applies to, the ones acted on (none in a dry run), and those refused with why."""

    matched: tuple[str, ...]
    acted: tuple[str, ...]
    refused: tuple[tuple[str, str], ...] = ()


def connect(settings: Settings) -> psycopg.Connection[Any]:
    """An autocommit connection to the settings' Postgres, or ClientError naming the DSN
    (its password hidden)."""
    try:
        return psycopg.connect(settings.pg_dsn, autocommit=True, connect_timeout=10)
    except psycopg.OperationalError as exc:
        raise ClientError(
            f"cannot connect to Postgres at {settings.pg_dsn_redacted} ({first_line(exc)});"
            " is it running (make up) and is DUCTOR_PG_DSN right?"
        ) from None


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
) -> list[str]:
    """Insert the runs and produce their first wakeups. Returns the ids created. A run id that
    exists already is kept as it is and woken again (its tick is then a no-op) when its start
    is the same, or when ``if_exists`` is ``ignore``; RunExists when it belongs to another
    workflow, was started with another input (unless ``ignore``), or exists at all with
    ``fail`` (the other ids of the call are started all the same). ``start_at`` (an aware
    datetime) starts them then, not before: a processor's sweep wakes them once it passed.
    ``tags`` (names to strings, core/run_search.tags_problem) are what `search_runs` finds
    them by; a run that exists already keeps its own."""
    problem = None if tags is None else tags_problem(tags)
    if problem is not None:
        raise InvalidArgument(problem)
    check_start(workflow, run_ids, run_input)
    policy = _policy(if_exists)
    start_ms = _start_ms(start_at)
    with connect(settings) as conn:
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
            done = insert_runs(conn, wf, runs, tier, start_ms, tags)
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


def check_start(workflow: str, run_ids: Sequence[str], run_input: Any) -> None:
    """What every door checks of a start before anything is written: the workflow's name and
    the run ids as texts Postgres can store (ClientError for a length, OutOfBounds for a NUL
    or a lone surrogate, as a request's dead letter says wrong_schema or out_of_bounds), no run
    id of a shape Ductor derives (ReservedRunId), and the input within the bounds of stored
    JSON (OutOfBounds)."""
    _check_text("the workflow's name", workflow, MAX_NAME_LENGTH)
    for run_id in run_ids:
        _check_run_id(run_id)
        reserved = reserved_problem(run_id)
        if reserved is not None:
            raise ReservedRunId(reserved)
    _check_json("the input", run_input)


def _check_json(name: str, value: Any) -> None:
    problem = json_problem(value)
    if problem is not None:
        raise OutOfBounds(problem.describe(name) + "; nothing was written")


def _check_text(name: str, value: str, most: int) -> None:
    if not 1 <= len(value) <= most:
        raise InvalidArgument(f"{name} must be 1 to {most} characters, not {len(value)}")
    problem = text_problem(value, most)
    if problem is not None:
        raise OutOfBounds(f"{name} {problem}")


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
) -> StartedRun:
    """Start one run of ``workflow`` (its latest version unless ``version``) with ``run_input``
    (JSON-serialisable; ``{}`` when None) on wakeup tier ``tier``. Idempotent by run id: the
    same start again leaves the run as it is (and wakes it, which changes nothing), and
    ``created`` says so. RunExists if that run belongs to another workflow or was started
    with another input (``if_exists``: see ``IfExists``). ``start_at``: not before then.
    ``tags``: what ``search_runs`` finds it by (``{"customer": "c-42"}``)."""
    _check_tier(tier)
    created = bool(
        start_runs(
            settings, workflow, [run_id], run_input, tier, version, if_exists, start_at, tags
        )
    )
    return StartedRun(run_id, created)


def wake(settings: Settings, run_ids: Sequence[str], tier: str, reason: str) -> None:
    """Produce a wakeup for each run on its tier's wakeup topic and wait for the broker's
    acknowledgement (ClientError after 30 s)."""
    topic = TopicNames(settings.topic_prefix).wakeup(tier)
    now_ms = int(time.time() * 1000)
    wakeups = [Wakeup(run_id=run_id, reason=reason, produced_at=now_ms) for run_id in run_ids]
    _produce_keyed(
        settings, topic, [(w.run_id, w.key(), w.encode()) for w in wakeups], f"{reason} wakeup"
    )


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
    # rest as a processor decodes each request (_produce_requests).
    _check_json("the input", run_input)
    requests = [StartRequest(r, workflow, version, run_input, tier) for r in run_ids]
    _produce_requests(settings, requests, "start request")


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
    _check_json("the payload", payload)
    _produce_requests(settings, [SignalRequest(run_id, name, signal_id, payload)], "signal request")
    return signal_id


def _produce_requests(settings: Settings, requests: Sequence[Request], what: str) -> None:
    """The requests, each checked as a processor decodes it (ClientError with what is wrong,
    and nothing produced, if one would be dead-lettered: OutOfBounds or ReservedRunId for
    those reasons), produced."""
    records = []
    for request in requests:
        try:
            value = request.encode()
        except TypeError as exc:
            raise ClientError(f"the {what} cannot be written as JSON: {exc}") from None
        decoded = decode_request(value, settings.max_record_bytes)
        if isinstance(decoded, Rejected):
            refusal = _REFUSALS.get(decoded.reason, ClientError)
            raise refusal(
                f"the {what} for run {request.run_id!r} would be dead-lettered by a processor"
                f" ({decoded.reason.value}): {decoded.detail}"
            )
        records.append((request.run_id, request_key(request), value))
    _produce_keyed(settings, TopicNames(settings.topic_prefix).requests, records, what)


# The exception a request refused for these reasons raises (others: ClientError).
_REFUSALS: dict[DeadLetterReason, type[ClientError]] = {
    DeadLetterReason.OUT_OF_BOUNDS: OutOfBounds,
    DeadLetterReason.RESERVED_RUN_ID: ReservedRunId,
}


def _produce_keyed(
    settings: Settings, topic: str, records: Sequence[tuple[str, bytes, bytes]], what: str
) -> None:
    """Produce (run id, key, value) records, each on its run's partition, and wait for the
    broker's acknowledgement of every one (ClientError after 30 s)."""
    producer = Producer(with_logger(producer_config(settings, "ductor-cli")))
    try:
        partitions = topic_partitions(producer, [topic])[topic]
    except KafkaException as exc:
        raise ClientError(f"the broker cannot be reached: {exc.args[0]}") from None
    failed: list[KafkaError] = []

    def delivered(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failed.append(err)

    for run_id, key, value in records:
        partition = choose_partition(run_id, partitions, settings.partition_by_run)
        produce(producer, topic, value, key, partition, on_delivery=delivered)
    if producer.flush(30) != 0:
        raise ClientError(f"the broker did not acknowledge every {what} within 30 s")
    if failed:
        raise ClientError(f"{len(failed)} {what}(s) not delivered: {failed[0].str()}")


def _check_run_id(run_id: str) -> None:
    if not 1 <= len(run_id) <= MAX_RUN_ID_LENGTH:
        raise InvalidArgument(f"a run id is 1 to {MAX_RUN_ID_LENGTH} characters, not {len(run_id)}")
    problem = text_problem(run_id, MAX_RUN_ID_LENGTH)
    if problem is not None:
        raise OutOfBounds(f"the run id {run_id[:60]!r} {problem}")


def _check_signal(run_id: str, signal_id: str, payload: Any) -> None:
    _check_run_id(run_id)
    _check_text("the signal id", signal_id, MAX_NAME_LENGTH)
    _check_json("the payload", payload)


def _check_tier(tier: str) -> None:
    if tier not in TIERS:
        raise InvalidArgument(f"tier must be one of {', '.join(TIERS)}, not {tier!r}")


def get_run(settings: Settings, run_id: str) -> RunResult:
    """The run's status, output and failure reason now (RunNotFound if there is no such run)."""
    with connect(settings) as conn:
        return _read_result(conn, run_id)


def inspect_run(settings: Settings, run_id: str) -> dict[str, Any]:
    """What `ductor inspect RUN_ID --output json` prints: the run, its workflow's steps and
    their dependencies, its nodes and every attempt's timeline (io/postgres/run_document.py).
    RunNotFound if there is no such run."""
    with connect(settings) as conn:
        record = read_run(conn, Definitions(), run_id, settings.instance_timeout_s)
    if record is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return inspect_document(record)


def wait_for_run(settings: Settings, run_id: str, timeout_s: float) -> RunResult:
    """The run's result once it has ended (succeeded, failed or cancelled), read from Postgres
    every 50 ms at first, then less and less often (at most 1 s apart). RunNotFinished when it
    has not ended after ``timeout_s`` seconds (0: look once), RunNotFound if there is no such
    run."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    pause = _FIRST_POLL_S
    with connect(settings) as conn:
        while True:
            result = _read_result(conn, run_id)
            left = deadline - time.monotonic()
            if result.finished:
                return result
            if left <= 0:
                raise RunNotFinished(
                    f"run {run_id!r} is still {result.status} after {timeout_s:g} s", result
                )
            time.sleep(min(pause, left))
            pause = min(pause * 2, _LAST_POLL_S)


def list_runs(
    settings: Settings,
    workflow: str | None = None,
    status: RunStatus | None = None,
    limit: int = 50,
) -> list[RunSummary]:
    """Up to ``limit`` runs, newest first, of ``workflow`` and in ``status`` when given."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidArgument(f"the limit must be between 1 and {MAX_LIST_LIMIT}, not {limit}")
    wanted = RunFilter(workflow=workflow, statuses=() if status is None else (status,))
    return search_runs(settings, wanted, limit).runs


def search_runs(
    settings: Settings, wanted: RunFilter, limit: int = 50, after: Cursor | None = None
) -> RunPage:
    """Up to ``limit`` runs that ``wanted`` matches, newest first, and the cursor of the next
    page (None on the last): pass it as ``after`` to continue. Each filter is served by an
    index, so a search costs what it finds, not the size of the run table."""
    if not 1 <= limit <= MAX_LIST_LIMIT:
        raise InvalidArgument(f"the limit must be between 1 and {MAX_LIST_LIMIT}, not {limit}")
    with connect(settings) as conn:
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
    with connect(settings) as conn:
        return _count_runs(conn, wanted)


_LIVE = (RunStatus.PENDING, RunStatus.RUNNING)


def cancel_runs(
    settings: Settings, wanted: RunFilter, dry_run: bool = False, max_runs: int = MAX_BULK_RUNS
) -> BulkAction:
    """Cancel every pending or running run ``wanted`` matches (one cancel signal each, under
    one signal id, and their wakeups): a run that ends meanwhile is left as it ended. ``dry_run``
    only finds them. ClientError for an empty filter (every run) or for more than
    ``max_runs`` matches (narrow the filter, or raise the bound)."""
    matched = _bulk_matches(settings, wanted, _LIVE, max_runs)
    if dry_run or not matched:
        return BulkAction(tuple(id for id, _ in matched), ())
    signal_id = f"cancel-bulk-{uuid.uuid4().hex[:12]}"
    with connect(settings) as conn:
        for start in range(0, len(matched), _BULK_PAGE):
            insert_cancels(conn, [id for id, _ in matched[start : start + _BULK_PAGE]], signal_id)
    _wake_by_tier(settings, matched, "signal")
    ids = tuple(id for id, _ in matched)
    return BulkAction(ids, ids)


def retry_runs(
    settings: Settings, wanted: RunFilter, dry_run: bool = False, max_runs: int = MAX_BULK_RUNS
) -> BulkAction:
    """Resume every failed run ``wanted`` matches, as ``retry_run`` does one; a run that
    cannot be retried (quarantined, changed outside Ductor) is refused with why, and the
    others go on. ``dry_run`` only finds them; bounds as ``cancel_runs``."""
    matched = _bulk_matches(settings, wanted, (RunStatus.FAILED,), max_runs)
    if dry_run or not matched:
        return BulkAction(tuple(id for id, _ in matched), ())
    topics = TopicNames(settings.topic_prefix)
    retried: list[RetriedRun] = []
    refused: list[tuple[str, str]] = []
    with connect(settings) as conn:
        definitions = Definitions()
        for run_id, _tier in matched:
            try:
                retried.append(_resume(conn, definitions, topics, run_id)[0])
            except ClientError as exc:
                refused.append((run_id, str(exc)))
        done = {r.run_id for r in retried}
        _wake_by_tier(settings, [(id, tier) for id, tier in matched if id in done], "replay")
        delete_outbox(conn, [(r.run_id, r.seq) for r in retried])
    return BulkAction(tuple(id for id, _ in matched), tuple(sorted(done)), tuple(refused))


def _bulk_matches(
    settings: Settings, wanted: RunFilter, statuses: tuple[RunStatus, ...], max_runs: int
) -> list[tuple[str, str]]:
    """(run id, tier) of the runs in ``statuses`` that ``wanted`` matches, newest first."""
    if wanted.empty:
        raise ClientError(
            "a bulk action needs a filter (--workflow, --status, --since, --until, --id-prefix,"
            " --tag or --step-failed): an empty one matches every run"
        )
    if wanted.matches_nothing(statuses):
        return []
    narrowed = wanted.within(statuses)
    with connect(settings) as conn:
        count = _count_runs(conn, narrowed)
        if count > max_runs:
            raise ClientError(
                f"the filter matches {count} runs, more than the bound of {max_runs}:"
                " narrow it, or raise the bound (--max)"
            )
        matched: list[tuple[str, str]] = []
        after: Cursor | None = None
        while True:
            page = _search_runs(conn, narrowed, _BULK_PAGE, after)
            tiers = _tiers(conn, [r.run_id for r in page.runs])
            matched += [(r.run_id, tiers[r.run_id]) for r in page.runs if r.run_id in tiers]
            if page.next_cursor is None or len(matched) > max_runs:
                return matched[:max_runs]
            after = page.next_cursor


def _tiers(conn: psycopg.Connection[Any], run_ids: list[str]) -> dict[str, str]:
    rows = conn.execute(
        "SELECT run_id, tier FROM eec_workflow_run WHERE run_id = ANY(%s)", (run_ids,)
    ).fetchall()
    return {r[0]: r[1] for r in rows}


def _wake_by_tier(settings: Settings, runs: Sequence[tuple[str, str]], reason: str) -> None:
    by_tier: dict[str, list[str]] = {}
    for run_id, tier in runs:
        by_tier.setdefault(tier, []).append(run_id)
    for tier, ids in sorted(by_tier.items()):
        wake(settings, ids, tier, reason)


def send_signal(
    settings: Settings,
    run_id: str,
    kind: SignalKind | str = SignalKind.CANCEL,
    signal_id: str | None = None,
    payload: Any = None,
) -> SignalSent:
    """Record a signal for the run and wake it: a cancel, or the signal named ``kind`` that a
    wait step waits for, whose ``payload`` (JSON) becomes that step's output. ``signal_id``
    is the idempotency key (a new one when None): the same id is recorded and acted on once
    (sent again, it is answered as recorded before, whatever the run became since).
    ClientError for a name no signal may have, or a payload that is not JSON; RunNotFound
    for a run that does not exist; SignalRefused for a run that has ended (``run_ended``) or
    a name no wait step of its workflow waits for (``unknown_signal``): nothing is written."""
    name = str(kind)
    if not SIGNAL_NAME.fullmatch(name):
        raise InvalidArgument(
            f"a signal's name is 'cancel' or 1 to 100 letters, digits, '_', '.', ':' or '-',"
            f" not {name!r}"
        )
    signal_id = signal_id or f"{name}-{uuid.uuid4().hex[:12]}"
    _check_signal(run_id, signal_id, payload)
    with connect(settings) as conn:
        tier, new = _record_signal(conn, Signal(run_id, signal_id, name, payload))
    wake(settings, [run_id], tier, "signal")
    return SignalSent(signal_id, new)


def _record_signal(conn: psycopg.Connection[Any], signal: Signal) -> tuple[str, bool]:
    """Record the signal if it can land (core/landing.py): the run's tier, and whether this
    call recorded it (False: its id was recorded before). RunNotFound, or SignalRefused with
    the reason, when it cannot; a run that ended between the read and the write is refused
    too (the write is conditioned on the run being live)."""
    run_id = signal.run_id
    for _ in range(2):
        target = signal_targets(conn, [signal.key])[signal.key]
        if target.workflow is None or target.status is None or target.tier is None:
            raise RunNotFound(f"no run with id {run_id!r}")
        if target.recorded:  # sent again (a retry): the same answer as the first time
            return target.tier, False
        try:
            wf = Definitions().get(conn, target.workflow)
        except UnknownWorkflow as exc:
            raise ClientError(f"run {run_id!r} cannot take signals: {exc}") from None
        refusal = landing_problem(run_id, wf, target.status, signal.name)
        if refusal is not None:
            raise SignalRefused(
                f"signal {signal.name!r} refused ({refusal.reason.value}): {refusal.detail}",
                refusal.reason,
            )
        if record_live_signals(conn, [signal]):
            return target.tier, True
        # Not written: the run ended since it was read, or the same id was recorded meanwhile;
        # the second read says which.
    raise ClientError(f"run {run_id!r} kept changing while signal {signal.name!r} was recorded")


def release_run(settings: Settings, run_id: str) -> None:
    """Clear a quarantined run's flag (once its row is repaired) and wake it: a repaired run
    goes on, one still broken is dead-lettered and quarantined again. RunNotFound if there is
    no such run, ClientError if it is not quarantined."""
    with connect(settings) as conn:
        tier = _tier_of(conn, run_id)
        if not release_quarantine(conn, run_id):
            raise ClientError(f"run {run_id!r} is not quarantined")
    wake(settings, [run_id], tier, "replay")


def retry_run(settings: Settings, run_id: str) -> RetriedRun:
    """Resume a failed run from its failed steps (``resume_failed``): the succeeded steps keep
    their outputs and do not run again; the failed ones, and those the failure cancelled, run
    again as new attempts, each with its retry policy's whole budget.

    The resumed state is committed like every transition, by the conditional UPDATE on the
    run's version, with its wakeup in the outbox in the same statement; the wakeup is then
    produced here (and, should this process die first, relayed by a processor). A lost race
    is read again and retried a few times. RetryRefused for a run that is not failed, is
    quarantined or cannot be loaded; RunNotFound if there is no such run."""
    topics = TopicNames(settings.topic_prefix)
    with connect(settings) as conn:
        retried, tier = _resume(conn, Definitions(), topics, run_id)
        try:
            wake(settings, [run_id], tier, "replay")
        except (ClientError, KafkaException):
            raise ClientError(
                f"run {run_id!r} was resumed, but the broker did not take its wakeup; a"
                " processor sends it again from the outbox once the broker is back"
            ) from None
        delete_outbox(conn, [(run_id, retried.seq)])  # sent: no processor need relay it
    return retried


def _resume(
    conn: psycopg.Connection[Any], definitions: Definitions, topics: TopicNames, run_id: str
) -> tuple[RetriedRun, str]:
    """Commit the resumed state of a failed run (its wakeup in the outbox): what runs again,
    and the run's tier, for the caller to produce the wakeup."""
    for wait_s in _RETRY_RACE_WAITS_S:
        time.sleep(wait_s)
        run = _retryable(conn, definitions, run_id)
        resumed = resume_failed(run.state)
        wakeup = Wakeup(run_id=run_id, reason="replay", produced_at=int(time.time() * 1000))
        send = Send(topics.wakeup(run.tier), wakeup.key(), wakeup.encode(), by_run=run_id)
        # The commit skips a row another transaction holds; an operator's command waits
        # for it instead (the row lock taken first, in the same transaction).
        with conn.transaction():
            conn.execute(
                "SELECT 1 FROM eec_workflow_run WHERE run_id = %s FOR NO KEY UPDATE", (run_id,)
            )
            answer = commit_batch(conn, [Commit(run_id, run.version, resumed, (send,))])
        if answer.committed:
            steps = tuple(n for n, node in resumed.nodes if node.status is NodeStatus.PENDING)
            return RetriedRun(run_id, steps, resumed.seq), run.tier
    raise ClientError(
        f"run {run_id!r} kept changing while it was being retried"
        f" ({len(_RETRY_RACE_WAITS_S)} lost races); try again"
    )


def _retryable(conn: psycopg.Connection[Any], definitions: Definitions, run_id: str) -> LoadedRun:
    """The run as loaded, if it may be retried; RetryRefused (or RunNotFound) saying why not."""
    columns = run_columns(conn, run_id)
    run = load_runs(conn, definitions, [run_id]).get(run_id)
    if columns is None or run is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    if columns.quarantined_at is not None:
        raise RetryRefused(
            f"run {run_id!r} is quarantined ({columns.quarantine_reason}); repair its row,"
            " then `ductor runs release` it"
        )
    if isinstance(run, Exception):
        raise RetryRefused(f"run {run_id!r} cannot be loaded: {run}")
    if not run.checksum_ok:
        raise RetryRefused(
            f"run {run_id!r} was changed outside Ductor (its state_checksum does not match);"
            " repair its row first"
        )
    if run.state.status is not RunStatus.FAILED:
        raise RetryRefused(
            f"run {run_id!r} is {run.state.status}, not failed; only a failed run can be retried"
        )
    return run


def _tier_of(conn: psycopg.Connection[Any], run_id: str) -> str:
    """The run's wakeup tier (RunNotFound if there is no such run)."""
    tier = run_tier(conn, run_id)
    if tier is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return tier


def _read_result(conn: psycopg.Connection[Any], run_id: str) -> RunResult:
    result = run_result(conn, run_id)
    if result is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return result


def summary_document(run: RunSummary) -> dict[str, Any]:
    """A run as `ductor runs list --output json` and the HTTP API's search give it."""
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
    }
