"""The doors of the `ductor` command and the client, on the real services: a start, a signal
or a schedule whose JSON is beyond the bounds of stored JSON (core/bounds.py) exits 2 naming
the path (the client raises OutOfBounds), a start of a run id only Ductor derives exits 2
(ReservedRunId), and nothing is written: no run, no signal, no schedule, no request record.
The two stories of the issue: a start of a schedule's next fire no longer swallows it, and a
start of a parent's next child no longer stalls the parent."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import psycopg
import pytest

from processor import StepContext, StepRegistry
from processor.client import (
    ClientError,
    OutOfBounds,
    ReservedRunId,
    request_signal,
    request_starts,
    send_signal,
    start_run,
    wait_for_run,
)
from processor.core.routing import TopicNames
from processor.core.schedules import fire_run_id
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres.workflows import register_workflow

from .children import run_ductor
from .instances import WorkerThread
from .kcat import end_offset
from .runs import run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration

DEEP_100 = "[" * 100 + "1" + "]" * 100  # stored and run before the bounds
DEEP_400 = "[" * 400 + "1" + "]" * 400  # read by orjson, never written: "a bug of Ductor"


def _requests_end(settings: Settings) -> int:
    topic = TopicNames(settings.topic_prefix).requests
    return sum(end_offset(settings, topic, p) for p in range(settings.wakeup_partitions))


def _written(pg: psycopg.Connection[Any]) -> tuple[int, ...]:
    row = pg.execute(
        "SELECT (SELECT count(*) FROM eec_workflow_run), (SELECT count(*) FROM eec_run_signal),"
        " (SELECT count(*) FROM eec_schedule)"
    ).fetchone()
    assert row is not None
    return tuple(row)


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["start", "sample", "--run-id", "c-1", "--input", DEEP_100], "the input at $[0][0]"),
        (["start", "sample", "--run-id", "c-2", "--input", DEEP_400], "deeper than 64 levels"),
        (
            ["start", "sample", "--run-id", "c-3", "--input", '{"a": ["\\u0000"]}'],
            "the input at $.a[0] holds a NUL character",
        ),
        (
            ["start", "sample", "--run-id", "c-4", "--input", '{"n": 123456789012345678901234}'],
            "--input at $.n is the integer 123456789012345678901234",
        ),
        (["start", "sample", "--run-id", "c-5", "--input", DEEP_100, "--via", "kafka"], "$[0]"),
        (["start", "sample", "--run-id", "ok-1/fetch#1"], "the id of a child run"),
        (
            ["start", "sample", "--run-id", "nightly@2030-01-01T00:00:00Z", "--via", "kafka"],
            "the id of a schedule's run",
        ),
        (["signal", "ok-1", "approved", "--payload", DEEP_100], "the payload at $[0][0]"),
        (["signal", "ok-1", "go", "--payload", DEEP_400, "--via", "kafka"], "the payload at"),
        (
            [
                "schedules",
                "create",
                "s-1",
                "--cron",
                "@daily",
                "--workflow",
                "sample",
                "--input",
                DEEP_100,
            ],
            "the input at $[0][0]",
        ),
    ],
)
def test_a_command_beyond_the_bounds_exits_2_naming_the_path_and_writes_nothing(
    settings: Settings, pg: psycopg.Connection[Any], args: list[str], says: str
) -> None:
    assert run_ductor(settings, "start", "sample", "--run-id", "ok-1").returncode == 0
    before, requests = _written(pg), _requests_end(settings)
    done = run_ductor(settings, *args)
    assert (done.returncode, done.stdout) == (2, ""), done.stderr
    assert done.stderr.startswith("ductor: ") and says in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and "bug of Ductor" not in done.stderr
    assert _written(pg) == before and _requests_end(settings) == requests


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = {"k": value}
    return value


def test_a_client_call_beyond_the_bounds_raises_saying_where_and_writes_nothing(
    settings: Settings, pg: psycopg.Connection[Any]
) -> None:
    start_run(settings, "sample", "ok-2", {"n": 1})
    before, requests = _written(pg), _requests_end(settings)
    refused: list[tuple[type[ClientError], Any]] = [
        (OutOfBounds, lambda: start_run(settings, "sample", "c-6", _nested(65))),
        (OutOfBounds, lambda: start_run(settings, "sample", "c-7", {"n": -(2**63) - 1})),
        (OutOfBounds, lambda: start_run(settings, "sample", "c-\x00")),
        (ReservedRunId, lambda: start_run(settings, "sample", "ok-2/fetch#2")),
        (OutOfBounds, lambda: request_starts(settings, "sample", ["c-8"], {"s": "\ud800"})),
        (ReservedRunId, lambda: request_starts(settings, "sample", ["n@2030-01-01T00:00:00Z"])),
        (OutOfBounds, lambda: send_signal(settings, "ok-2", "approved", payload=_nested(300))),
        (OutOfBounds, lambda: request_signal(settings, "ok-2", "go", payload={"n": 2**64})),
    ]
    for kind, call in refused:
        with pytest.raises(kind) as info:
            call()
        assert (
            "at $" in str(info.value) or "run_id" in str(info.value) or "run id" in str(info.value)
        )
    assert _written(pg) == before and _requests_end(settings) == requests


def test_a_start_cannot_take_a_schedules_next_fire_nor_a_parents_next_child(
    settings: Settings, pg: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Before the reserved shapes, a start of `NAME@<next fire>` made the fire find its run
    there and start nothing of its own (no schedule tag: not the schedule's run), and a start
    of `PARENT/STEP#1` made the parent wait for a run that did not know it (a day)."""
    tag = uuid.uuid4().hex[:6]
    schedule, child, parent = f"every-{tag}", f"child-{tag}", f"parent-{tag}"
    created = run_ductor(
        settings, "schedules", "create", schedule, "--cron", "* * * * *",
        "--seconds", "*/5", "--workflow", "sample",
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    row = pg.execute(
        "SELECT (extract(epoch FROM next_fire_at) * 1000)::bigint FROM eec_schedule"
        " WHERE name = %s",
        (schedule,),
    ).fetchone()
    assert row is not None
    next_fire = fire_run_id(schedule, int(row[0]))
    taken = run_ductor(settings, "start", "sample", "--run-id", next_fire)
    assert taken.returncode == 2 and "the id of a schedule's run" in taken.stderr

    registry = StepRegistry()

    @registry.step("hold")
    def hold(ctx: StepContext) -> dict[str, Any]:
        return {"held": ctx.run_id}

    register_workflow(
        pg,
        parse_workflow(
            {"name": child, "version": 1, "steps": [{"name": "h", "type": "hold"}], "output": "h"}
        ),
    )
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": parent,
                "version": 1,
                "steps": [{"name": "ship", "kind": "workflow", "workflow": child}],
                "output": "ship",
            }
        ),
    )
    stolen = run_ductor(settings, "start", child, "--run-id", "p-1/ship#1", "--via", "kafka")
    assert stolen.returncode == 2 and "the id of a child run" in stolen.stderr
    with pytest.raises(ReservedRunId):
        start_run(settings, child, "p-1/ship#1")
    processor_thread(settings)
    worker = WorkerThread(settings, registry)
    try:
        start_run(settings, parent, "p-1")
        result = wait_for_run(settings, "p-1", timeout_s=60)
        assert result.output == {"held": "p-1/ship#1"}
        wait_for(lambda: next_fire in run_statuses(pg, [next_fire]), 60, "the fire's run")
    finally:
        worker.stop()
    tags = pg.execute("SELECT tags FROM eec_workflow_run WHERE run_id = %s", (next_fire,))
    assert tags.fetchone() == ({"schedule": schedule},), "the fire's run is the schedule's own"
    parent_row = pg.execute(
        "SELECT parent_run_id FROM eec_workflow_run WHERE run_id = 'p-1/ship#1'"
    ).fetchone()
    assert parent_row == ("p-1",)
    assert orjson.loads(run_ductor(settings, "result", "p-1").stdout) == {"held": "p-1/ship#1"}
