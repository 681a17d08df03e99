"""One run per key, the pure part (core/run_keys.py with core/limits.py): the workflow's
``concurrency`` in JSON and in code, a start refused and let in, a slot given back by the run's
end; and a Hypothesis property that plays the counters' table as Postgres keeps it (a version
per counter, the holders, the waiters) under batches of any runs of two keys, ticked from a
fresh or a stale load (two processors), committed or lost to a conflict, some cancelled or
failing: never more than the limit live per key, each slot given back once, first come first
served within a key, and every run ends. And a limit's line (core/limit_line.py): by turns
across keys, first come first served within one, nobody starving whatever keys join."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor import Concurrency, Workflow
from processor.core.decide import tick_batch
from processor.core.limit_defs import RunKeyLimit
from processor.core.limit_line import Waiter, join_round, line_order
from processor.core.limit_values import LimitInputs, LimitView, RunLimits
from processor.core.limits import BACKSTOP_MS
from processor.core.model import LoadedRun, SignalKind, StepOutcome, StepResult
from processor.core.routing import TopicNames
from processor.core.run_ends import resume_failed
from processor.core.run_keys import RUN_NODE
from processor.core.run_state import (
    NodeStatus,
    RunState,
    RunStatus,
    initial_state,
    state_checksum,
)
from processor.core.workflow import parse_workflow, workflow_to_json
from processor.core.workflow_def import ValidationError, WorkflowDef
from processor.io.postgres.key_slots import KeySlot

NAMES = TopicNames("t")
NOW = 1_000_000


def _workflow(limit: int = 1, **extra: Any) -> WorkflowDef:
    return parse_workflow(
        {
            "name": "orders",
            "version": 1,
            "concurrency": {"limit": limit, "key": "customer.id"},
            "steps": [{"name": "charge", "type": "charge", **extra}],
        }
    )


ORDERS = _workflow()
KEY_A = RunKeyLimit("orders", 1, ("customer", "id")).key_of("a")


def _run(
    run_id: str, wf: WorkflowDef = ORDERS, state: RunState | None = None, **kw: Any
) -> LoadedRun:
    state = state or initial_state(wf)
    return LoadedRun(run_id, wf, state, 1, "t1", stored_checksum=state_checksum(state), **kw)


def _inputs(runs: dict[str, str], views: dict[str, LimitView]) -> LimitInputs:
    return LimitInputs({r: {("customer", "id"): c} for r, c in runs.items()}, views)


def test_a_workflows_concurrency_is_defined_in_json_and_in_code_alike() -> None:
    assert ORDERS.concurrency == RunKeyLimit("orders", 1, ("customer", "id"))
    assert ORDERS.has_limits
    assert workflow_to_json(ORDERS)["concurrency"] == {"limit": 1, "key": "customer.id"}
    assert parse_workflow(workflow_to_json(ORDERS)) == ORDERS
    wf = Workflow("orders", concurrency=Concurrency(1, key="customer.id"))

    @wf.step(type="charge")
    def charge(ctx: object) -> None: ...

    assert wf.definition().concurrency == ORDERS.concurrency
    everyone = parse_workflow(
        {
            "name": "o",
            "version": 1,
            "concurrency": {"limit": 3},
            "steps": [{"name": "s", "type": "s"}],
        }
    )
    assert everyone.concurrency == RunKeyLimit("o", 3, ())
    # The counter names the workflow's length: a name with '/' is no other's counter.
    assert RunKeyLimit("a/b", 1).key_of("c") != RunKeyLimit("a", 1).key_of("b/c")


@pytest.mark.parametrize(
    ("concurrency", "says"),
    [
        ({"limit": 0}, "workflow.concurrency.limit: must be between 1"),
        ({"key": "customer"}, "missing required field 'limit'"),
        ({"limit": 1, "key": "a..b"}, "workflow.concurrency.key"),
        ({"limit": 1, "name": "x"}, "workflow.concurrency: unknown"),
        (3, "workflow.concurrency: expected an object"),
    ],
)
def test_a_bad_concurrency_says_where(concurrency: Any, says: str) -> None:
    raw = {
        "name": "o",
        "version": 1,
        "concurrency": concurrency,
        "steps": [{"name": "s", "type": "s"}],
    }
    with pytest.raises(ValidationError, match=says.replace(".", r"\.").replace("(", r"\(")):
        parse_workflow(raw)
    with pytest.raises(ValidationError, match="takes no name"):
        Workflow("o", concurrency=Concurrency(1, name="x"))


def test_a_start_without_room_leaves_the_run_pending_in_line_until_a_slot_frees() -> None:
    full = {KEY_A: LimitView(version=4, holders=1)}
    commits = tick_batch({"r": _run("r")}, NOW, NAMES, _inputs({"r": "a"}, full))
    waiting = commits["r"]
    assert waiting.state.status is RunStatus.PENDING
    assert waiting.state.node("charge") == waiting.state.node("charge")._replace(
        status=NodeStatus.PENDING, due_ms=NOW + BACKSTOP_MS
    )
    assert waiting.effects == ()  # nothing dispatched
    limits = waiting.limits
    assert limits is not None
    assert limits.waits == ((KEY_A, RUN_NODE, NOW),) and limits.holds == ()
    assert [g.key for g in limits.guards] == [KEY_A] and limits.refused == ("run:orders",)
    # Woken before its time to look again, and still no room: nothing to write.
    queue = {KEY_A: LimitView(5, 1, queue=((NOW, "r", RUN_NODE),))}
    again = _run("r", state=waiting.state)
    assert tick_batch({"r": again}, NOW + 10, NAMES, _inputs({"r": "a"}, queue)) == {}
    # Its time came: it looks, and waits on (a commit: its next look is further ahead).
    later = NOW + BACKSTOP_MS
    looked = tick_batch({"r": again}, later, NAMES, _inputs({"r": "a"}, queue))["r"]
    assert looked.state.node("charge").due_ms == later + BACKSTOP_MS
    # The slot freed: it starts, holds the slot, leaves the line, and keeps no mark.
    free = {KEY_A: LimitView(6, 0, queue=((NOW, "r", RUN_NODE),))}
    started = tick_batch({"r": again}, NOW + 20, NAMES, _inputs({"r": "a"}, free))["r"]
    assert started.state.status is RunStatus.RUNNING
    assert started.state.node("charge").status is NodeStatus.DISPATCHED
    assert started.limits is not None
    assert started.limits.holds == ((KEY_A, RUN_NODE, 0),)
    assert started.limits.unwaits == (RUN_NODE,) and started.limits.waited == (("run:orders", 20),)


def test_a_newcomer_waits_behind_the_line_and_other_keys_do_not() -> None:
    line = {KEY_A: LimitView(1, 0, queue=((NOW - 5, "old", RUN_NODE),))}
    runs = {"new": _run("new"), "b": _run("b")}
    key_b = RunKeyLimit("orders", 1, ("customer", "id")).key_of("b")
    commits = tick_batch(runs, NOW, NAMES, _inputs({"new": "a", "b": "b"}, line))
    assert commits["new"].state.status is RunStatus.PENDING  # the old waiter's slot
    assert commits["b"].state.status is RunStatus.RUNNING
    assert commits["b"].limits is not None
    assert commits["b"].limits.holds == ((key_b, RUN_NODE, 0),)


def test_a_run_that_ends_gives_its_slot_back_once_and_a_pending_one_holds_none() -> None:
    started = tick_batch({"r": _run("r")}, NOW, NAMES, _inputs({"r": "a"}, {}))["r"]
    assert started.limits is not None and started.limits.holds == ((KEY_A, RUN_NODE, 0),)
    node = started.state.node("charge")
    failed = StepResult("charge", node.attempt, StepOutcome.FAILED, "boom", retryable=False)
    loaded = _run("r", state=started.state, results=(failed,))
    ended = tick_batch({"r": loaded}, NOW + 1, NAMES, _inputs({"r": "a"}, {}))["r"]
    assert ended.state.status is RunStatus.FAILED
    assert ended.limits is not None and ended.limits.ends
    assert ended.limits.released == (KEY_A,)  # its waiter is woken
    # Retried by an operator: pending again, to take its key's slot as a start does.
    assert resume_failed(ended.state, pending=True).status is RunStatus.PENDING
    # A waiting run cancelled: it leaves the line, frees nothing.
    full = {KEY_A: LimitView(1, 1)}
    waiting = tick_batch({"w": _run("w")}, NOW, NAMES, _inputs({"w": "a"}, full))["w"]
    cancel = _run("w", state=waiting.state, signals=frozenset({SignalKind.CANCEL}))
    gone = tick_batch({"w": cancel}, NOW + 1, NAMES, _inputs({"w": "a"}, full))["w"]
    assert gone.state.status is RunStatus.CANCELLED
    assert gone.limits is not None and gone.limits.ends and gone.limits.released == ()


# -- the property ----------------------------------------------------------------------------


@dataclass
class _Table:
    """The counters' rows as Postgres keeps them, and the statement's rules (io/limit_store);
    a release of a slot nobody holds, or a slot taken twice, fails the property."""

    version: Counter[str] = field(default_factory=Counter)
    holds: set[tuple[str, str, int, str]] = field(default_factory=set)
    waits: dict[tuple[str, str, str], int] = field(default_factory=dict)
    given_back: Counter[str] = field(default_factory=Counter)

    def views(self, keys: set[str], limit: int) -> dict[str, LimitView]:
        out = {}
        for key in keys:
            queue = sorted((s, r, n) for (k, r, n), s in self.waits.items() if k == key)
            held = sum(1 for h in self.holds if h[3] == key)
            out[key] = LimitView(self.version[key], held, (), tuple(queue[:limit]))
        return out

    def commit(self, run_id: str, limits: RunLimits) -> bool:
        if any(self.version[g.key] != g.expected for g in limits.guards):
            return False
        guarded = {g.key for g in limits.guards}
        for key in guarded:
            self.version[key] += 1
        mine = {h for h in self.holds if h[0] == run_id and limits.ends}
        self.holds -= mine
        for h in mine:
            self.given_back[h[0]] += 1
        for key in {h[3] for h in mine} - guarded:
            self.version[key] += 1
        for k, n, a in limits.holds:
            assert (run_id, n, a, k) not in self.holds, "a slot taken twice"
            self.holds.add((run_id, n, a, k))
        for k, n, since in limits.waits:
            self.waits.setdefault((k, run_id, n), since)
        self.waits = {
            w: s
            for w, s in self.waits.items()
            if not (w[1] == run_id and (limits.ends or w[2] in limits.unwaits))
        }
        return True


def _copy(table: _Table) -> _Table:
    return _Table(Counter(table.version), set(table.holds), dict(table.waits), table.given_back)


@settings(max_examples=150, deadline=None)
@given(
    limit=st.integers(1, 2),
    keys=st.lists(st.sampled_from("ab"), min_size=1, max_size=8),
    plan=st.lists(
        st.tuples(
            st.lists(st.integers(0, 7), min_size=1, max_size=4, unique=True),
            st.booleans(),  # loaded before the previous batch committed (another processor)
            st.sampled_from(["ok", "ok", "fail", "cancel"]),  # what the first run's step does
        ),
        min_size=1,
        max_size=50,
    ),
)
def test_never_more_than_the_limit_live_per_key_and_every_run_ends(
    limit: int, keys: list[str], plan: list[tuple[list[int], bool, str]]
) -> None:
    wf = _workflow(limit, retry={"max_attempts": 1})
    ids = [f"r{i}" for i in range(len(keys))]
    key_of = {
        r: RunKeyLimit("orders", limit, ("customer", "id")).key_of(k)
        for r, k in zip(ids, keys, strict=True)
    }
    table = _Table()
    states = {r: initial_state(wf) for r in ids}
    began: dict[str, int] = {}
    clock = NOW

    def step(batch: list[str], snapshot: _Table, how: str) -> None:
        nonlocal clock
        clock += 1
        loaded = {}
        for i, r in enumerate(batch):
            node = states[r].node("charge")
            results: tuple[StepResult, ...] = ()
            signals: frozenset[SignalKind] = frozenset()
            if i == 0 and how == "cancel":
                signals = frozenset({SignalKind.CANCEL})
            elif node.status is NodeStatus.DISPATCHED and began.get(r, clock) < clock:
                outcome = StepOutcome.FAILED if i == 0 and how == "fail" else StepOutcome.SUCCEEDED
                results = (StepResult("charge", node.attempt, outcome, "x", retryable=False),)
            loaded[r] = _run(r, wf, states[r], results=results, signals=signals)
        inputs = LimitInputs(
            {r: {("customer", "id"): keys[ids.index(r)]} for r in batch},
            snapshot.views({key_of[r] for r in batch}, limit),
        )
        for r, commit in tick_batch(loaded, clock, NAMES, inputs).items():
            key = key_of[r]
            since = table.waits.get((key, r, RUN_NODE), clock)
            older = [w for w, s in table.waits.items() if w[0] == key and s < since and w[1] != r]
            if commit.limits is not None and not table.commit(r, commit.limits):
                continue  # a conflict: the run is ticked again later from fresh state
            before, states[r] = states[r].status, commit.state
            live = [q for q in ids if states[q].status is RunStatus.RUNNING and key_of[q] == key]
            assert len(live) <= limit, (key, live)
            held = {h[0] for h in table.holds if h[3] == key}
            assert held == set(live), "a live run without its slot, or a slot kept after its end"
            if before is RunStatus.PENDING and commit.state.status is RunStatus.RUNNING:
                began[r] = clock
                # First come, first served within the key: no slot an older waiter needed.
                assert len(live) + len(older) <= limit, (r, older)

    previous = _Table()
    for picks, stale, how in plan:
        batch = [ids[i % len(ids)] for i in dict.fromkeys(picks)]
        snapshot = _copy(previous if stale else table)
        previous = _copy(table)
        step(batch, snapshot, how)
    for _ in range(4 * len(ids) + 4):
        for r in ids:
            if not states[r].status.terminal:
                step([r], _copy(table), "ok")
    assert all(s.status.terminal for s in states.values()), "a run starved"
    assert not table.holds and not table.waits
    # Each slot given back once: once per run that ever started.
    assert table.given_back == Counter(dict.fromkeys(began, 1))


def test_inspect_says_where_a_run_stands_with_its_key() -> None:
    limit = RunKeyLimit("orders", 2, ("customer", "id"))
    waiting = KeySlot(limit, "a", False, None, 3, 2)
    assert waiting.line() == "customer.id=a: waits for a slot, place 3 in line, 2 of 2 live"
    holding = KeySlot(limit, "a", True, None, None, 1)
    assert holding.line() == "customer.id=a: holds a slot, 1 of 2 live"
    assert holding.document()["limit"] == "run:orders" and holding.document()["of"] == 2
    everyone = KeySlot(RunKeyLimit("orders", 1), "", True, None, None, 1)
    assert everyone.line() == "(every run): holds a slot, 1 of 1 live"


# -- a limit's line: round-robin across run keys (core/limit_line.py) ---------------------------


def _joined(line: list[Waiter], key: str, clock: int) -> Waiter:
    waiter = Waiter(clock, f"w{clock}", "n", key, join_round(line, key))
    line.append(waiter)
    return waiter


@given(st.lists(st.sampled_from(["", "a", "b", "c"]), max_size=40))
def test_waiters_joining_together_are_let_in_by_turns_across_keys(keys: list[str]) -> None:
    """Waiters of any keys joining in any order while nobody is let in: the line takes each
    key's oldest, then each key's next, and so on (first come, first served within a key)."""
    line: list[Waiter] = []
    for clock, key in enumerate(keys):
        _joined(line, key, clock)
    order = line_order(line)
    for key in set(keys):
        mine = [w for w in order if w.run_key == key]
        assert mine == sorted(mine, key=lambda w: w.since_ms)  # first come, first served
        assert [w.round for w in mine] == list(range(len(mine)))  # one a round
    # By turns: in any prefix of the line, two keys that both still wait differ by one.
    seen: Counter[str] = Counter()
    left = Counter(keys)
    for waiter in order:
        seen[waiter.run_key] += 1
        left[waiter.run_key] -= 1
        waiting = [k for k in left if left[k] > 0]
        assert all(seen[k] >= seen[waiter.run_key] - 1 for k in waiting), (order, waiter)
    if len(set(keys)) == 1:
        assert order == line  # one key: first come, first served


@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["", "a", "b", "c", "d"])), max_size=80))
def test_nobody_starves_whatever_keys_keep_joining(events: list[tuple[bool, str]]) -> None:
    """Joins of any keys and admissions (the line's first) in any order: a joiner never goes
    ahead of the line's first, a key has one waiter a round (so a waiter has at most one
    waiter of each other key ahead of it a round, from the first's round to its own), and
    the first's round never goes back while anyone waits: everyone is let in once the joins
    stop."""
    line: list[Waiter] = []
    first_round = 0
    for clock, (joins, key) in enumerate(events):
        if joins or not line:
            head = line_order(line)[0] if line else None
            _joined(line, key, clock)
            if head is not None:
                assert line_order(line)[0] == head
        else:
            line.remove(line_order(line)[0])
        for k in {w.run_key for w in line}:
            rounds = [w.round for w in line_order(line) if w.run_key == k]
            assert rounds == sorted(set(rounds))  # FIFO, one a round
        if line:
            assert line_order(line)[0].round >= first_round
            first_round = line_order(line)[0].round
        else:
            first_round = 0  # (an empty line starts again from round 0: nobody to pass)


def test_a_retried_run_back_in_line_keeps_the_versions_it_started_with() -> None:
    """A failed run of a workflow with ``concurrency`` is retried pending (to wait for its
    key): the tick that starts it again does not pin its steps anew, whatever is served
    now (core/versions.py, rule 1)."""
    wf = _workflow(retry={"max_attempts": 1})
    started = tick_batch({"r": _run("r", wf)}, NOW, NAMES, _inputs({"r": "a"}, {}))["r"]
    assert started.state.versions == ()  # version 1 everywhere
    node = started.state.node("charge")
    failed = StepResult("charge", node.attempt, StepOutcome.FAILED, "boom", retryable=False)
    loaded = _run("r", wf, started.state, results=(failed,))
    ended = tick_batch({"r": loaded}, NOW + 1, NAMES, _inputs({"r": "a"}, {}))["r"]
    retried = resume_failed(ended.state, pending=True)
    again = _run("r", wf, retried).with_served({("default", "charge"): 2})
    restarted = tick_batch({"r": again}, NOW + 2, NAMES, _inputs({"r": "a"}, {}))["r"]
    assert restarted.state.status is RunStatus.RUNNING
    assert restarted.state.versions == ()  # not version 2, served since
    fresh = _run("n", wf).with_served({("default", "charge"): 2})
    assert tick_batch({"n": fresh}, NOW, NAMES, _inputs({"n": "a"}, {}))["n"].state.versions == (
        ("charge", 2),
    )
