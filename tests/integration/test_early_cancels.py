"""A cancel that comes early is never lost (docs/requests.md, "A signal may come before its
start"). The docs' own example: orders and their cancellations come from two team topics with
a trigger each, and a cancel may be read long before its order. Cancels written 15 s before
their orders, with a 10 s window for the other kept signals (``DUCTOR_KEPT_SIGNAL_TTL_S``):
every such run ends cancelled and none of them executes a step (counted by the step function
itself), through a trigger and through the requests topic alike; an order without a cancel
runs as usual. ``ductor gc`` deletes the cancels kept longer than its retention."""

from __future__ import annotations

import uuid
from dataclasses import replace
from datetime import datetime
from typing import Any

import orjson
import psycopg
import pytest

from processor.client import request_signal, request_starts
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow

from . import counted_steps
from .children import run_ductor
from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .test_requests_intake import _kept
from .test_triggers import _create, _events, _team_topic
from .waiting import wait_for

pytestmark = pytest.mark.integration

WINDOW_S = 10.0  # the kept signals' time to live in this test
EARLY_S = 15.0  # how long before their orders the cancels are written

NAME = f"early-{uuid.uuid4().hex[:8]}"
WORKFLOW = {
    "name": NAME,
    "version": 1,
    "steps": [
        {"name": "reserve", "type": "counted", "timeout_ms": 10000},
        {"name": "ship", "type": "counted", "depends_on": ["reserve"], "timeout_ms": 10000},
    ],
}


@pytest.fixture(autouse=True)
def _workflow(pg: psycopg.Connection[Any]) -> None:
    register_workflow(pg, parse_workflow(WORKFLOW))
    counted_steps.install(pg)


def _db_now(pg: psycopg.Connection[Any]) -> datetime:
    row = pg.execute("SELECT now()").fetchone()
    assert row is not None
    moment: datetime = row[0]
    return moment


def _seconds_since(pg: psycopg.Connection[Any], moment: datetime) -> float:
    row = pg.execute("SELECT extract(epoch FROM now() - %s)", (moment,)).fetchone()
    assert row is not None
    return float(row[0])


def test_cancels_written_long_before_their_orders_keep_those_runs_from_running(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    settings = replace(settings, kept_signal_ttl_s=WINDOW_S, trigger_refresh_s=0.5)
    orders = _team_topic(settings, "orders")
    cancels = _team_topic(settings, "cancels")
    name = NAME
    _create(
        settings, "orders-in", "--topic", orders, "--workflow", name,
        "--run-id", "$.order_id", "--run-id-prefix", "order-",
    )  # fmt: skip
    _create(
        settings, "cancels-in", "--topic", cancels, "--signal", "cancel",
        "--run-id", "$.order_id", "--run-id-prefix", "order-",
    )  # fmt: skip
    instance = processor_thread(settings)
    worker = WorkerThread(settings, counted_steps.registry)  # a run that starts runs at once
    try:
        wait_for(
            lambda: instance.processor.triggers.by_topic.keys() == {orders, cancels},
            30,
            "the instance to follow both triggers",
        )
        cancelled = [f"order-{n}" for n in range(1, 6)]
        _events(settings, cancels, 0, [{"order_id": n} for n in range(1, 4)])
        _events(settings, cancels, 1, [{"order_id": n} for n in range(4, 6)])
        request_signal(settings, "order-r1", signal_id="early-r1")  # the requests topic too
        cancelled.append("order-r1")
        wait_for(lambda: _kept(pg) == sorted(cancelled), 30, "the early cancels to be kept")
        written = _db_now(pg)
        # The window passes, and more: a cancel that expired with it would be dead-lettered
        # by now (the sweep runs every 0.5 s), and its order would then run.
        wait_for(
            lambda: _seconds_since(pg, written) >= EARLY_S,
            EARLY_S + 30,
            f"{EARLY_S:.0f} s to pass on the database's clock",
            interval=0.5,
        )
        _events(settings, orders, 0, [{"order_id": n, "items": [n]} for n in (1, 2, 3, 6)])
        _events(settings, orders, 1, [{"order_id": n, "items": [n]} for n in (4, 5)])
        request_starts(settings, name, ["order-r1"], {"items": ["r1"]})
        every = [*cancelled, "order-6"]
        wait_for(lambda: count_terminal(pg, every) == len(every), 90, "every run to end")
    finally:
        worker.stop()
    statuses = run_statuses(pg, every)
    assert statuses.pop("order-6") == "succeeded"
    assert set(statuses.values()) == {"cancelled"}, statuses
    executions = counted_steps.executions(pg)
    ran = {run_id for run_id, _node, _attempt in executions}
    assert ran == {"order-6"}, f"runs cancelled before their start executed steps: {ran}"
    assert executions == {("order-6", "reserve", 1): 1, ("order-6", "ship", 1): 1}
    assert _kept(pg) == [], "a kept cancel was not taken by its start"
    signals = pg.execute(
        "SELECT run_id FROM eec_run_signal WHERE kind = 'cancel' ORDER BY run_id"
    ).fetchall()
    assert [r[0] for r in signals] == sorted(cancelled)
    assert read_dead_letters(settings) == []


def test_gc_deletes_the_cancels_kept_longer_than_its_retention(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    """A cancel whose run never came is kept until `ductor gc` deletes it with the finished
    runs of its age: the old one goes, the recent one stays; a dry run only counts."""
    for run_id, age in (("never-old", "3 days"), ("never-new", "1 minute")):
        pg.execute(
            "INSERT INTO eec_kept_signal (run_id, signal_id, kind, shard, record_value,"
            " source_topic, source_partition, source_offset, received_at)"
            " VALUES (%s, 's', 'cancel', 0, %s, 't', 0, 0, now() - %s::interval)",
            (run_id, orjson.dumps({"run_id": run_id}), age),
        )
    dry = run_ductor(settings, "gc", "--finished-before", "2d", "--dry-run")
    assert dry.returncode == 0 and ", 1 kept cancel(s) (" in dry.stdout, dry.stdout + dry.stderr
    assert _kept(pg) == ["never-new", "never-old"]
    done = run_ductor(settings, "gc", "--finished-before", "2d")
    assert done.returncode == 0 and ", 1 kept cancel(s) (" in done.stdout, done.stdout + done.stderr
    assert _kept(pg) == ["never-new"]
