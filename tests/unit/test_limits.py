"""Limits at dispatch, the pure part (core/limits.py): definitions, who is let in, who waits and
when it looks again, what each commit writes; and a Hypothesis property that plays the
counters' table as Postgres keeps it (a version per counter, the holders, the waiters) under
batches of any runs, in any order, committed or lost to a conflict: the limit is never
exceeded, every run ends, and no slot goes to a run that an older waiter needed."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from processor import Concurrency, RateLimit, Workflow
from processor.core.decide import tick_batch
from processor.core.limit_values import Guard, LimitInputs, LimitView, RunLimits
from processor.core.limits import BACKSTOP_MS, needs_of
from processor.core.model import LoadedRun, SignalKind, StepOutcome, StepResult
from processor.core.routing import TopicNames
from processor.core.run_state import (
    MapProgress,
    NodeStatus,
    RunState,
    RunStatus,
    initial_state,
    state_checksum,
)
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import ValidationError, WorkflowDef

NAMES = TopicNames("t")
NOW = 1_000_000


def _workflow(**step: Any) -> WorkflowDef:
    return parse_workflow(
        {"name": "w", "version": 1, "steps": [{"name": "charge", "type": "charge", **step}]}
    )


CHARGE = _workflow(concurrency={"limit": 2, "key": "customer"})


def _run(
    run_id: str, wf: WorkflowDef = CHARGE, state: RunState | None = None, **kw: Any
) -> LoadedRun:
    state = state or initial_state(wf)
    return LoadedRun(run_id, wf, state, 1, "t1", stored_checksum=state_checksum(state), **kw)


def _inputs(runs: dict[str, str], views: dict[str, LimitView]) -> LimitInputs:
    return LimitInputs({r: {("customer",): c} for r, c in runs.items()}, views)


def test_limits_are_defined_in_json_and_in_code_alike() -> None:
    wf = _workflow(
        concurrency={"limit": 5, "key": "$.customer.id", "name": "charges"},
        rate_limit={"limit": 100, "per_s": 60},
    )
    step = wf.steps[0]
    assert step.concurrency is not None and step.concurrency.key == ("customer", "id")
    assert step.rate_limit is not None and step.rate_limit.per_ms == 60_000
    assert step.rate_limit.name == "charge"  # the step's type, by default
    assert parse_workflow(workflow_to_json(wf)) == wf
    code = Workflow("w", version=1)

    @code.step(
        concurrency=Concurrency(5, key="customer.id", name="charges"),
        rate_limit=RateLimit(100, per="1m"),
    )
    def charge(ctx: object) -> None: ...

    assert code.definition() == wf
    assert needs_of(step, {("customer", "id"): "c-1"})[0].key == "c/charges/c-1"
    for bad, message in (
        ({"concurrency": {"limit": 0}}, "limit: must be between 1"),
        ({"concurrency": {"limit": 1, "key": "a..b"}}, "dotted path"),
        ({"concurrency": {"limit": 1, "name": "a/b"}}, "name: 'a/b'"),
        ({"rate_limit": {"limit": 1}}, "missing required field 'per_s'"),
        ({"rate_limit": {"limit": 1, "per_s": 0}}, "per_s: must be between"),
        ({"concurrency": {"limit": 1, "slots": 2}}, "unknown field(s) slots"),
    ):
        with pytest.raises(ValidationError, match=message.replace("(", r"\(").replace(")", r"\)")):
            _workflow(**bad)


def test_a_full_limit_holds_a_dispatch_back_and_the_node_waits() -> None:
    runs = {f"r{i}": _run(f"r{i}") for i in range(4)}
    inputs = _inputs({"r0": "a", "r1": "a", "r2": "a", "r3": "b"}, {"c/charge/a": LimitView(3, 1)})
    commits = tick_batch(runs, NOW, NAMES, inputs)
    statuses = {r: c.state.node_map()["charge"].status for r, c in commits.items()}
    # One slot of customer a is free: the first run of the batch takes it; b has both.
    assert statuses == {
        "r0": NodeStatus.DISPATCHED,
        "r1": NodeStatus.LIMIT_WAIT,
        "r2": NodeStatus.LIMIT_WAIT,
        "r3": NodeStatus.DISPATCHED,
    }
    waiting = commits["r1"]
    assert waiting.state.node_map()["charge"].due_ms == NOW + BACKSTOP_MS
    assert waiting.state.node_map()["charge"].attempt == 0  # no attempt was made
    assert not waiting.effects  # no step task sent
    assert waiting.state.status is RunStatus.RUNNING
    assert waiting.limits == RunLimits(
        guards=(Guard("c/charge/a", 3),),
        waits=(("c/charge/a", "charge", NOW),),
        refused=("charge",),
    )
    taken = commits["r0"].limits
    assert taken is not None and taken.holds == (("c/charge/a", "charge", 1),)
    assert [g.expected for g in taken.guards] == [3]


def test_waiters_are_let_in_oldest_first_and_newcomers_wait_behind_them() -> None:
    waiting = RunState(
        RunStatus.RUNNING,
        (
            (
                "charge",
                initial_state(CHARGE)
                .nodes[0][1]
                ._replace(status=NodeStatus.LIMIT_WAIT, due_ms=NOW + 5),
            ),
        ),
        1,
    )
    runs = {
        "new": _run("new"),
        "young": _run("young", state=waiting),
        "old": _run("old", state=waiting),
    }
    queue = ((10, "old", "charge"), (15, "absent", "charge"), (20, "young", "charge"))
    view = LimitView(7, holders=0, queue=queue)  # two slots free; three waiting
    commits = tick_batch(runs, NOW, NAMES, _inputs(dict.fromkeys(runs, "a"), {"c/charge/a": view}))
    # "old" first; "absent" (another instance's) is next in line: it holds the second slot.
    assert commits["old"].state.node_map()["charge"].status is NodeStatus.DISPATCHED
    assert "young" not in commits  # still waiting, looking again at its own time: no write
    assert commits["new"].state.node_map()["charge"].status is NodeStatus.LIMIT_WAIT
    old = commits["old"].limits
    assert old is not None and old.unwaits == ("charge",) and old.waited == (("charge", NOW - 10),)


def test_a_slot_freed_by_a_result_is_released_and_may_be_taken_again_by_its_run() -> None:
    wf = parse_workflow(
        {
            "name": "w",
            "version": 1,
            "steps": [
                {"name": "a", "type": "x", "concurrency": {"limit": 1, "name": "api"}},
                {
                    "name": "b",
                    "type": "y",
                    "depends_on": ["a"],
                    "concurrency": {"limit": 1, "name": "api"},
                },
            ],
        }
    )
    first = tick_batch({"r": _run("r", wf)}, NOW, NAMES, LimitInputs({}, {}))["r"]
    assert first.limits is not None and first.limits.holds == (("c/api/", "a", 1),)
    result = StepResult("a", 1, StepOutcome.SUCCEEDED)
    run = _run("r", wf, state=first.state, results=(result,))
    # The slot is full (its own attempt holds it), and another run waits for it: the run's
    # next step under the same limit takes the slot its own ended attempt freed.
    view = LimitView(1, holders=1, queue=((5, "other", "a"),))
    second = tick_batch({"r": run}, NOW + 1, NAMES, LimitInputs({}, {"c/api/": view}))["r"]
    assert second.state.node_map()["b"].status is NodeStatus.DISPATCHED
    assert second.limits is not None
    assert second.limits.releases == (("a", 1),) and second.limits.holds == (("c/api/", "b", 1),)
    assert second.limits.released == ()  # reused: no slot freed for the waiter
    # Had b no limit, the slot would be freed for the waiter: its key is named to wake it.


def test_a_rate_limit_counts_a_window_and_its_waiter_has_a_timer() -> None:
    wf = _workflow(rate_limit={"limit": 2, "per_s": 10})
    runs = {f"r{i}": _run(f"r{i}", wf) for i in range(3)}
    # Two dispatches counted, one of them in the window: the next admission is bounded by
    # the first (out of the window), the one after by the second (in it).
    view = LimitView(4, bounds=(NOW - 11_000, NOW - 4_000), dispatched=2, span=2)
    commits = tick_batch(runs, NOW, NAMES, LimitInputs({}, {"r/charge": view}))
    assert commits["r0"].state.node_map()["charge"].status is NodeStatus.DISPATCHED
    held = commits["r1"].state.node_map()["charge"]
    assert held.status is NodeStatus.LIMIT_WAIT and held.due_ms == NOW - 4_000 + 10_000
    assert any(s.topic.startswith("t.delay") for s in commits["r1"].effects)  # its timer
    guard = commits["r0"].limits.guards[0]  # type: ignore[union-attr]
    # This dispatch, numbered after the two, and the two last ones kept.
    assert (guard.times, guard.first, guard.keep) == ((NOW,), 2, 2)


def test_a_run_that_ends_gives_back_what_it_held() -> None:
    dispatched = tick_batch({"r": _run("r")}, NOW, NAMES, LimitInputs({}, {}))["r"].state
    cancelled = tick_batch(
        {"r": _run("r", state=dispatched, signals=frozenset({SignalKind.CANCEL}))},
        NOW + 1,
        NAMES,
        LimitInputs({"r": {("customer",): "a"}}, {}),
    )["r"]
    assert cancelled.state.status is RunStatus.CANCELLED
    assert cancelled.limits is not None and cancelled.limits.ends
    assert cancelled.limits.released == ("c/charge/a",)


# -- the property ----------------------------------------------------------------------------


@dataclass
class _Table:
    """The counters' rows as Postgres keeps them, and the statement's rules (io/limit_store)."""

    version: Counter[str] = field(default_factory=Counter)
    holds: set[tuple[str, str, int, str]] = field(default_factory=set)
    waits: dict[tuple[str, str, str], int] = field(default_factory=dict)

    def views(self, keys: set[str]) -> dict[str, LimitView]:
        out = {}
        for key in keys:
            queue = sorted((s, r, n) for (k, r, n), s in self.waits.items() if k == key)
            held = sum(1 for h in self.holds if h[3] == key)
            out[key] = LimitView(self.version[key], held, (), tuple(queue[:LIMIT]))
        return out

    def commit(self, run_id: str, limits: RunLimits) -> bool:
        if any(self.version[g.key] != g.expected for g in limits.guards):
            return False
        guarded = {g.key for g in limits.guards}
        for key in guarded:
            self.version[key] += 1
        freed = {
            h[3]
            for h in self.holds
            if h[0] == run_id and (limits.ends or (h[1], h[2]) in limits.releases)
        }
        self.holds = {
            h
            for h in self.holds
            if not (h[0] == run_id and (limits.ends or (h[1], h[2]) in limits.releases))
        }
        for key in freed - guarded:
            self.version[key] += 1
        self.holds |= {(run_id, n, a, k) for k, n, a in limits.holds}
        for k, n, since in limits.waits:
            self.waits.setdefault((k, run_id, n), since)
        self.waits = {
            w: s
            for w, s in self.waits.items()
            if not (w[1] == run_id and (limits.ends or w[2] in limits.unwaits))
        }
        return True


LIMIT = 2


@settings(max_examples=150, deadline=None)
@given(
    runs=st.integers(min_value=1, max_value=8),
    plan=st.lists(
        st.tuples(st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True), st.booleans()),
        min_size=1,
        max_size=60,
    ),
)
def test_the_limit_is_never_exceeded_and_every_run_ends(
    runs: int, plan: list[tuple[list[int], bool]]
) -> None:
    """Batches of runs (a step each, limit 2 on one customer) are ticked against the table as
    it was when loaded and committed in turn; a batch loaded before the previous one committed
    (``stale``) loses whatever its counters changed meanwhile. Steps end one tick after
    they start. Then runs are ticked alone until all end."""
    ids = [f"r{i}" for i in range(runs)]
    table = _Table()
    states = {r: initial_state(CHARGE) for r in ids}
    started: dict[str, int] = {}
    clock = NOW

    def step(batch: list[str], snapshot: _Table) -> None:
        nonlocal clock
        clock += 1
        loaded = {}
        for r in batch:
            node = states[r].node_map()["charge"]
            results: tuple[StepResult, ...] = ()
            if node.status is NodeStatus.DISPATCHED and started.get(r, clock) < clock:
                results = (StepResult("charge", node.attempt, StepOutcome.SUCCEEDED),)
            loaded[r] = _run(r, state=states[r], results=results)
        inputs = LimitInputs(
            {r: {("customer",): "c"} for r in batch}, snapshot.views({"c/charge/c"})
        )
        for r, commit in tick_batch(loaded, clock, NAMES, inputs).items():
            since = table.waits.get(("c/charge/c", r, "charge"), clock)
            older = [w for w, s in table.waits.items() if s < since and w[1] != r]
            if commit.limits is not None and not table.commit(r, commit.limits):
                continue  # a conflict: the run is ticked again later from fresh state
            states[r] = commit.state
            node = commit.state.node_map()["charge"]
            in_flight = sum(
                1 for s in states.values() if s.node_map()["charge"].status is NodeStatus.DISPATCHED
            )
            assert in_flight <= LIMIT
            if node.status is NodeStatus.DISPATCHED and r not in started:
                started[r] = clock
                # First come, first served: no slot went to it that an older waiter needed.
                assert in_flight + len(older) <= LIMIT, (r, older)
            assert sum(1 for h in table.holds if h[3] == "c/charge/c") == in_flight

    previous = _Table()
    for picks, stale in plan:
        batch = [ids[i % runs] for i in dict.fromkeys(picks)]
        snapshot = _copy(previous if stale else table)
        previous = _copy(table)
        step(batch, snapshot)
    for _ in range(4 * runs + 4):
        for r in ids:
            if not states[r].status.terminal:
                step([r], _copy(table))
    assert all(s.status is RunStatus.SUCCEEDED for s in states.values())
    assert not table.holds and not table.waits


def _copy(table: _Table) -> _Table:
    return _Table(Counter(table.version), set(table.holds), dict(table.waits))


def test_a_map_steps_items_each_need_a_slot_and_waiting_ones_count_as_in_flight() -> None:
    wf = parse_workflow(
        {
            "name": "m",
            "version": 1,
            "steps": [
                {
                    "name": "resize",
                    "kind": "map",
                    "type": "resize",
                    "parallelism": 4,
                    "concurrency": {"limit": 2, "name": "images"},
                }
            ],
        }
    )
    first = tick_batch({"r": _run("r", wf, input_length=6)}, NOW, NAMES, LimitInputs({}, {}))["r"]
    items = {n: s.status for n, s in first.state.nodes if n.startswith("resize[")}
    # Four items started by the map's parallelism; two of them let in by the limit.
    assert list(items.values()).count(NodeStatus.DISPATCHED) == 2
    assert list(items.values()).count(NodeStatus.LIMIT_WAIT) == 2
    # The other two are not started yet: not in the state, counted by the map's progress.
    assert first.state.maps == (("resize", MapProgress(6, 4)),)
    assert first.limits is not None and len(first.limits.holds) == 2
    done = tuple(
        StepResult(n, 1, StepOutcome.SUCCEEDED)
        for n, s in first.state.nodes
        if n.startswith("resize[") and s.status is NodeStatus.DISPATCHED
    )
    view = LimitView(
        1,
        holders=2,
        queue=tuple((NOW, "r", n) for n, s in items.items() if s is NodeStatus.LIMIT_WAIT),
    )
    second = tick_batch(
        {"r": _run("r", wf, state=first.state, results=done, input_length=6)},
        NOW + 1,
        NAMES,
        LimitInputs({}, {"c/images/": view}),
    )["r"]
    after = {n: s.status for n, s in second.state.nodes if n.startswith("resize[")}
    # The two slots its own items freed go to its two waiting items (in line first), and
    # the last two items start and wait in turn (the parallelism of four holds).
    # The two that succeeded left the state, recorded by the commit.
    assert [(n, a) for n, _, a in second.items] == [("resize", 1), ("resize", 1)]
    assert second.state.maps == (("resize", MapProgress(6, 6)),)
    assert list(after.values()).count(NodeStatus.DISPATCHED) == 2
    assert list(after.values()).count(NodeStatus.LIMIT_WAIT) == 2
    assert second.limits is not None and set(second.limits.unwaits) == {
        n for n, s in items.items() if s is NodeStatus.LIMIT_WAIT
    }


# -- the rate property -----------------------------------------------------------------------

RATED = _workflow(rate_limit={"limit": 2, "per_s": 1})
RATE_KEY = "r/charge"


@dataclass
class _RateTable:
    """A rate counter's rows as Postgres keeps them (io/postgres/limit_store.py): its version,
    how many dispatches it counted, their times by number, and its waiters' line."""

    version: int = 0
    dispatched: int = 0
    times: dict[int, int] = field(default_factory=dict)
    waits: dict[str, int] = field(default_factory=dict)

    def view(self) -> LimitView:
        bounds = tuple(self.times.get(self.dispatched - LIMIT + j, 0) for j in range(LIMIT))
        line = tuple(sorted((s, r, "charge") for r, s in self.waits.items())[:LIMIT])
        return LimitView(self.version, 0, bounds, line, self.dispatched, LIMIT)

    def copy(self) -> _RateTable:
        return _RateTable(self.version, self.dispatched, dict(self.times), dict(self.waits))


# The case judging at the load's time fails: a batch loaded 635 ms before its counters were read
# counts a dispatch at -635 after one at 0, and two later ones then fit in [0, 365].
@example(
    runs=4,
    plan=[
        ([0], 0, 0, False),
        ([0, 1, 2], 0, 635, False),
        ([0, 1, 2, 3], 365, 0, False),
        ([0, 1, 2], 0, 0, False),
    ],
)
@settings(max_examples=300, deadline=None)
@given(
    runs=st.integers(min_value=2, max_value=7),
    plan=st.lists(
        st.tuples(
            st.lists(st.integers(0, 6), min_size=1, max_size=4, unique=True),
            st.integers(0, 700),  # how far the clock moved
            st.integers(0, 900),  # how much earlier than that the batch's runs were loaded
            st.booleans(),  # its counters read before the previous batch committed
        ),
        min_size=1,
        max_size=50,
    ),
)
def test_a_rate_limit_is_never_exceeded_whatever_the_instances_clocks_say(
    runs: int, plan: list[tuple[list[int], int, int, bool]]
) -> None:
    """Batches of runs (a step each, 2 dispatches a second) are loaded at a time of their own,
    up to 0.9 s before their counters are read (another instance counted dispatches
    meanwhile), or read before the previous batch committed (a conflict then); a batch is
    judged at the later of the two times, as core/batch.py judges it. In no window of a
    second are there more than two dispatches. (Judged at its load's time alone, a batch
    counted a dispatch before one already counted, and three fit in one window.)"""
    ids = [f"r{i}" for i in range(runs)]
    table, previous = _RateTable(), _RateTable()
    states = {r: initial_state(RATED) for r in ids}
    dispatched: list[int] = []
    clock = NOW
    for picks, moved, early, stale in plan:
        clock += moved
        read = previous.copy() if stale else table.copy()
        previous = table.copy()
        loaded = {}
        for r in dict.fromkeys(ids[i % runs] for i in picks):
            node = states[r].node_map()["charge"]
            done = node.status is NodeStatus.DISPATCHED
            results = (StepResult("charge", node.attempt, StepOutcome.SUCCEEDED),) if done else ()
            loaded[r] = _run(r, RATED, states[r], results=results)
        inputs = LimitInputs({}, {RATE_KEY: read.view()}, clock)
        commits = tick_batch(loaded, max(clock - early, inputs.now_ms), NAMES, inputs)
        # The statement: the batch's guard of the counter, then the runs it let write.
        guards = {g.key: g for c in commits.values() if c.limits for g in c.limits.guards}
        guard = guards.get(RATE_KEY)
        held = guard is not None and guard.expected == table.version
        if guard is not None and held:
            table.version += 1
            for j, at in enumerate(guard.times or ()):
                table.times[guard.first + j] = at
                dispatched.append(at)
            table.dispatched = guard.first + len(guard.times or ())
        for r, commit in commits.items():
            if commit.limits is not None and commit.limits.guards and not held:
                continue  # a conflict: ticked again later from fresh state
            states[r] = commit.state
            if commit.limits is not None:
                for _key, _node, since in commit.limits.waits:
                    table.waits.setdefault(r, since)
                if commit.limits.ends or "charge" in commit.limits.unwaits:
                    table.waits.pop(r, None)
    times = sorted(dispatched)
    gaps = [times[i + LIMIT] - times[i] for i in range(len(times) - LIMIT)]
    assert all(gap >= 1000 for gap in gaps), ([t - NOW for t in times], gaps)
