"""A rate limit counted as numbered dispatches (core/limits.py, rule 5), against a model of its
tables as io/postgres/limit_store.py writes them: batches of runs, some loaded before the previous
batch committed, at times moving on by less or more than a window. At most ``limit`` dispatches in
any window; never fewer let in than the window has room for (a run waits only when the window
is full or an older waiter is still in line); a waiter looks again no sooner than it can be let
in; every run is let in once time moves on; the same inputs decide the same."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.decide import tick_batch
from processor.core.limit_values import LimitInputs, LimitView, RunLimits
from processor.core.limits import RATE_LOOKAHEAD
from processor.core.model import LoadedRun
from processor.core.routing import TopicNames
from processor.core.run_state import NodeStatus, RunState, initial_state, state_checksum
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef

NAMES = TopicNames("t")
KEY = "r/api"


def _workflow(limit: int, per_ms: int) -> WorkflowDef:
    rate = {"limit": limit, "per_s": per_ms / 1000, "name": "api"}
    return parse_workflow(
        {"name": "w", "version": 1, "steps": [{"name": "call", "type": "x", "rate_limit": rate}]}
    )


@dataclass
class _Rate:
    """The counter's rows: its version and count (eec_limit), its numbered dispatches
    (eec_limit_rate) and its waiters (eec_limit_wait)."""

    limit: int
    version: int = 0
    dispatched: int = 0
    log: dict[int, int] = field(default_factory=dict)
    waits: dict[str, int] = field(default_factory=dict)  # run -> since

    def view(self) -> LimitView:
        first = self.dispatched - self.limit
        ahead = min(self.limit, RATE_LOOKAHEAD)
        bounds = tuple(self.log.get(first + j, 0) for j in range(ahead))
        queue = tuple(sorted((s, r, "call") for r, s in self.waits.items()))[:ahead]
        return LimitView(self.version, 0, bounds, queue, self.dispatched, self.limit)

    def copy(self) -> _Rate:
        return _Rate(self.limit, self.version, self.dispatched, dict(self.log), dict(self.waits))

    def commit(self, run_id: str, limits: RunLimits, guarded: set[str]) -> bool:
        """The statement's rules: a guard writes only from the version it read (once per
        statement: ``guarded``), the run only if its guards held."""
        for guard in limits.guards:
            if guard.key in guarded:
                continue
            if guard.expected != self.version:
                return False
            guarded.add(guard.key)
            self.version += 1
            times = guard.times or ()
            for j, at in enumerate(times):
                self.log[guard.first + j] = at
            for seq in range(guard.first - guard.keep, guard.first + len(times) - guard.keep):
                self.log.pop(seq, None)
            self.dispatched = guard.first + len(times)
        for _key, node, since in limits.waits:
            assert node == "call"
            self.waits.setdefault(run_id, since)
        if limits.ends or "call" in limits.unwaits:
            self.waits.pop(run_id, None)
        return True


def _run(run_id: str, wf: WorkflowDef, state: RunState) -> LoadedRun:
    return LoadedRun(run_id, wf, state, 1, "t1", stored_checksum=state_checksum(state))


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(1, 4),
    per_ms=st.sampled_from([10, 100, 1_000]),
    runs=st.integers(1, 10),
    plan=st.lists(
        st.tuples(
            st.lists(st.integers(0, 9), min_size=1, max_size=5, unique=True),
            st.integers(0, 1_500),
            st.booleans(),
        ),
        min_size=1,
        max_size=40,
    ),
)
def test_a_window_never_holds_more_than_its_limit_nor_turns_away_what_it_has_room_for(
    limit: int, per_ms: int, runs: int, plan: list[tuple[list[int], int, bool]]
) -> None:
    wf = _workflow(limit, per_ms)
    ids = [f"r{i}" for i in range(runs)]
    table = _Rate(limit)
    states = {r: initial_state(wf) for r in ids}
    let_in: list[int] = []  # every dispatch's time, as committed
    clock = 1_000_000

    def tick(batch: list[str], snapshot: _Rate) -> None:
        loaded = {r: _run(r, wf, states[r]) for r in batch if not states[r].status.terminal}
        inputs = LimitInputs({}, {KEY: snapshot.view()})
        commits = tick_batch(loaded, clock, NAMES, inputs)
        assert commits == tick_batch(loaded, clock, NAMES, inputs)  # deterministic
        guarded: set[str] = set()
        for r, commit in commits.items():
            waiting_before = dict(table.waits)
            if commit.limits is not None and not table.commit(r, commit.limits, guarded):
                continue  # a conflict: ticked again later from fresh state
            node = commit.state.node_map()["call"]
            was = states[r].node_map()["call"]
            states[r] = commit.state
            if node.status is NodeStatus.DISPATCHED and was.status is not NodeStatus.DISPATCHED:
                let_in.append(clock)
            elif node.status is NodeStatus.LIMIT_WAIT and snapshot.version + 1 == table.version:
                # Turned away from a view that was the table's own: the window was full, or
                # an older waiter was still in line (one this batch did not let in).
                in_window = sum(1 for t in let_in if t > clock - per_ms)
                since = waiting_before.get(r, clock)
                older = [w for w, s in table.waits.items() if (s, w) < (since, r) and w != r]
                assert in_window >= limit or older, (in_window, older)
                assert node.due_ms is not None and node.due_ms > clock

    previous = table.copy()
    for picks, advance, stale in plan:
        clock += advance
        batch = [ids[i % runs] for i in dict.fromkeys(picks)]
        snapshot = (previous if stale else table).copy()
        previous = table.copy()
        tick(batch, snapshot)
    for _ in range(runs + 2):
        clock += per_ms
        for r in ids:
            tick([r], table.copy())
    let_in.sort()
    assert all(let_in[i + limit] - let_in[i] >= per_ms for i in range(len(let_in) - limit))
    assert len(let_in) == runs  # each run let in, once
    assert all(s.node_map()["call"].status is NodeStatus.DISPATCHED for s in states.values())
    assert not table.waits
    assert len(table.log) <= limit  # the rows kept: the last `limit` dispatches
