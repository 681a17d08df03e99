"""Waiting on a condition with a deadline: the tests' only way to wait (never a bare sleep)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` when the deadline passes."""
    deadline = time.monotonic() + timeout
    event = threading.Event()
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        event.wait(interval)  # a bounded wait between two checks of the condition
