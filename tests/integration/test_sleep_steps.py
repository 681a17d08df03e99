"""Durable sleep and waits that continue on their timeout, on the real services: a run with a
sleep step ends succeeded no sooner than its sleep's time, the step after the sleep runs once;
a sleep until a time in the run's input ends at that time, one until no time fails its run
with the reason (the processor goes on); a processor SIGKILLed during a sleep and replaced
still ends the run at its time (the sleep is on the run's row, not in a process); a wait step
nobody answers that continues on its timeout ends its run succeeded with its default output.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from dataclasses import replace
from typing import Any

import psycopg
import pytest

from processor import StepContext, StepRegistry
from processor.client import start_runs
from processor.io.config.settings import Settings
from processor.tools.waiting import eventually

from .audit import assert_transitions_applied_once
from .instances import WorkerThread
from .runs import count_terminal, register_raw, run_statuses, start_by_cli
from .waiting import wait_for

pytestmark = pytest.mark.integration

SLEEP_MS = 1_500
KILLED_SLEEP_MS = 6_000  # long enough that the kill lands while every run sleeps


def _counting_registry(calls: Counter[str]) -> StepRegistry:
    registry = StepRegistry()
    lock = threading.Lock()

    @registry.step("sleep_first")
    def first(ctx: StepContext) -> dict[str, Any]:
        return {"at": ctx.run_id}

    @registry.step("sleep_after")
    def after(ctx: StepContext) -> dict[str, Any]:
        with lock:
            calls[ctx.run_id] += 1
        return {"deps": dict(ctx.deps)}

    return registry


def _db_now_ms(pg: psycopg.Connection[Any]) -> int:
    row = pg.execute("SELECT (extract(epoch FROM now()) * 1000)::bigint").fetchone()
    assert row is not None
    return int(row[0])


def _result(pg: psycopg.Connection[Any], run_id: str, node: str) -> tuple[Any, int]:
    """A step's output and when it was recorded (epoch ms, Postgres's clock)."""
    row = pg.execute(
        "SELECT output, (extract(epoch FROM recorded_at) * 1000)::bigint FROM eec_step_result"
        " WHERE run_id = %s AND node_id = %s AND outcome = 'succeeded'",
        (run_id, node),
    ).fetchone()
    assert row is not None, f"{run_id}: no result of {node}"
    return row[0], int(row[1])


def _ended(pg: psycopg.Connection[Any], run_id: str) -> tuple[str, Any, str | None, int]:
    row = pg.execute(
        "SELECT status, output, failure_reason, (extract(epoch FROM updated_at) * 1000)::bigint"
        " FROM eec_workflow_run WHERE run_id = %s",
        (run_id,),
    ).fetchone()
    assert row is not None
    return row[0], row[1], row[2], int(row[3])


def test_a_sleep_holds_its_run_for_its_time_and_what_follows_runs_once(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    tag = uuid.uuid4().hex[:6]
    nap = register_raw(
        pg,
        {
            "name": f"nap-{tag}",
            "version": 1,
            "steps": [
                {"name": "first", "type": "sleep_first"},
                {
                    "name": "pause",
                    "kind": "sleep",
                    "duration_ms": SLEEP_MS,
                    "depends_on": ["first"],
                },
                {"name": "after", "type": "sleep_after", "depends_on": ["pause"]},
            ],
            "output": {"slept": "pause", "after": "after"},
        },
    )
    until = register_raw(
        pg,
        {
            "name": f"until-{tag}",
            "version": 1,
            "steps": [
                {"name": "pause", "kind": "sleep", "until": "$.input.wake_at"},
                {"name": "after", "type": "sleep_after", "depends_on": ["pause"]},
            ],
        },
    )
    calls: Counter[str] = Counter()
    instance = processor_thread(settings)
    worker = WorkerThread(settings, _counting_registry(calls))
    try:
        naps = [f"nap-{i}-{tag}" for i in range(5)]
        for run_id in naps:
            start_by_cli(settings, nap, run_id)
        wake_at = _db_now_ms(pg) + SLEEP_MS
        start_by_cli(settings, until, f"at-ms-{tag}", f'{{"wake_at": {wake_at}}}')
        start_by_cli(settings, until, f"at-past-{tag}", '{"wake_at": "2001-01-01T00:00:00Z"}')
        start_by_cli(settings, until, f"at-bad-{tag}", '{"wake_at": "tomorrow"}')
        everyone = [*naps, f"at-ms-{tag}", f"at-past-{tag}", f"at-bad-{tag}"]
        wait_for(lambda: count_terminal(pg, everyone) == len(everyone), 90, "every run to end")
    finally:
        worker.stop()
    statuses = run_statuses(pg, everyone)
    assert statuses[f"at-bad-{tag}"] == "failed"
    _, _, reason, _ = _ended(pg, f"at-bad-{tag}")
    assert reason is not None and "until $.input.wake_at is 'tomorrow'" in reason, reason
    assert {r: s for r, s in statuses.items() if r != f"at-bad-{tag}"} == dict.fromkeys(
        [r for r in everyone if r != f"at-bad-{tag}"], "succeeded"
    )
    lateness = []
    for run_id in naps:
        _, first_done = _result(pg, run_id, "first")
        slept, _ = _result(pg, run_id, "pause")
        after, after_done = _result(pg, run_id, "after")
        _, output, _, ended = _ended(pg, run_id)
        # The sleep started once `first` succeeded, ended no sooner than its time, and only
        # then did `after` run (its dependency's output the sleep's).
        assert slept["slept_until_ms"] >= first_done + SLEEP_MS - 50  # (its tick's clock)
        assert after_done >= slept["slept_until_ms"] and ended >= slept["slept_until_ms"]
        assert ended - first_done >= SLEEP_MS - 50
        assert after == {"deps": {"pause": slept}}
        assert output == {"slept": slept, "after": after}
        lateness.append(after_done - slept["slept_until_ms"])
    slept, _ = _result(pg, f"at-ms-{tag}", "pause")
    assert slept == {"slept_until_ms": wake_at}
    assert _result(pg, f"at-ms-{tag}", "after")[1] >= wake_at
    assert _result(pg, f"at-past-{tag}", "pause")[0] == {"slept_until_ms": 978_307_200_000}
    # What follows a sleep ran once per run, and no transition was applied twice.
    assert calls == Counter({r: 1 for r in everyone if r != f"at-bad-{tag}"})
    assert_transitions_applied_once(pg)
    assert instance.alive and sum(instance.stats.errors.values()) == 0
    print(f"the step after a sleep started {sorted(lateness)} ms after its time")


def test_a_processor_killed_during_a_sleep_is_replaced_and_the_run_ends_at_its_time(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    pg = audit
    settings = replace(settings, sweep_grace_s=0.5)
    tag = uuid.uuid4().hex[:6]
    workflow = register_raw(
        pg,
        {
            "name": f"nap-kill-{tag}",
            "version": 1,
            "steps": [{"name": "pause", "kind": "sleep", "duration_ms": KILLED_SLEEP_MS}],
            "output": "pause",
        },
    )
    victim = spawn(["process"], settings, "victim")
    wait_for(lambda: victim.owned_partitions() > 0, 60, "the victim to own partitions")
    run_ids = [f"kill-nap-{i}-{tag}" for i in range(3)]
    # Started together (one producer, not a `ductor start` each): one at a time, under a
    # busy machine the first could sleep its time out before the last had started.
    start_runs(settings, workflow, run_ids)

    def pauses() -> dict[str, str | None]:
        rows = pg.execute(
            "SELECT run_id, node_states -> 'pause' ->> 'status' FROM eec_workflow_run"
            " WHERE run_id = ANY(%s)",
            (run_ids,),
        ).fetchall()
        return dict(rows)

    if not eventually(lambda: pauses() == dict.fromkeys(run_ids, "dispatched"), 60, 0.05):
        pytest.fail(f"timed out after 60 s waiting for every run to be asleep: {pauses()}")
    victim.kill()  # SIGKILL: its timers and offsets are where it left them
    replacement = spawn(["process"], settings, "replacement")
    wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 90, "every run to end")
    assert set(run_statuses(pg, run_ids).values()) == {"succeeded"}
    for run_id in run_ids:
        slept, recorded = _result(pg, run_id, "pause")
        _, output, _, ended = _ended(pg, run_id)
        assert output == slept and recorded >= slept["slept_until_ms"]
        assert ended >= slept["slept_until_ms"]  # never before its time
        print(f"{run_id} ended {ended - slept['slept_until_ms']} ms after its time")
    assert replacement.terminate() == 0
    assert_transitions_applied_once(pg)


def test_a_wait_that_continues_on_its_timeout_ends_its_run_with_its_default(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    tag = uuid.uuid4().hex[:6]
    gate = register_raw(
        pg,
        {
            "name": f"gate-{tag}",
            "version": 1,
            "steps": [
                {
                    "name": "ok",
                    "kind": "wait",
                    "signal": "ok",
                    "timeout_ms": 1_000,
                    "on_timeout": "continue",
                    "default": {"approved": False},
                },
                {"name": "after", "type": "sleep_after", "depends_on": ["ok"]},
                {
                    "name": "bare",
                    "kind": "wait",
                    "signal": "never",
                    "timeout_ms": 1_000,
                    "on_timeout": "continue",
                },
            ],
            "output": {"ok": "ok", "after": "after", "bare": "bare"},
        },
    )
    calls: Counter[str] = Counter()
    processor_thread(settings)
    worker = WorkerThread(settings, _counting_registry(calls))
    run_id = f"gate-{tag}"
    try:
        start_by_cli(settings, gate, run_id)
        wait_for(lambda: count_terminal(pg, [run_id]) == 1, 60, "the run to end")
    finally:
        worker.stop()
    status, output, reason, _ = _ended(pg, run_id)
    assert (status, reason) == ("succeeded", None)
    assert output == {
        "ok": {"approved": False},
        "after": {"deps": {"ok": {"approved": False}}},
        "bare": None,
    }
    assert calls == Counter({run_id: 1})
    assert_transitions_applied_once(pg)
