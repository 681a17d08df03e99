"""One run per key (core/run_keys.py) on the real services: a workflow's ``concurrency`` of 1
per customer, its runs started at once, two processors deciding. Counted where users feel it
(the steps module records each execution's start and end, counted_steps.py): no two runs of
a customer ever live at once, another customer's runs are not held behind a long line,
every run ends succeeded with each step executed once; a run that fails or is cancelled
gives its key's slot to the next, and so does one the watchdog force-fails, at once; a
failed run retried waits for its key again; a worker or a processor killed (SIGKILL) while
runs hold slots loses none for good. Each fails with the start's admission bypassed (every
run started at once). And a limit's line lets the runs of several keys in by turns
(core/limit_line.py): the statements read it in that order, and a customer's two runs are
not held behind another's six (both fail with the line read first come, first served)."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime
from itertools import pairwise
from typing import Any

import hypothesis
import orjson
import psycopg
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from processor.client import inspect_run, send_signal, start_runs
from processor.core.limit_line import Waiter, line_order
from processor.core.model import LoadedRun
from processor.core.routing import TIERS
from processor.core.run_state import NodeState, NodeStatus, state_checksum
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres import limit_store
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.store import Definitions, load_runs
from processor.io.postgres.workflows import register_workflow
from processor.tools.waiting import eventually

from . import counted_steps
from .children import Spawned, run_ductor
from .runs import count_terminal, run_statuses, step_attempts
from .waiting import wait_for

pytestmark = pytest.mark.integration

APP = "tests.integration.counted_steps:registry"


def _keyed(
    pg: psycopg.Connection[Any],
    name: str,
    steps: int = 2,
    attempts: int = 1,
    timeout_ms: int = 60_000,
) -> str:
    """A workflow of ``steps`` counted steps in a line, at most one live run per customer."""
    raw: dict[str, Any] = {
        "name": name,
        "version": 1,
        "concurrency": {"limit": 1, "key": "customer"},
        "steps": [
            {
                "name": f"s{i}",
                "type": "counted",
                "depends_on": [f"s{i - 1}"] if i else [],
                "timeout_ms": timeout_ms,
                "retry": {"max_attempts": attempts, "backoff_ms": 50},
            }
            for i in range(steps)
        ],
    }
    counted_steps.install(pg)
    register_workflow(pg, parse_workflow(raw))
    return name


def _worker(spawn: Any, settings: Settings, label: str = "worker") -> Spawned:
    worker: Spawned = spawn(["worker", "--app", APP, "--concurrency", "8"], settings, label)
    every = len(TIERS) * settings.step_partitions
    wait_for(lambda: worker.owned_partitions() >= every, 60, "the worker to own its partitions")
    return worker


def _lives(pg: psycopg.Connection[Any], prefix: str) -> dict[str, tuple[datetime, datetime]]:
    """Each run's life as its executions show it: from its first execution's start to its
    last one's end (an execution killed with its worker, which never ended, left out)."""
    lives: dict[str, tuple[datetime, datetime]] = {}
    for run_id, _attempt, started, ended in counted_steps.intervals(pg, prefix):
        if ended is None:
            continue
        first, last = lives.get(run_id, (started, ended))
        lives[run_id] = (min(first, started), max(last, ended))
    return lives


def _overlaps(lives: dict[str, tuple[datetime, datetime]]) -> list[tuple[str, str]]:
    """The pairs of runs whose lives overlap."""
    ordered = sorted(lives.items(), key=lambda item: item[1])
    return [(a, b) for (a, (_, a_end)), (b, (b_start, _)) in pairwise(ordered) if b_start < a_end]


def _key(settings: Settings, run_id: str) -> dict[str, Any] | None:
    key: dict[str, Any] | None = inspect_run(settings, run_id).get("key")
    return key


def test_one_run_per_customer_under_two_processors_and_nobody_waits_behind_another(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    tag = uuid.uuid4().hex[:6]
    name = _keyed(pg, f"per-customer-{tag}")
    spawn(["process"], settings, "process-1")
    spawn(["process"], settings, "process-2")
    _worker(spawn, settings)
    a_runs = [f"{tag}-a-{i}" for i in range(6)]
    b_runs = [f"{tag}-b-{i}" for i in range(2)]
    start_runs(settings, name, a_runs, {"customer": "a", "sleep_ms": 250})
    start_runs(settings, name, b_runs, {"customer": "b", "sleep_ms": 250})
    last = a_runs[-1]
    seen: list[dict[str, Any]] = []

    def waits_in_line() -> bool:
        key = _key(settings, last)
        if key is not None and key["place"] is not None:
            seen.append(key)
        return bool(seen)

    wait_for(waits_in_line, 30, "the last run of customer a to wait for its key")
    # At most one live (none for a moment: an ending run gives the slot back before the next
    # in line is woken to take it).
    assert seen[0]["value"] == "a" and seen[0]["place"] >= 1 and seen[0]["live"] <= 1, seen[0]
    text = run_ductor(settings, "inspect", last).stdout
    assert "key        customer=a: " in text, text
    ids = a_runs + b_runs
    wait_for(lambda: count_terminal(pg, ids) == len(ids), 120, "every run to end")
    assert set(run_statuses(pg, ids).values()) == {"succeeded"}
    counts = counted_steps.executions(pg)
    assert all(counts[(r, f"s{i}", 1)] == 1 for r in ids for i in range(2))
    a_lives = _lives(pg, f"{tag}-a-")
    assert len(a_lives) == len(a_runs)
    assert _overlaps(a_lives) == [], "two runs of customer a were live at once"
    # Customer b's runs did not wait behind customer a's line: b's first began before a's
    # second had ended, and both of b's had ended before a's fifth began (a line shared by
    # both customers would have put them after all of a's).
    b_lives = _lives(pg, f"{tag}-b-")
    a_order = sorted(a_lives.values())
    assert min(start for start, _ in b_lives.values()) < a_order[1][1]
    assert max(end for _, end in b_lives.values()) < a_order[4][0]
    assert _overlaps(b_lives) == []
    assert pg.execute("SELECT count(*) FROM eec_limit_hold WHERE node = ''").fetchone() == (0,)
    assert pg.execute("SELECT count(*) FROM eec_limit_wait WHERE node = ''").fetchone() == (0,)
    assert _key(settings, last) is None  # ended: it neither holds nor waits


def test_a_run_that_is_cancelled_or_fails_gives_its_key_to_the_next(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    tag = uuid.uuid4().hex[:6]
    name = _keyed(pg, f"frees-{tag}", steps=1)
    spawn(["process"], settings, "process")
    _worker(spawn, settings)
    slow, failing, last = f"{tag}-slow", f"{tag}-failing", f"{tag}-last"
    # The slow one ignores its cancellation: its run's end, not its code's, frees the key. Its
    # step outlasts the starts and the look at the line below however loaded the machine is
    # (with 8 s, a loaded run saw it end by itself first, and the line move on).
    start_runs(settings, name, [slow], {"customer": "c", "sleep_ms": 20_000})
    wait_for(lambda: bool(counted_steps.executions(pg, slow)), 30, "the slow run to start")
    start_runs(settings, name, [failing], {"customer": "c", "fail_on": [1]})
    start_runs(settings, name, [last], {"customer": "c"})
    looks: list[dict[str, Any] | None] = []

    def second_in_line() -> bool:
        looks.append(_key(settings, last))
        return (looks[-1] or {}).get("place") == 2

    if not eventually(second_in_line, 30):
        statuses = run_statuses(pg, [slow, failing, last])
        pytest.fail(f"the last run never waited second in line: {looks[-1]}; {statuses}")
    assert run_statuses(pg, [failing, last]) == {failing: "pending", last: "pending"}
    send_signal(settings, slow)
    ids = [slow, failing, last]
    wait_for(lambda: count_terminal(pg, ids) == 3, 60, "every run to end")
    assert run_statuses(pg, ids) == {slow: "cancelled", failing: "failed", last: "succeeded"}
    runs = {r: (s, e) for r, _a, s, e in counted_steps.intervals(pg, tag)}
    # The failing run began while the cancelled one's code still ran; the last one only
    # after the failing one had ended.
    slow_end = runs[slow][1]  # (None: it still runs)
    assert slow_end is None or runs[failing][0] < slow_end
    assert runs[last][0] >= runs[failing][1]
    assert pg.execute("SELECT count(*) FROM eec_limit_hold WHERE node = ''").fetchone() == (0,)


def _stuck(pg: psycopg.Connection[Any], run_id: str) -> None:
    """Write the run as its first step in flight with no deadline, last moved an hour ago,
    no wakeup due: a run nothing can move, for the stuck sweep to force-fail."""
    run = load_runs(pg, Definitions(), [run_id])[run_id]
    assert isinstance(run, LoadedRun)
    nodes = run.state.node_map()
    nodes["s0"] = NodeState(NodeStatus.DISPATCHED, 1, None)
    state = run.state.with_nodes(nodes)
    pg.execute(
        "UPDATE eec_workflow_run SET node_states = %s, state_checksum = %s,"
        " next_wakeup_at = NULL, last_transition_at = now() - interval '1 hour'"
        " WHERE run_id = %s",
        (orjson.dumps(state.nodes_json()).decode(), state_checksum(state), run_id),
    )


def test_a_run_force_failed_as_stuck_lets_the_next_in_at_once(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """The watchdog force-fails the run holding the customer's slot: the run waiting for it is
    woken by that, not by its own look again two minutes later. No worker runs: the waiter's
    start (its first dispatch) is what is looked for."""
    tag = uuid.uuid4().hex[:6]
    name = _keyed(pg, f"stuck-{tag}", steps=1)
    processor_thread(replace(settings, sweep_grace_s=0.0, stuck_after_s=3.0))
    holder, waiter = f"{tag}-holder", f"{tag}-waiter"
    start_runs(settings, name, [holder], {"customer": "c"})
    wait_for(lambda: run_statuses(pg, [holder]) == {holder: "running"}, 30, "the holder to start")
    start_runs(settings, name, [waiter], {"customer": "c"})
    wait_for(lambda: (_key(settings, waiter) or {}).get("place") == 1, 30, "the waiter in line")
    _stuck(pg, holder)
    wait_for(lambda: run_statuses(pg, [holder]) == {holder: "failed"}, 30, "the stuck holder")
    # Its look again is two minutes after it joined the line.
    wait_for(lambda: run_statuses(pg, [waiter]) == {waiter: "running"}, 20, "the waiter let in")
    row = pg.execute("SELECT failure_reason FROM eec_workflow_run WHERE run_id = %s", (holder,))
    assert row.fetchone() == ("stuck",)


def test_a_killed_worker_and_processor_lose_no_key_slot(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    """The first run's step kills its worker (SIGKILL) while the run holds its key's slot;
    the processor is killed too, with the others waiting. Once both are back, the attempt
    that died is retried and every run of the key runs, one at a time."""
    tag = uuid.uuid4().hex[:6]
    name = _keyed(pg, f"killed-{tag}", steps=1, attempts=3, timeout_ms=3_000)
    processor = spawn(["process"], settings, "process-1")
    worker = _worker(spawn, settings, "worker-1")
    crasher = f"{tag}-0"
    others = [f"{tag}-{i}" for i in range(1, 4)]
    start_runs(settings, name, [crasher], {"customer": "k", "crash_on": [1]})
    wait_for(lambda: worker.proc.poll() is not None, 60, "the step to kill its worker")
    start_runs(settings, name, others, {"customer": "k", "sleep_ms": 100})
    wait_for(
        lambda: (_key(settings, others[-1]) or {}).get("place") == 3,
        30,
        "the others to wait in line",
    )
    processor.kill()
    spawn(["process"], settings, "process-2")
    _worker(spawn, settings, "worker-2")
    ids = [crasher, *others]
    wait_for(lambda: count_terminal(pg, ids) == len(ids), 120, "every run to end")
    assert set(run_statuses(pg, ids).values()) == {"succeeded"}
    lives = _lives(pg, tag + "-")
    assert set(lives) == set(ids)  # the crasher's second attempt too
    assert _overlaps(lives) == [], "two runs of the key were live at once"
    counts = counted_steps.executions(pg)
    # (The attempt its worker died in may run again: a process died; docs/guarantees.md.)
    assert all(counts[(r, "s0", 1)] == 1 for r in others)
    assert pg.execute("SELECT count(*) FROM eec_limit_hold WHERE node = ''").fetchone() == (0,)


def test_a_failed_run_retried_waits_for_its_key_again(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    """`ductor runs retry` of a failed run whose key another run holds now: the retried run
    waits in line (pending), and runs once that one ended. Before, it ran beside it."""
    tag = uuid.uuid4().hex[:6]
    name = _keyed(pg, f"retried-{tag}", steps=1)
    spawn(["process"], settings, "process")
    _worker(spawn, settings)
    failed, holder = f"{tag}-failed", f"{tag}-holder"
    start_runs(settings, name, [failed], {"customer": "r", "fail_on": [1]})
    wait_for(lambda: count_terminal(pg, [failed]) == 1, 30, "the first run to fail")
    start_runs(settings, name, [holder], {"customer": "r", "sleep_ms": 3_000})
    wait_for(lambda: bool(counted_steps.executions(pg, holder)), 30, "the holder to start")
    retried = run_ductor(settings, "runs", "retry", failed)
    assert retried.returncode == 0, retried.stderr
    wait_for(
        lambda: (_key(settings, failed) or {}).get("place") == 1,
        30,
        "the retried run to wait for its key",
    )
    assert run_statuses(pg, [failed]) == {failed: "pending"}
    wait_for(lambda: count_terminal(pg, [failed, holder]) == 2, 60, "both runs to end")
    assert run_statuses(pg, [failed, holder]) == {failed: "succeeded", holder: "succeeded"}
    runs = {(r, a): (s, e) for r, a, s, e in counted_steps.intervals(pg, tag)}
    assert runs[(failed, 2)][0] >= runs[(holder, 1)][1]  # only once the holder had ended


@hypothesis.settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.integers(0, 20), st.sampled_from(["", "a", "b"]), st.integers(0, 3)),
        max_size=16,
    ),
    st.integers(1, 6),
)
def test_the_statements_read_a_line_in_its_order(
    pg: psycopg.Connection[Any], waiters: list[tuple[int, str, int]], first: int
) -> None:
    """The load's view of a line and the waiters woken for freed slots follow
    core/limit_line.py (by round, then by age); a waiter whose run ended is passed over."""
    tag = uuid.uuid4().hex[:6]
    key = f"c/line-{tag}/"
    wf = parse_workflow(
        {"name": f"line-{tag}", "version": 1, "steps": [{"name": "s", "type": "s"}]}
    )
    register_workflow(pg, wf)
    line = [Waiter(s, f"{tag}-{i}", "s", k, r) for i, (s, k, r) in enumerate(waiters)]
    ended = Waiter(-1, f"{tag}-ended", "s", "a", 0)
    insert_runs(pg, wf, [(w.run_id, {}) for w in [*line, ended]], "t1")
    pg.execute("UPDATE eec_workflow_run SET status = 'failed' WHERE run_id = %s", (ended.run_id,))
    for w in [*line, ended]:
        pg.execute(
            "INSERT INTO eec_limit_wait (key, run_id, node, since_ms, tier, run_key, round)"
            " VALUES (%s, %s, %s, %s, 't1', %s, %s)",
            (key, w.run_id, w.node, w.since_ms, w.run_key, w.round),
        )
    expected = line_order(line)[:first]
    view = limit_store._views(pg, {key: first}, set())[0][key]
    assert [r for _, r, _ in view.queue] == [w.run_id for w in expected]
    woken = limit_store.waiters_to_wake(pg, Counter({key: first}))
    assert sorted(r for r, _ in woken) == sorted(w.run_id for w in expected)


def test_a_step_limit_lets_customers_in_by_turns_not_in_one_long_line(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Callable[..., Spawned]
) -> None:
    """A step limit of 1 with no key of its own, on a workflow whose runs have a key (the
    customer, 100 live runs each): customer a's six runs wait in the step's line before
    customer b's two arrive; b's join in the rounds being served and run right after a's
    first ones, not after all of a's. Before, the line was first come, first served: b's
    ran seventh and eighth."""
    tag = uuid.uuid4().hex[:6]
    name = f"turns-{tag}"
    counted_steps.install(pg)
    step = {
        "name": "s0",
        "type": "counted",
        "retry": {"max_attempts": 1},
        "concurrency": {"limit": 1, "name": f"turns-{tag}"},
    }
    raw = {"name": name, "version": 1, "concurrency": {"limit": 100, "key": "customer"}}
    register_workflow(pg, parse_workflow(raw | {"steps": [step]}))
    spawn(["process"], settings, "process")
    _worker(spawn, settings)
    a_runs = [f"{tag}-a-{i}" for i in range(6)]
    b_runs = [f"{tag}-b-{i}" for i in range(2)]
    start_runs(settings, name, a_runs, {"customer": "a", "sleep_ms": 300})

    def waiting() -> int:
        row = pg.execute(
            "SELECT count(*) FROM eec_limit_wait WHERE key = %s", (f"c/turns-{tag}/",)
        ).fetchone()
        return int(row[0]) if row else 0

    wait_for(lambda: waiting() >= 4, 30, "customer a's runs to wait in the step's line")
    start_runs(settings, name, b_runs, {"customer": "b", "sleep_ms": 300})
    ids = a_runs + b_runs
    wait_for(lambda: count_terminal(pg, ids) == len(ids), 120, "every run to end")
    assert set(run_statuses(pg, ids).values()) == {"succeeded"}
    assert all(step_attempts(pg, r) == {"s0": [(1, "succeeded")]} for r in ids)
    order = [r for r, _a, _s, _e in counted_steps.intervals(pg, tag)]
    assert len(order) == len(ids) and counted_steps.overlapping(pg, tag) == []
    places = sorted(order.index(r) for r in b_runs)
    # Before each of b's: a's running and a's first in line when b's joined, and one a
    # round: b's ran by the sixth execution at the latest (first come, first served: 8th).
    assert places[1] <= 5, order
