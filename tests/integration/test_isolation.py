"""Every exception is isolated where it happens, never at a loop, on the real broker and
database (docs/guarantees.md#isolation).

A fault point raises a plain ``Exception`` for one chosen run (io/runtime/faults.py, ``raise:``) in
each stage: the request statement and each request's plan, the processor's intake of a record,
a run's tick and its plan, the carrying out of a plan, a trigger's record, a sweep's item, and
a worker's task (taken in, claimed, recorded). The chosen item is isolated (its dead letter,
its quarantine, its failed attempt), its neighbours end, and no process exits. Then the bug as
it was reported, black box: a start and a signal nested 300 levels written to the requests
topic among neighbours, and a run row whose input is nested 254 levels (the step task would
hold it one level deeper than orjson writes). Last, a watched thread that dies makes the
health endpoints unhealthy.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest

from processor.client import start_runs
from processor.core.envelope import Wakeup
from processor.core.requests import SignalRequest, StartRequest
from processor.core.routing import TopicNames, partition_for
from processor.core.triggers import parse_trigger
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import DeadLetter, read_dead_letters
from processor.io.postgres.runs_admin import insert_runs, run_columns
from processor.io.postgres.trigger_store import create_trigger
from processor.io.runtime.faults import Faults

from .children import Spawned, still_running
from .instances import ProcessorThread
from .kcat import kcat_produce_many
from .runs import count_terminal, run_statuses
from .samples import produce_wakeups, sample_workflow
from .scrape import free_port
from .test_triggers import _team_topic
from .waiting import wait_for

pytestmark = pytest.mark.integration

Spawn = Callable[..., Spawned]


def _requests(settings: Settings, records: Sequence[tuple[str, bytes]]) -> None:
    """(run id, value) records written to the requests topic with kcat, keyed by run id, each
    on its run's partition, in order per partition."""
    by_partition: dict[int, list[tuple[bytes | None, bytes | None]]] = defaultdict(list)
    for run_id, value in records:
        partition = partition_for(run_id, settings.wakeup_partitions)
        by_partition[partition].append((run_id.encode(), value))
    topic = TopicNames(settings.topic_prefix).requests
    for partition, batch in sorted(by_partition.items()):
        kcat_produce_many(settings, topic, partition, batch)


def _start(run_id: str) -> tuple[str, bytes]:
    return run_id, StartRequest(run_id, "sample", input={"n": 1}).encode()


def _letters(settings: Settings) -> dict[str, list[DeadLetter]]:
    """The dead letters by the run id of their key (a wakeup's key is ``run_id:requeue_seq``)."""
    found: dict[str, list[DeadLetter]] = defaultdict(list)
    for letter in read_dead_letters(settings):
        found[(letter.key or b"").decode().split(":")[0]].append(letter)
    return found


def _isolated_lines(child: Spawned) -> list[dict[str, Any]]:
    return [
        line
        for line in child.log_lines()
        if "stage" in line and "an unexpected exception, isolated" in str(line.get("msg"))
    ]


def _quarantined(pg: psycopg.Connection[Any], run_id: str) -> str | None:
    columns = run_columns(pg, run_id)
    assert columns is not None, f"no run {run_id}"
    return columns.quarantine_reason if columns.quarantined_at is not None else None


def test_an_exception_in_each_processor_stage_is_its_items_alone(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Spawn
) -> None:
    """One run chosen per stage of a `ductor process` child; 50 runs and 10 requests beside
    them end, each chosen one is dead-lettered (and quarantined when its row is at fault),
    and the processor never exits."""
    tag = uuid.uuid4().hex[:6]
    chosen = {
        stage: f"iso-{stage}-{tag}"
        for stage in ("intake", "request", "request_plan", "tick", "decide", "produce")
    }
    faults = ",".join(f"{stage}=raise:{run_id}" for stage, run_id in chosen.items())
    processor = spawn(["process"], replace(settings, test_faults=faults), "process")
    worker = spawn(["worker"], settings, "worker")
    neighbours = [f"iso-n{i}-{tag}" for i in range(50)]
    started = [*neighbours, chosen["intake"], chosen["tick"], chosen["decide"], chosen["produce"]]
    start_runs(settings, "sample", started)
    requested = [f"iso-r{i}-{tag}" for i in range(10)]
    bad = [_start(chosen["request"]), _start(chosen["request_plan"])]
    _requests(settings, [*map(_start, requested[:5]), *bad, *map(_start, requested[5:])])
    ended = [*neighbours, *requested]
    wait_for(
        lambda: still_running(processor, worker) and count_terminal(pg, ended) == len(ended),
        120,
        "every neighbour to end",
    )
    assert set(run_statuses(pg, ended).values()) == {"succeeded"}
    wait_for(
        lambda: all(_letters(settings)[run_id] for run_id in chosen.values()),
        60,
        "a dead letter of each chosen run",
    )
    letters = _letters(settings)
    for stage, run_id in chosen.items():
        assert {d.reason for d in letters[run_id]} == {"unexpected_error"}, stage
        assert f"injected fault at {stage} for {run_id}" in letters[run_id][0].detail, stage
    # The request's statement was isolated: its one record is one dead letter, its run never
    # made; the request whose plan raised made its run (the statement had committed).
    assert len(letters[chosen["request"]]) == 1 and len(letters[chosen["request_plan"]]) == 1
    assert chosen["request"] not in run_statuses(pg, [chosen["request"]])
    # A run whose tick or plan raised is quarantined: the sweeps stop waking it.
    for stage in ("tick", "decide"):
        assert "unexpected_error" in (_quarantined(pg, chosen[stage]) or ""), stage
    assert _quarantined(pg, chosen["intake"]) is None
    stages = {(line["stage"], line.get("item")) for line in _isolated_lines(processor)}
    for stage in ("request", "tick", "intake"):
        assert any(s == stage for s, _ in stages), (stage, stages)
    assert ("tick", chosen["tick"]) in stages and ("produce", chosen["produce"]) in stages
    assert ("request", chosen["request"]) in stages and ("tick", chosen["decide"]) in stages
    assert still_running(processor, worker)
    assert processor.terminate() == 0
    final = processor.final_stats()
    assert {"intake", "request", "tick", "produce"} <= set(final["isolated"]), final
    assert final["dead_letters"]["unexpected_error"] >= len(chosen)


def test_an_exception_in_each_worker_stage_is_its_tasks_alone(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Spawn
) -> None:
    """One run chosen per stage of a `ductor worker` child: the task taken in is dead-
    lettered, the claimed one fails its attempt saying why, the one whose result cannot be
    recorded is dropped; 30 runs beside them end and the worker never exits."""
    tag = uuid.uuid4().hex[:6]
    chosen = {
        stage: f"iso-{stage}-{tag}" for stage in ("task_intake", "task_claimed", "task_record")
    }
    faults = ",".join(f"{stage}=raise:{run_id}" for stage, run_id in chosen.items())
    processor = spawn(["process"], settings, "process")
    worker = spawn(["worker"], replace(settings, test_faults=faults), "worker")
    neighbours = [f"iso-w{i}-{tag}" for i in range(30)]
    start_runs(settings, "sample", [*neighbours, *chosen.values()])
    wait_for(
        lambda: (
            still_running(processor, worker)
            and count_terminal(pg, [*neighbours, chosen["task_claimed"]]) == len(neighbours) + 1
        ),
        120,
        "every neighbour and the run whose claim raised to end",
    )
    assert set(run_statuses(pg, neighbours).values()) == {"succeeded"}
    # Its first step's attempt failed, saying why (fetch has one attempt: the run failed).
    assert run_statuses(pg, [chosen["task_claimed"]]) == {chosen["task_claimed"]: "failed"}
    failed = pg.execute(
        "SELECT error FROM eec_step_result WHERE run_id = %s", (chosen["task_claimed"],)
    ).fetchall()
    assert any("the worker failed handling it" in (e or "") for (e,) in failed), failed
    wait_for(lambda: bool(_letters(settings)[chosen["task_intake"]]), 30, "its dead letter")
    (letter,) = _letters(settings)[chosen["task_intake"]]
    assert letter.reason == "unexpected_error" and "injected fault at task_intake" in letter.detail
    wait_for(
        lambda: any(line.get("stage") == "record" for line in _isolated_lines(worker)),
        30,
        "the result that could not be recorded to be isolated",
    )
    assert still_running(processor, worker)
    assert worker.terminate() == 0
    (stopped,) = [line for line in worker.log_lines() if line.get("msg") == "worker stopped"]
    assert {"intake", "claimed", "record"} <= set(stopped["isolated"]), stopped


def test_a_trigger_record_and_a_sweep_item_that_raise_are_theirs_alone(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """In process: a trigger's record whose mapping raises is one dead letter while the
    other records start their runs; a stuck run whose settling raises is left (logged) while
    the sweep settles the other stuck run; the processor goes on."""
    tag = uuid.uuid4().hex[:6]
    topic = _team_topic(settings, f"orders-{tag}")
    trigger = parse_trigger(
        f"orders-{tag}",
        {
            "trigger_version": 1,
            "topic": topic,
            "action": "start",
            "workflow": "sample",
            "run_id": "$.order_id",
            "run_id_prefix": f"ord-{tag}-",
        },
    )
    create_trigger(pg, trigger, {})
    # Two runs made stuck by hand: no wakeup due, no transition for an hour.
    stuck = [f"stuck-bad-{tag}", f"stuck-ok-{tag}"]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in stuck], "t1")
    pg.execute(
        "UPDATE eec_workflow_run SET next_wakeup_at = NULL,"
        " last_transition_at = now() - interval '1 hour' WHERE run_id = ANY(%s)",
        (stuck,),
    )
    bad_order = f"ord-{tag}-bad"
    faults = Faults.from_spec(f"trigger=raise:{bad_order},sweep=raise:{stuck[0]}")
    instance: ProcessorThread = processor_thread(
        replace(settings, stuck_after_s=5, trigger_refresh_s=0.5), faults=faults
    )
    orders = [f"{i}" for i in range(8)]
    records = [(b"k", orjson.dumps({"order_id": o})) for o in [*orders[:4], "bad", *orders[4:]]]
    kcat_produce_many(settings, topic, 0, records)
    made = [f"ord-{tag}-{o}" for o in orders]
    wait_for(lambda: len(run_statuses(pg, made)) == len(made), 60, "the orders' runs")
    wait_for(lambda: bool(read_dead_letters(settings)), 30, "the bad order's dead letter")
    (letter,) = read_dead_letters(settings)
    assert letter.reason == "unexpected_error" and letter.source_topic == topic
    assert letter.value == orjson.dumps({"order_id": "bad"}) and bad_order in letter.detail
    assert run_statuses(pg, [bad_order]) == {}
    # The stuck run beside the chosen one is settled (woken: it can move, or failed).
    wait_for(
        lambda: (
            run_statuses(pg, [stuck[1]])[stuck[1]] != "pending"
            or (run_columns(pg, stuck[1]) or _no_run()).next_wakeup_at is not None
            or instance.stats.force_fails["stuck"] > 0
        ),
        60,
        "the other stuck run to be settled",
    )
    wait_for(lambda: instance.stats.isolated["sweep"] >= 1, 30, "the sweep item to be isolated")
    assert instance.stats.isolated["trigger"] == 1
    assert run_statuses(pg, [stuck[0]]) == {stuck[0]: "pending"}  # left as it was
    assert instance.alive


def _no_run() -> Any:
    raise AssertionError("the run is gone")


# -- the bug as reported, black box ---------------------------------------------------------

# A JSON array nested this deep: orjson reads 1,024 levels but writes 254.
_LEVELS = 300


def _nested(levels: int) -> bytes:
    return b"[" * levels + b"1" + b"]" * levels


def test_a_start_and_a_signal_nested_300_levels_are_one_dead_letter_each(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Spawn
) -> None:
    """Written with kcat among 40 starts: no processor exits, the neighbours end, and each bad
    record is one dead letter (``unexpected_error`` where nothing refuses it first;
    ``out_of_bounds`` where the doors' bounds do), with no run made for the deep start."""
    tag = uuid.uuid4().hex[:6]
    processor = spawn(["process"], settings, "process")
    worker = spawn(["worker"], settings, "worker")
    neighbours = [f"deep-n{i}-{tag}" for i in range(40)]
    deep_start = f"deep-start-{tag}"
    start = StartRequest(deep_start, "sample", input="DEEP").encode()
    start = start.replace(b'"DEEP"', b'{"x":' + _nested(_LEVELS) + b"}")
    # A signal to a neighbour, in the same statement as its start: the neighbour still ends.
    signal = SignalRequest(neighbours[20], "note", f"sig-{tag}", payload="DEEP").encode()
    signal = signal.replace(b'"DEEP"', b'{"x":' + _nested(_LEVELS) + b"}")
    records = [_start(r) for r in neighbours]
    records.insert(21, (neighbours[20], signal))  # right after its run's start
    records.insert(10, (deep_start, start))
    _requests(settings, records)
    wait_for(
        lambda: (
            still_running(processor, worker) and count_terminal(pg, neighbours) == len(neighbours)
        ),
        120,
        "every neighbour to end",
    )
    assert set(run_statuses(pg, neighbours).values()) == {"succeeded"}
    wait_for(lambda: len(read_dead_letters(settings)) >= 2, 30, "the two dead letters")
    letters = read_dead_letters(settings)
    assert sorted((d.key or b"").decode() for d in letters) == sorted([deep_start, neighbours[20]])
    assert {d.reason for d in letters} <= {"unexpected_error", "out_of_bounds"}, letters
    assert {d.value for d in letters} == {start, signal}  # the records' own bytes
    assert run_statuses(pg, [deep_start]) == {}
    assert still_running(processor, worker)
    assert processor.terminate() == 0 and worker.terminate() == 0


def test_a_run_row_whose_input_is_nested_254_levels_is_quarantined_not_a_crash_loop(
    settings: Settings, pg: psycopg.Connection[Any], spawn: Spawn
) -> None:
    """A row as `ductor start` stored it (written here with SQL, past every door): its step
    task would nest the input one level deeper than orjson writes. Its first tick is
    isolated from the 30 runs batched with it: one dead letter, the run quarantined (the
    sweeps stop waking it), the neighbours end, and the processor never exits."""
    tag = uuid.uuid4().hex[:6]
    deep = f"deep-row-{tag}"
    neighbours = [f"row-n{i}-{tag}" for i in range(30)]
    run_ids = [*neighbours[:15], deep, *neighbours[15:]]
    insert_runs(pg, sample_workflow(), [(r, {}) for r in run_ids], "t1")
    pg.execute(
        "UPDATE eec_workflow_run SET input = %s::jsonb WHERE run_id = %s",
        (_nested(254).decode(), deep),
    )
    # One partition, produced before the processor starts: they come in one batch.
    topic = TopicNames(settings.topic_prefix).wakeup("t1")
    produce_wakeups(settings, [(topic, Wakeup(r, "start"), 0) for r in run_ids])
    processor = spawn(["process"], replace(settings, batch_linger_ms=1000), "process")
    worker = spawn(["worker"], settings, "worker")
    wait_for(
        lambda: (
            still_running(processor, worker) and count_terminal(pg, neighbours) == len(neighbours)
        ),
        120,
        "every neighbour to end",
    )
    assert set(run_statuses(pg, neighbours).values()) == {"succeeded"}
    wait_for(lambda: _quarantined(pg, deep) is not None, 30, "the deep run's quarantine")
    assert "unexpected_error" in (_quarantined(pg, deep) or "")
    assert run_statuses(pg, [deep]) == {deep: "pending"}  # never written
    # (A sweep may have woken it too before its first tick: a letter per wakeup until then.)
    letters = _letters(settings)[deep]
    assert letters and {d.reason for d in letters} == {"unexpected_error"}
    assert "TypeError" in letters[0].detail
    assert still_running(processor, worker)
    assert processor.terminate() == 0
    assert set(processor.final_stats()["isolated"]) == {"tick"}


# -- a thread that dies ---------------------------------------------------------------------


def _health(port: int, path: str) -> tuple[int, dict[str, Any]]:
    """The answer, or (0, {}) while nothing listens yet."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())
    except urllib.error.URLError:
        return 0, {}


def test_a_thread_that_dies_makes_the_health_endpoints_unhealthy(
    settings: Settings, spawn: Spawn
) -> None:
    """The request statement's thread of a `ductor process` child, the results lane of a
    `ductor worker` child, each ended by the ``thread`` fault point: both say so in their
    log and on /healthz and /readyz (503), and neither exits by itself."""
    ports = {"process": free_port(), "worker": free_port()}
    processor = spawn(
        ["process"],
        replace(settings, health_port=ports["process"], test_faults="thread=raise:ductor-requests"),
        "process",
    )
    worker = spawn(
        ["worker"],
        replace(settings, health_port=ports["worker"], test_faults="thread=raise:worker-results"),
        "worker",
    )
    # The request thread starts with the first request.
    _requests(settings, [_start(f"thread-{uuid.uuid4().hex[:6]}")])
    dead = {"process": "ductor-requests", "worker": "worker-results"}
    for child, port in ports.items():

        def unhealthy(port: int = port) -> bool:
            return still_running(processor, worker) and _health(port, "/healthz")[0] == 503

        wait_for(unhealthy, 60, f"the {child}'s /healthz to say a thread died")
        status, body = _health(port, "/healthz")
        assert body["status"] == "broken"
        assert any(f"thread {dead[child]} died" in p for p in body["problems"]), body
        status, body = _health(port, "/readyz")
        assert status == 503 and any(f"thread {dead[child]} died" in p for p in body["problems"])
    for spawned, name in ((processor, dead["process"]), (worker, dead["worker"])):
        assert any(
            line.get("dead_thread") == name and line.get("level") == "CRITICAL"
            for line in spawned.log_lines()
        ), name
    assert still_running(processor, worker)
