"""Waiting on a condition with a deadline: the tests' only way to wait (never a bare sleep)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from processor.tools.waiting import eventually


def wait_for(
    predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.05
) -> None:
    """Poll ``predicate`` until it holds; fail with ``what`` when the deadline passes."""
    if not eventually(predicate, timeout, interval):
        pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
