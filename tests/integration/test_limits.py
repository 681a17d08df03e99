"""Limits at dispatch on the real services, with two processors contending for the same
counters: a concurrency limit per customer holds exactly (never more of a customer's steps
running at once than its limit, the limit reached) and starves nobody (every run ends, each
step once); a rate limit spaces the dispatches exactly (read from the attempts' own
deadlines: the coordinator's clock); and nothing is left counted or waiting afterwards."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import psycopg
import pytest

from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow
from processor.worker import StepContext, StepRegistry

from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

LIMIT = 3


class _Running:
    """Steps running now, per customer, and the most seen at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now: Counter[str] = Counter()
        self.most: Counter[str] = Counter()
        self.executions: Counter[str] = Counter()

    def run(self, customer: str, run_id: str) -> None:
        with self.lock:
            self.now[customer] += 1
            self.most[customer] = max(self.most[customer], self.now[customer])
            self.executions[run_id] += 1
        threading.Event().wait(0.15)  # the step's work (a bounded wait, not a poll)
        with self.lock:
            self.now[customer] -= 1


def test_a_concurrency_limit_holds_exactly_under_two_processors_and_nobody_starves(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    wf = parse_workflow(
        {
            "name": "limited",
            "version": 1,
            "steps": [
                {"name": "prepare", "type": "prepare"},
                {
                    "name": "charge",
                    "type": "charge",
                    "depends_on": ["prepare"],
                    "retry": {"max_attempts": 1},
                    "concurrency": {"limit": LIMIT, "key": "customer"},
                },
            ],
        }
    )
    register_workflow(pg, wf)
    running = _Running()
    registry = StepRegistry()
    registry.step("prepare")(lambda ctx: None)

    @registry.step("charge")
    def charge(ctx: StepContext) -> None:
        running.run(ctx.input["customer"], ctx.run_id)

    runs = [(f"a-{i}", {"customer": "a"}) for i in range(24)]
    runs += [(f"b-{i}", {"customer": "b"}) for i in range(8)]
    insert_runs(pg, wf, runs, "t1")
    ids = [r for r, _ in runs]
    # A full line of waiters ahead of everyone whose runs are gone (a row deleted by hand,
    # say): were they not passed over, customer a's runs would wait forever behind them.
    pg.execute(
        "INSERT INTO eec_limit_wait (key, run_id, node, since_ms, tier)"
        " SELECT 'c/charge/a', 'gone-' || i, 'charge', i, 't1' FROM generate_series(1, %s) i",
        (LIMIT,),
    )
    first, second = processor_thread(settings), processor_thread(settings)
    worker = WorkerThread(settings, registry, threads=16)
    try:
        wait_for(lambda: count_terminal(pg, ids) == len(ids), 120, "every run to end")
    finally:
        worker.stop()
    assert first.alive and second.alive
    assert set(run_statuses(pg, ids).values()) == {"succeeded"}
    assert running.executions == Counter(dict.fromkeys(ids, 1))  # each charge once
    assert running.most["a"] == LIMIT  # the limit held, and was used
    assert running.most["b"] <= LIMIT
    # Nothing left holding a slot or waiting for one.
    assert pg.execute("SELECT count(*) FROM eec_limit_hold").fetchone() == (0,)
    waiting = pg.execute("SELECT run_id FROM eec_limit_wait ORDER BY run_id").fetchall()
    assert waiting == [(f"gone-{i}",) for i in range(1, LIMIT + 1)]  # only the ghosts
    refused = first.stats.limit_refused["charge"] + second.stats.limit_refused["charge"]
    let_in = first.stats.limit_let_in["charge"] + second.stats.limit_let_in["charge"]
    assert refused > 0 and let_in > 0  # some waited, and were let in


def test_a_rate_limit_spaces_dispatches_by_the_coordinators_clock(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    per_ms, limit, timeout_ms = 1_000, 2, 30_000
    wf = parse_workflow(
        {
            "name": "rated",
            "version": 2,
            "steps": [
                {
                    "name": "call",
                    "type": "call_api",
                    "timeout_ms": timeout_ms,
                    # The whole step bounded by its timeout from its dispatch: its deadline
                    # (its start plus its timeout, at most this) says when it was dispatched.
                    "schedule_to_close_ms": timeout_ms,
                    "rate_limit": {"limit": limit, "per_s": per_ms / 1000},
                }
            ],
        }
    )
    register_workflow(pg, wf)
    dispatched: list[int] = []
    seen: list[tuple[int, int, str]] = []  # (dispatched, started on the worker's clock, run)
    registry = StepRegistry()

    @registry.step("call_api")
    def call_api(ctx: StepContext) -> None:
        at = ctx.deadline_ms - timeout_ms  # when the coordinator dispatched it
        dispatched.append(at)
        seen.append((at, int(time.time() * 1000), ctx.run_id))

    ids = [f"rate-{i}" for i in range(7)]
    insert_runs(pg, wf, [(r, {}) for r in ids], "t1")
    processor_thread(settings)
    processor_thread(settings)
    started = time.monotonic()
    worker = WorkerThread(settings, registry, threads=8)
    try:
        wait_for(lambda: count_terminal(pg, ids) == len(ids), 60, "every run to end")
    finally:
        worker.stop()
    assert set(run_statuses(pg, ids).values()) == {"succeeded"}
    times = sorted(dispatched)
    assert len(times) == len(ids)
    # At most `limit` dispatches in any window of per_ms: the (i + limit)-th is a window later.
    gaps = [times[i + limit] - times[i] for i in range(len(times) - limit)]
    # (On failure: each dispatch with its start on the worker and its run, from the first.)
    assert all(gap >= per_ms for gap in gaps), (
        gaps,
        [(t - times[0], s - times[0], r) for t, s, r in sorted(seen)],
    )
    assert time.monotonic() - started >= (len(ids) // limit - 1) * per_ms / 1000
