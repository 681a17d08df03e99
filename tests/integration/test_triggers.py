"""Triggers: a team's own topics start and signal runs, with nothing but `ductor triggers
create` in between. kcat writes the team's events (duplicates, events the filter leaves out,
garbage, a cancel before its order) while runs flow; every run starts once, every signal is
applied once, every bad record is one dead letter with its source position, records written
before the trigger was created start nothing, and an instance SIGKILLed right after a request
statement loses none."""

from __future__ import annotations

import uuid
from collections import Counter, defaultdict
from dataclasses import replace
from typing import Any

import orjson
import psycopg
import pytest
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.kafka.clients import topic_partitions
from processor.io.kafka.configs import admin_config
from processor.io.kafka.dlq import read_dead_letters
from processor.io.postgres.workflows import register_workflow

from .audit import assert_transitions_applied_once
from .children import run_ductor
from .instances import WorkerThread
from .kcat import kcat_produce_many
from .runs import count_terminal, run_statuses
from .samples import SAMPLE
from .scrape import free_port, scrape, values
from .test_requests_intake import _kept
from .waiting import wait_for

pytestmark = pytest.mark.integration

WORKFLOW = {**orjson.loads(SAMPLE.read_bytes()), "name": f"triggered-{uuid.uuid4().hex[:8]}"}


@pytest.fixture(autouse=True)
def _workflow(pg: psycopg.Connection[Any]) -> None:
    register_workflow(pg, parse_workflow(WORKFLOW))


def _team_topic(settings: Settings, name: str, partitions: int = 2) -> str:
    """A topic of the team's own (under the test's prefix, so it is deleted with the rest)."""
    topic = f"{settings.topic_prefix}.team.{name}"
    admin = AdminClient(admin_config(settings, "test-team"))
    for future in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
        future.result(30)
    topic_partitions(admin, [topic], 30)
    return topic


def _events(
    settings: Settings, topic: str, partition: int, events: list[Any], headers: Any = ()
) -> None:
    records = [(b"k", e if isinstance(e, bytes) else orjson.dumps(e)) for e in events]
    kcat_produce_many(settings, topic, partition, records, headers=headers)


def _placed(n: int, **extra: Any) -> dict[str, Any]:
    return {"type": "placed", "order_id": n, "items": [n], **extra}


def _create(settings: Settings, *args: str) -> str:
    done = run_ductor(settings, "triggers", "create", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_team_topic_starts_and_cancels_runs_once_and_bad_records_are_dead_letters(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    settings = replace(settings, trigger_refresh_s=0.5)
    orders = _team_topic(settings, "orders")
    cancels = _team_topic(settings, "cancels")
    _events(settings, orders, 0, [_placed(900 + i) for i in range(5)])  # before the trigger
    instance = processor_thread(settings)  # running before the triggers exist: it finds them
    out = _create(
        settings, "orders-in", "--topic", orders, "--workflow", WORKFLOW["name"],
        "--run-id", "$.order_id", "--run-id-prefix", "order-", "--filter", "$.type=placed",
    )  # fmt: skip
    assert "from now on" in out
    _create(
        settings, "cancels-in", "--topic", cancels, "--signal", "cancel",
        "--run-id", "$.order", "--run-id-prefix", "order-",
    )  # fmt: skip
    again = run_ductor(
        settings, "triggers", "create", "other", "--topic", orders, "--workflow", WORKFLOW["name"]
    )
    assert again.returncode == 1 and "one trigger per topic" in again.stderr
    listed = run_ductor(settings, "triggers", "list")
    assert listed.stdout.count("\n") == 2 and "order-{$.order_id}" in listed.stdout
    wait_for(
        lambda: (
            instance.processor.triggers.by_topic.keys() == {orders, cancels}
            and any(tp[0] == orders for tp in instance.processor.assigned)
        ),
        30,
        "the instance to follow both triggers",
    )
    # The cancel of order 99 comes before its order; the cancel of order 5 after.
    _events(settings, cancels, 0, [{"order": 99}])
    wait_for(lambda: _kept(pg) == ["order-99"], 30, "the early cancel to be kept")
    _events(settings, orders, 0, [_placed(n) for n in range(1, 16)])
    _events(
        settings,
        orders,
        1,
        [
            *(_placed(n) for n in range(16, 31)),
            *(_placed(n) for n in range(1, 11)),  # the same events again: one run each
            *({"type": "shipped", "order_id": n} for n in range(1, 6)),  # left out by the filter
            _placed(3, items=["another"]),  # another input for order 3: conflicting_start
            b"{not json",
            {"type": "placed"},  # no order id
            _placed(99),
        ],
    )
    _events(settings, cancels, 1, [{"order": 5}, {"order": 5}])
    run_ids = [f"order-{n}" for n in (*range(1, 31), 99)]
    wait_for(lambda: len(run_statuses(pg, run_ids)) == len(run_ids), 60, "every run to exist")
    wait_for(
        lambda: (
            run_statuses(pg, ["order-5", "order-99"])
            == {"order-5": "cancelled", "order-99": "cancelled"}
        ),
        60,
        "orders 5 and 99 to be cancelled",
    )
    worker = WorkerThread(settings)
    try:
        wait_for(lambda: count_terminal(pg, run_ids) == len(run_ids), 120, "every run to end")
    finally:
        worker.stop()
    statuses = run_statuses(pg, run_ids)
    assert {statuses.pop("order-5"), statuses.pop("order-99")} == {"cancelled"}
    assert set(statuses.values()) == {"succeeded"}
    assert pg.execute("SELECT count(*) FROM eec_workflow_run").fetchone() == (len(run_ids),)
    inputs = dict(pg.execute("SELECT run_id, input FROM eec_workflow_run WHERE run_id = 'order-3'"))
    assert inputs == {"order-3": _placed(3)}
    signals = Counter(
        r[0] for r in pg.execute("SELECT run_id FROM eec_run_signal WHERE kind = 'cancel'")
    )
    # Two cancel records for order 5 (two signals: a record is a signal), one for order 99.
    assert signals == {"order-5": 2, "order-99": 1}
    letters = defaultdict(list)
    for letter in read_dead_letters(settings):
        assert letter.source_topic == orders
        assert letter.header("ductor.dlq.partition") == "1"
        letters[letter.reason].append(letter.value)
    assert dict(letters) == {
        "conflicting_start": [orjson.dumps(_placed(3, items=["another"]))],
        "not_json": [b"{not json"],
        "wrong_schema": [b'{"type":"placed"}'],
    }
    counted = instance.stats.trigger_records
    assert counted[("orders-in", "skipped")] == 5
    assert counted[("orders-in", "rejected")] == 2
    assert counted[("orders-in", "requested")] == 30 + 10 + 1 + 1
    assert counted[("cancels-in", "requested")] == 3
    assert_transitions_applied_once(pg)
    # Deleted: the instance lets the topic go; an event written then starts nothing.
    assert run_ductor(settings, "triggers", "delete", "orders-in").returncode == 0
    wait_for(
        lambda: not any(tp[0] == orders for tp in instance.processor.assigned),
        30,
        "the instance to let the deleted trigger's topic go",
    )
    _events(settings, orders, 0, [_placed(500)])
    _events(settings, cancels, 0, [{"order": 500}])  # a barrier: read after the order would be
    wait_for(lambda: _kept(pg) == ["order-500"], 30, "the cancel after it to be kept")
    assert "order-500" not in run_statuses(pg, ["order-500"])
    assert not any(r.startswith("order-90") for r in _all_runs(pg)), "an event from before"


def _all_runs(pg: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in pg.execute("SELECT run_id FROM eec_workflow_run")]


def test_an_instance_killed_after_a_request_statement_loses_no_triggered_run(
    settings: Settings, audit: psycopg.Connection[Any], spawn: Any
) -> None:
    """SIGKILLed right after its first request statement from a trigger's topic committed,
    before the wakeups and the offsets: its successor reads the same events again, finds the
    runs made, and starts them; its metrics count the trigger's records and its lag."""
    pg = audit
    orders = _team_topic(settings, "orders", partitions=3)
    _create(settings, "orders-in", "--topic", orders, "--workflow", WORKFLOW["name"])
    doomed = spawn(["process"], replace(settings, test_faults="after_requests=kill@1"), "doomed")
    wait_for(lambda: doomed.owned_partitions() > 0, 60, "the doomed instance to own partitions")
    for partition in range(3):
        _events(settings, orders, partition, [{"n": partition * 100 + i} for i in range(100)])
    wait_for(lambda: doomed.proc.poll() is not None, 60, "the fault to kill the instance")
    assert doomed.proc.returncode == -9
    before = pg.execute("SELECT count(*) FROM eec_workflow_run").fetchone()
    heir_settings = replace(settings, metrics_port=free_port())
    heir = spawn(["process"], heir_settings, "heir")
    worker = WorkerThread(settings)
    try:
        wait_for(
            lambda: (
                pg.execute(
                    "SELECT count(*) FROM eec_workflow_run WHERE status = 'succeeded'"
                ).fetchone()
                == (300,)
            ),
            120,
            "every triggered run to end",
        )
        wait_for(
            lambda: (
                {
                    dict(labels)["messaging_destination_name"]
                    for labels in values(scrape(heir_settings.metrics_port), "ductor_consumer_lag")
                }
                >= {orders}
            ),
            30,
            "the trigger topic's lag to be exported",
        )
        records = values(scrape(heir_settings.metrics_port), "ductor_trigger_records_total")
        assert records[(("ductor_outcome", "requested"), ("ductor_trigger", "orders-in"))] > 0
        assert heir.terminate() == 0
    finally:
        worker.stop()
    assert before is not None and 0 < before[0] < 300, f"{before} runs existed at the kill"
    # Position run ids: one run per event, none twice.
    runs = _all_runs(pg)
    assert len(runs) == 300 and all(r.startswith("orders-in:") for r in runs)
    inputs = {r[0]["n"] for r in pg.execute("SELECT input FROM eec_workflow_run")}
    assert inputs == set(range(300))
    assert_transitions_applied_once(pg)
    assert read_dead_letters(settings) == []
    assert heir.final_stats()["ticks"].get("duplicate", 0) > 0, "nothing was redone"


def test_a_trigger_on_a_topic_not_created_yet_says_how_to_create_it(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    missing = f"team-missing-{uuid.uuid4().hex[:6]}"
    done = run_ductor(
        settings, "triggers", "create", "early", "--topic", missing, "--workflow", "sample"
    )
    assert done.returncode == 2, done.stderr  # refused input: nothing was done
    assert f"topic '{missing}' does not exist" in done.stderr
    assert f"--create --topic {missing}" in done.stderr and "create it first" in done.stderr
    assert run_ductor(settings, "triggers", "list", "-o", "json").stdout == ""
