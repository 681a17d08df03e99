"""Map steps on the real services: a run lists seven images, resizes each on a step attempt of
its own, at most three at once however many worker slots there are, retries the one that
fails once, and publishes the list of results in order; a map over the run's input, and one
over an empty list, end too; each item's execution is counted (once per attempt)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import orjson
import psycopg
import pytest

from processor import NonRetryable, StepContext, StepRegistry
from processor.core.claims import ClaimVerdict, verdict
from processor.core.decide import tick_batch
from processor.core.routing import TopicNames
from processor.core.step_task import StepTask
from processor.core.workflow import parse_workflow
from processor.io.config.settings import Settings
from processor.io.postgres import step_attempts, store
from processor.io.postgres.runs_admin import insert_runs
from processor.io.postgres.workflows import register_workflow

from .audit import assert_transitions_applied_once
from .children import run_ductor
from .instances import WorkerThread
from .runs import count_terminal, run_statuses
from .waiting import wait_for

pytestmark = pytest.mark.integration


class _Busy:
    """How many items run at once, at most, and each (run, item, attempt) executed."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.executed: list[tuple[str, int, int]] = []

    def __enter__(self) -> None:
        with self._lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *_: object) -> None:
        with self._lock:
            self.now -= 1


def _registry(busy: _Busy) -> StepRegistry:
    registry = StepRegistry()

    @registry.step("list_images")
    def list_images(ctx: StepContext) -> list[str]:
        return [f"img-{i}.png" for i in range(ctx.input["n"])]

    @registry.step("resize_image")
    def resize_image(ctx: StepContext) -> dict[str, Any]:
        assert ctx.index is not None
        busy.executed.append((ctx.run_id, ctx.index, ctx.attempt))
        with busy:
            threading.Event().wait(0.1)  # the step's work (a bounded wait, not a poll)
        if ctx.index == 4 and ctx.attempt == 1 and ctx.input.get("flaky"):
            raise RuntimeError("the resizer lost the image")
        return {"image": ctx.item, "size": "64x64"}

    @registry.step("publish")
    def publish(ctx: StepContext) -> dict[str, Any]:
        return {"published": [r["image"] for r in ctx.deps["resize"]]}

    @registry.step("shout")
    def shout(ctx: StepContext) -> str:
        return str(ctx.item).upper()

    return registry


def test_a_map_runs_an_attempt_per_item_within_its_parallelism_and_keeps_the_order(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    pg = audit
    tag = uuid.uuid4().hex[:6]
    images, words = f"images-{tag}", f"words-{tag}"
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": images,
                "version": 1,
                "steps": [
                    {"name": "list", "type": "list_images"},
                    {
                        "name": "resize",
                        "kind": "map",
                        "type": "resize_image",
                        "items_from": "list",
                        "depends_on": ["list"],
                        "parallelism": 3,
                        "retry": {"max_attempts": 2, "backoff_ms": 50},
                    },
                    {"name": "publish", "type": "publish", "depends_on": ["resize"]},
                ],
                "output": {"resized": "resize", "published": "publish"},
            }
        ),
    )
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": words,
                "version": 1,
                "steps": [{"name": "shout", "kind": "map", "type": "shout"}],
                "output": "shout",
            }
        ),
    )
    busy = _Busy()
    processor_thread(settings)
    worker = WorkerThread(settings, _registry(busy), threads=8)
    try:
        for run_id, workflow, run_input in (
            ("pics-1", images, {"n": 7, "flaky": True}),
            ("pics-0", images, {"n": 0}),
            ("words-1", words, ["a", "b", "c"]),
        ):
            started = run_ductor(
                settings,
                "start",
                workflow,
                "--run-id",
                run_id,
                "--input",
                orjson.dumps(run_input).decode(),
            )
            assert started.returncode == 0, started.stderr
        ended = ["pics-1", "pics-0", "words-1"]
        wait_for(lambda: count_terminal(pg, ended) == len(ended), 60, "every run to end")
    finally:
        worker.stop()
    assert set(run_statuses(pg, ended).values()) == {"succeeded"}
    names = [f"img-{i}.png" for i in range(7)]
    shown = orjson.loads(run_ductor(settings, "result", "pics-1").stdout)
    assert shown == {
        "resized": [{"image": n, "size": "64x64"} for n in names],
        "published": {"published": names},
    }
    assert orjson.loads(run_ductor(settings, "result", "pics-0").stdout) == {
        "resized": [],
        "published": {"published": []},
    }
    assert orjson.loads(run_ductor(settings, "result", "words-1").stdout) == ["A", "B", "C"]
    assert busy.most <= 3, busy.most
    # Once per attempt: seven items, one of them twice (its first attempt failed).
    mine = sorted(e for e in busy.executed if e[0] == "pics-1")
    assert mine == sorted([("pics-1", i, 1) for i in range(7)] + [("pics-1", 4, 2)])
    inspected = run_ductor(settings, "inspect", "pics-1").stdout
    assert "resize[4]            succeeded   attempt 2" in inspected
    assert_transitions_applied_once(pg)


def test_a_retried_map_runs_again_only_its_items_that_did_not_succeed(
    settings: Settings, audit: psycopg.Connection[Any], processor_thread: Any
) -> None:
    """Item 3 fails for good and fails the run; once fixed, `ductor runs retry` runs it again
    (and the items its failure cancelled), never an item recorded as succeeded, and the
    output is every item's, in order."""
    pg = audit
    workflow = f"maybe-{uuid.uuid4().hex[:6]}"
    register_workflow(
        pg,
        parse_workflow(
            {
                "name": workflow,
                "version": 1,
                "steps": [
                    {
                        "name": "m",
                        "kind": "map",
                        "type": "maybe",
                        "parallelism": 3,
                        "retry": {"max_attempts": 1},
                    }
                ],
                "output": "m",
            }
        ),
    )
    broken = threading.Event()
    broken.set()
    executed: list[int] = []
    registry = StepRegistry()

    @registry.step("maybe")
    def maybe(ctx: StepContext) -> str:
        assert ctx.index is not None
        executed.append(ctx.index)
        if ctx.index == 3 and broken.is_set():
            raise NonRetryable("item 3 is broken")
        return f"{ctx.item}-done"

    processor_thread(settings)
    worker = WorkerThread(settings, registry, threads=4)
    try:
        started = run_ductor(
            settings, "start", workflow, "--run-id", "maybe-1", "--input",
            orjson.dumps([f"i{i}" for i in range(12)]).decode(),
        )  # fmt: skip
        assert started.returncode == 0, started.stderr
        wait_for(lambda: count_terminal(pg, ["maybe-1"]) == 1, 60, "the run to fail")
        assert run_statuses(pg, ["maybe-1"]) == {"maybe-1": "failed"}
        recorded = {
            r[0] for r in pg.execute("SELECT item FROM eec_map_item WHERE run_id = 'maybe-1'")
        }
        assert 3 not in recorded and recorded  # some items succeeded before it failed
        broken.clear()
        retried = run_ductor(settings, "runs", "retry", "maybe-1")
        assert retried.returncode == 0, retried.stderr
        wait_for(lambda: run_statuses(pg, ["maybe-1"]) == {"maybe-1": "succeeded"}, 60, "the retry")
    finally:
        worker.stop()
    output = orjson.loads(run_ductor(settings, "result", "maybe-1").stdout)
    assert output == [f"i{i}-done" for i in range(12)]
    assert executed.count(3) == 2
    assert all(executed.count(i) == 1 for i in recorded)  # none of those ran again
    assert sorted(set(executed)) == list(range(12))
    inspected = run_ductor(settings, "inspect", "maybe-1").stdout
    assert "m[3]                 succeeded   attempt 2\n" in inspected
    assert_transitions_applied_once(pg)


def test_a_task_of_an_item_that_left_the_state_is_superseded_not_ahead(
    pg: psycopg.Connection[Any],
) -> None:
    """A worker handed an item's task again (a redelivery) after the item succeeded and left
    its run's state skips it as superseded; one for an item its run never started is ahead
    (its row lost the commit that dispatched it: the run is woken)."""
    wf = parse_workflow(
        {
            "name": f"left-{uuid.uuid4().hex[:6]}",
            "version": 1,
            "steps": [{"name": "m", "kind": "map", "type": "t", "parallelism": 2}],
        }
    )
    register_workflow(pg, wf)
    insert_runs(pg, wf, [("left-1", ["a", "b", "c", "d"])], "t1")
    names = TopicNames("test-left")

    def commit_tick() -> None:
        loaded, now = store.load_runs_at(pg, store.Definitions(), ["left-1"])
        commits = tick_batch(loaded, now, names)
        assert store.commit_batch(pg, list(commits.values())).committed == {"left-1"}

    commit_tick()  # m[0] and m[1] dispatched
    pg.execute(
        "INSERT INTO eec_step_result (run_id, node_id, attempt, outcome, output)"
        " VALUES ('left-1', 'm[0]', 1, 'succeeded', '\"A\"')"
    )
    commit_tick()  # m[0] left the state, m[2] dispatched: three started
    tasks = [StepTask("left-1", f"m[{i}]", 1, "t", 2**62) for i in (0, 2, 3)]
    claimed = step_attempts.claim_attempts(
        pg, tasks, "me", max_starts=2, may_judge=True, gone_after_s=10.0
    )
    verdicts = [verdict(facts, 2, True) for facts, _, _ in claimed]
    assert verdicts == [ClaimVerdict.SUPERSEDED, ClaimVerdict.RUN, ClaimVerdict.AHEAD]
