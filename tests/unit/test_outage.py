"""An outage is logged once when it starts and once when it ends, however many tries fail in
between, and the waits between tries follow the capped backoff."""

from __future__ import annotations

import logging

import pytest

from processor.core.backoff import retry_delay_s
from processor.io.runtime.outage import Outage


def test_one_line_per_start_and_end_and_the_backoff_between_tries(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("test.outage")
    outage = Outage("postgres", log)
    outage.ok()  # no outage: nothing to say
    with caplog.at_level(logging.INFO, logger="test.outage"):
        delays = [outage.failed(f"refused {n}") for n in range(8)]
        assert outage.active and outage.lasted_s >= 0
        outage.ok()
        outage.ok()
        assert outage.failed("again") == retry_delay_s(0)  # a new outage starts from the bottom
    assert delays == [retry_delay_s(n) for n in range(8)]
    assert [(r.levelname, r.__dict__["outage"]) for r in caplog.records] == [
        ("ERROR", "started"),
        ("INFO", "ended"),
        ("ERROR", "started"),
    ]
    assert caplog.records[0].__dict__["problem"] == "refused 0"
    assert caplog.records[1].__dict__["failures"] == 8
    assert outage.count == 2 and outage.active
