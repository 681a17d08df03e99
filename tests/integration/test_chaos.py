"""The short chaos run (`make chaos` is the long one): processors and workers SIGKILLed at
random times, processors killed right after a commit, the broker killed and restarted on its
data, Postgres restarted in immediate mode and frozen for a few seconds, every start wakeup
delivered three times; every run succeeds and the audit trail shows nothing applied twice
(processor/tools/chaos.py says what is checked)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from processor.io.config.settings import Settings
from processor.tools.chaos_fleet import KILL_AFTER_COMMIT
from processor.tools.chaos_plan import SHORT
from processor.tools.chaos_run import run_chaos

from .restarts import LocalInfra

pytestmark = pytest.mark.integration


def test_a_short_chaos_run_loses_nothing_and_applies_nothing_twice(
    settings: Settings, local_infra: LocalInfra, tmp_path: Path
) -> None:
    report = run_chaos(settings, replace(SHORT, seed=7), local_infra, tmp_path)
    print("\n".join(report.lines()))
    assert report.ok, "\n".join(report.problems)
    assert sum(report.kills.values()) >= SHORT.kills
    assert report.kills[KILL_AFTER_COMMIT] >= 1, "no processor was killed right after a commit"
    assert report.outcomes == {("succeeded", None): SHORT.runs}
