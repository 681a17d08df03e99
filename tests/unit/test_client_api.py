"""The client's public names (docs/usage.md#the-python-client) stay importable where the docs
show them, ``from processor import client`` then ``client.X`` or ``from processor.client
import X``, whichever module of processor/client/ defines them."""

from __future__ import annotations

import importlib

import pytest

from processor import client

PUBLIC = [
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


def test_the_public_names_are_pinned() -> None:
    assert client.__all__ == PUBLIC


@pytest.mark.parametrize("name", PUBLIC)
def test_each_public_name_is_importable_from_the_package(name: str) -> None:
    value = getattr(client, name)
    namespace: dict[str, object] = {}
    exec(f"from processor.client import {name}", namespace)
    assert namespace[name] is value
    home = getattr(value, "__module__", None)
    if home is not None and home.startswith("processor.client."):
        assert getattr(importlib.import_module(home), name) is value
