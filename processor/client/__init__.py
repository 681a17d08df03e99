"""A small Python client of Ductor: what a program (or the ``ductor`` command line) calls to
drive workflow runs from outside the processors: start runs, read and wait for their result,
list them, signal them, retry a failed one, move runs to other versions of their steps'
functions (``upgrade_run``). ``request_starts`` and ``request_signal`` start and
signal through Kafka alone, as any producer may (docs/requests.md).

Every function takes the typed ``Settings`` (``processor.io.config.load_settings()`` reads
them from the ``DUCTOR_*`` variables) and opens what it needs for the call. Results are frozen
dataclasses; failures are ``ClientError`` (a RuntimeError) or one of its subclasses, with a
one-sentence message.

The package's modules: errors.py and records.py (what the operations raise and return),
starts.py, reads.py, actions.py and upgrades.py (the operations), common.py (what they share),
kept.py (the connections and producers kept between calls). Every public name is importable
from here, ``from processor import client`` then ``client.start_run``, as the docs show; import
them from here, not from the modules, which may move.
"""

from __future__ import annotations

from processor.client.actions import (
    MAX_BULK_RUNS,
    cancel_runs,
    release_run,
    retry_run,
    retry_runs,
    send_signal,
)
from processor.client.common import connect, wake
from processor.client.errors import (
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
    UpgradeRefused,
)
from processor.client.reads import (
    MAX_LIST_LIMIT,
    count_runs,
    get_run,
    inspect_run,
    list_runs,
    parse_filter,
    result_document,
    search_runs,
    summary_document,
    wait_for_run,
)
from processor.client.records import BulkAction, RetriedRun, SignalSent, StartedRun
from processor.client.starts import IfExists, request_signal, request_starts, start_run, start_runs
from processor.client.upgrades import UpgradedRun, upgrade_run, upgrade_runs
from processor.core.run_search import Cursor, RunFilter
from processor.io.postgres.run_search import RunPage
from processor.io.postgres.runs_admin import RunResult, RunSummary

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
    "UpgradeRefused",
    "UpgradedRun",
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
    "upgrade_run",
    "upgrade_runs",
    "wait_for_run",
    "wake",
]
