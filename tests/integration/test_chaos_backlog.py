"""The chaos run's backlog phase (processor/tools/chaos_backlog.py) on the real services, on a
small scale: workers SIGKILLed and started again at once under a backlog of steps with a
1 s timeout and one attempt. No run fails for its time in a queue; a run may fail only for
an execution a kill cut short. (On the code that counted a timeout from the dispatch, most
runs failed with "attempt 1 timed out after 1000 ms", never started.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from processor.io.config.settings import Settings
from processor.tools.chaos_backlog import KILLED, QUEUE, BacklogPlan, run_backlog

pytestmark = pytest.mark.integration


def test_workers_killed_under_a_backlog_of_1s_steps_fail_no_run_for_queue_time(
    settings: Settings, pg: psycopg.Connection[Any], tmp_path: Path
) -> None:
    plan = BacklogPlan(runs=600, kills=3, finish_timeout_s=150.0, seed=1)
    report = run_backlog(settings, plan, tmp_path, f"{settings.topic_prefix}-backlog-")
    print("\n".join(report.lines()))
    assert report.ok, report.problems
    assert report.kinds[QUEUE] == 0
    assert report.kinds["succeeded"] + report.kinds[KILLED] == plan.runs
    assert report.kills >= 1  # (fewer than 3 when the steps were all claimed before)
    assert report.waited_longer > 0  # forced: steps waited longer than their timeout
