"""Acting on runs: signal one, cancel or retry many by a filter (bounded), retry a
failed one from its failed steps, release a quarantined one."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
from confluent_kafka import KafkaException

from processor.client.common import check_signal, connection, wake
from processor.client.errors import (
    ClientError,
    InvalidArgument,
    RetryRefused,
    RunNotFound,
    SignalRefused,
)
from processor.client.records import BulkAction, RetriedRun, SignalSent
from processor.core.envelope import Wakeup
from processor.core.landing import landing_problem
from processor.core.model import LoadedRun, SignalKind, UnknownWorkflow
from processor.core.plans import Commit, Send
from processor.core.routing import TopicNames
from processor.core.run_ends import resume_failed
from processor.core.run_search import Cursor, RunFilter
from processor.core.run_state import NodeStatus, RunStatus
from processor.core.sagas import compensation_of, saga_ran
from processor.core.shapes import RunRef
from processor.core.workflow_def import SIGNAL_NAME
from processor.io.config.settings import Settings
from processor.io.postgres.outbox import delete_outbox
from processor.io.postgres.run_search import count_runs as _count_runs
from processor.io.postgres.run_search import search_runs as _search_runs
from processor.io.postgres.run_signals import Signal, record_live_signals, signal_targets
from processor.io.postgres.runs_admin import (
    insert_cancels,
    release_quarantine,
    restart_deadline,
    run_columns,
    run_tier,
)
from processor.io.postgres.store import Definitions, commit_batch, load_runs

# The most runs a bulk cancel or retry acts on at once, unless told more (`--max`): a filter
# that matches more than expected is refused, not carried out.
MAX_BULK_RUNS = 10_000


_BULK_PAGE = 500


# A retry that lost the race for the run's row this many times gives up (only another retry
# of the same run writes a failed run's row), after these waits.
_RETRY_RACE_WAITS_S = (0.0, 0.01, 0.05, 0.2)


_LIVE = (RunStatus.PENDING, RunStatus.RUNNING)


def cancel_runs(
    settings: Settings, wanted: RunFilter, dry_run: bool = False, max_runs: int = MAX_BULK_RUNS
) -> BulkAction:
    """Cancel every pending or running run ``wanted`` matches (one cancel signal each, under
    one signal id, and their wakeups): a run that ends meanwhile is left as it ended. ``dry_run``
    only finds them. ClientError for an empty filter (every run) or for more than
    ``max_runs`` matches (narrow the filter, or raise the bound)."""
    matched = bulk_matches(settings, wanted, _LIVE, max_runs)
    if dry_run or not matched:
        return BulkAction(tuple(id for id, _ in matched), ())
    signal_id = f"cancel-bulk-{uuid.uuid4().hex[:12]}"
    with connection(settings) as conn:
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
    matched = bulk_matches(settings, wanted, (RunStatus.FAILED,), max_runs)
    if dry_run or not matched:
        return BulkAction(tuple(id for id, _ in matched), ())
    topics = TopicNames(settings.topic_prefix)
    retried: list[RetriedRun] = []
    refused: list[tuple[str, str]] = []
    with connection(settings) as conn:
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


def bulk_matches(
    settings: Settings, wanted: RunFilter, statuses: tuple[RunStatus, ...], max_runs: int
) -> list[RunRef]:
    """(run id, tier) of the runs in ``statuses`` that ``wanted`` matches, newest first."""
    if wanted.empty:
        raise ClientError(
            "a bulk action needs a filter (--workflow, --status, --since, --until, --id-prefix,"
            " --tag or --step-failed): an empty one matches every run"
        )
    if wanted.matches_nothing(statuses):
        return []
    narrowed = wanted.within(statuses)
    with connection(settings) as conn:
        count = _count_runs(conn, narrowed)
        if count > max_runs:
            raise ClientError(
                f"the filter matches {count} runs, more than the bound of {max_runs}:"
                " narrow it, or raise the bound (--max)"
            )
        matched: list[RunRef] = []
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


def _wake_by_tier(settings: Settings, runs: Sequence[RunRef], reason: str) -> None:
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
    check_signal(run_id, signal_id, payload)
    with connection(settings) as conn:
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
    with connection(settings) as conn:
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
    with connection(settings) as conn:
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
        resumed = resume_failed(run.state, pending=run.wf.concurrency is not None)
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
                restart_deadline(conn, run_id)
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
    if saga_ran(run.state, run.wf):
        raise RetryRefused(
            f"run {run_id!r} ran its failure handler or compensations (compensation"
            f" {compensation_of(run.state, run.wf)}): a retry would go on from steps that"
            " were undone or a failure already handled; start a new run instead"
        )
    return run


def _tier_of(conn: psycopg.Connection[Any], run_id: str) -> str:
    """The run's wakeup tier (RunNotFound if there is no such run)."""
    tier = run_tier(conn, run_id)
    if tier is None:
        raise RunNotFound(f"no run with id {run_id!r}")
    return tier
