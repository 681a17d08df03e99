"""Hypothesis strategies and helpers shared by the unit tests of the pure core.

Workflows are random DAGs of 1 to 6 steps whose dependencies point only at earlier steps, with
random retry policies and timeouts. Runs are reached the way production reaches them: from the
initial state, by a random walk of ticks fed with the results a world of workers could have
produced (at most one result per (node, attempt), as the store's primary key guarantees).
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from processor.core.model import SignalKind, Started, StepOutcome, StepResult
from processor.core.run_ends import force_fail
from processor.core.run_state import NodeStatus, RunState, RunStatus, initial_state
from processor.core.tick import tick
from processor.core.tick_decision import Decision
from processor.core.workflow import parse_workflow
from processor.core.workflow_def import WorkflowDef

# Fast enough for the whole tests/unit suite to stay well under 30 s.
FAST = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# For properties that run jsonschema validation on every example (slower per example).
QUICK = settings(FAST, max_examples=80)

STEP_TYPES = ("fast", "slow", "flaky")
STEP_NAMES = ("fetch", "transform", "enrich", "publish", "a", "b-2", "c_3", "ünï")
UNKNOWN_NODE = "no-such-step"  # not one of STEP_NAMES
ERRORS = st.one_of(st.none(), st.text(max_size=20))


@st.composite
def retry_json(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "max_attempts": draw(st.integers(1, 4)),
        "backoff_ms": draw(st.integers(0, 500)),
        "backoff_multiplier": draw(st.sampled_from([1, 1.5, 2, 3.0])),
        "max_backoff_ms": draw(st.integers(0, 2_000)),
    }


@st.composite
def workflow_json(draw: st.DrawFn, max_steps: int = 6, compensate: bool = False) -> dict[str, Any]:
    """A valid workflow definition as JSON: a DAG whose deps only point at earlier steps
    (``compensate``: now and then a step with its compensation)."""
    n = draw(st.integers(1, max_steps))
    names = draw(st.permutations(STEP_NAMES))[:n]
    steps: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        step: dict[str, Any] = {"name": name, "type": draw(st.sampled_from(STEP_TYPES))}
        if i and draw(st.booleans()):
            step["depends_on"] = draw(st.lists(st.sampled_from(names[:i]), unique=True))
        if draw(st.integers(0, 4)):
            step["retry"] = draw(retry_json())
        if draw(st.integers(0, 4)):
            step["timeout_ms"] = draw(st.integers(1, 1_000))
        # Now and then the other timeouts (core/tick.py, rule 4).
        timeout = step.get("timeout_ms", 30_000)
        if timeout > 1 and not draw(st.integers(0, 5)):
            step["heartbeat_timeout_ms"] = draw(st.integers(1, timeout - 1))
        if not draw(st.integers(0, 5)):
            step["schedule_to_start_ms"] = draw(st.integers(1, 2_000))
        if not draw(st.integers(0, 5)):
            step["schedule_to_close_ms"] = draw(st.integers(1, 5_000))
        if compensate and draw(st.booleans()):  # its compensation (core/sagas.py)
            step["compensate"] = {"type": draw(st.sampled_from(STEP_TYPES))}
            if draw(st.booleans()):
                step["compensate"] |= {"retry": draw(retry_json()), "queue": "undo"}
            if draw(st.booleans()):
                step["compensate"] |= {"timeout_ms": 1_000, "heartbeat_timeout_ms": 500}
        steps.append(step)
    raw = {"name": draw(st.sampled_from(["wf", "orders", "etl"])), "version": 1, "steps": steps}
    if compensate and draw(st.booleans()):  # a failure handler (core/sagas.py)
        raw["on_failure"] = {"type": draw(st.sampled_from(STEP_TYPES))}
    match draw(st.integers(0, 2)):  # the declared output: none, one step's, or a mapping
        case 1:
            raw["output"] = draw(st.sampled_from(names))
        case 2:
            keys = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
            raw["output"] = draw(st.dictionaries(keys, st.sampled_from(names), min_size=1))
    return raw


workflows: st.SearchStrategy[WorkflowDef] = workflow_json().map(parse_workflow)


@dataclass(frozen=True)
class Run:
    """A reachable run: its workflow, its state, the time of its last tick, the results the
    store holds for it (every result the world produced so far, one per (node, attempt)), and
    what the workers recorded of the attempts they started (their last, by node)."""

    wf: WorkflowDef
    state: RunState
    now_ms: int
    stored: tuple[StepResult, ...]
    starts: tuple[tuple[str, Started], ...] = ()


@dataclass(frozen=True)
class TickInputs:
    results: tuple[StepResult, ...]
    signals: tuple[SignalKind, ...]
    now_ms: int
    started: dict[str, Started] = field(default_factory=dict)


def answer(rng: random.Random, node: str, attempt: int) -> StepResult:
    if rng.random() < 0.8:  # mostly successes, so runs get deep into their DAG
        return StepResult(node, attempt, StepOutcome.SUCCEEDED)
    error = rng.choice([None, "boom", f"attempt {attempt} failed", "ünïcode ✗"])
    return StepResult(node, attempt, StepOutcome.FAILED, error)


def answer_some(
    rng: random.Random, state: RunState, stored: dict[tuple[str, int], StepResult]
) -> None:
    """The world answers some of the attempts in flight (first answer per attempt wins)."""
    for name, node in state.nodes:
        if node.status is NodeStatus.DISPATCHED and rng.random() < 0.5:
            stored.setdefault((name, node.attempt), answer(rng, name, node.attempt))


def start_some(rng: random.Random, state: RunState, now: int, starts: dict[str, Started]) -> None:
    """Workers start some of the attempts in flight no worker started yet (a while before
    ``now``, or just now), and some of those they started record a heartbeat (most workers
    record them; one from before that does not, now and then)."""
    for name, node in state.nodes:
        if node.status is not NodeStatus.DISPATCHED:
            continue
        fact = starts.get(name)
        if fact is None or fact.attempt != node.attempt:
            if rng.random() < 0.5:
                at = now - rng.randint(0, 400)
                starts[name] = Started(node.attempt, at, None, rng.random() < 0.9)
        elif rng.random() < 0.4:
            starts[name] = fact._replace(beat_ms=max(fact.started_ms, now - rng.randint(0, 300)))


# The walk's coin flips come from a seeded Random rather than from individual draws: Hypothesis
# biases small integers towards their bounds, which would end most walks with a cancel.
seeds = st.integers(0, 2**32 - 1)


@st.composite
def runs(draw: st.DrawFn, *, live_only: bool = False, max_walk: int = 12) -> Run:
    wf = draw(workflows)
    rng = random.Random(draw(seeds))
    may_end = not live_only and draw(st.booleans())
    state = initial_state(wf)
    now = draw(st.integers(0, 10_000))
    stored: dict[tuple[str, int], StepResult] = {}
    starts: dict[str, Started] = {}
    for _ in range(rng.randint(0, max_walk)):
        answer_some(rng, state, stored)
        now += rng.randint(0, 50) if rng.random() < 0.7 else rng.randint(0, 1_500)
        start_some(rng, state, now, starts)
        cancel = may_end and rng.random() < 0.03
        signals = [SignalKind.CANCEL] if cancel else []
        decision = tick(state, wf, stored.values(), signals, now, started=dict(starts))
        if decision.new_state is not None:
            if decision.new_state.status.terminal and not (may_end and rng.random() < 0.3):
                break  # mostly stop just before the end: live runs are the interesting ones
            state = decision.new_state
        if may_end and rng.random() < 0.03:
            state = force_fail(state, "stuck") or state
        if live_only and state.status.terminal:
            break
    if live_only and state.status.terminal:
        # Ended during the walk: fall back to the state right after the first tick.
        first = tick(initial_state(wf), wf, (), (), now).new_state
        assert first is not None
        state = first
        stored = {}
        starts = {}
    return Run(wf, state, now, tuple(stored.values()), tuple(starts.items()))


@st.composite
def tick_inputs(draw: st.DrawFn, run: Run) -> TickInputs:
    """Plausible inputs of the next tick: every stored result, fresh answers to the attempts in
    flight, stale results of earlier attempts, a result for an unknown node, maybe a cancel."""
    rng = random.Random(draw(seeds))
    stored = {(r.node, r.attempt): r for r in run.stored}
    answer_some(rng, run.state, stored)
    for name, node in run.state.nodes:
        if node.attempt > 1 and rng.random() < 0.3:
            stale = rng.randint(1, node.attempt - 1)
            stored.setdefault((name, stale), answer(rng, name, stale))
    if rng.random() < 0.15:
        stored[(UNKNOWN_NODE, 1)] = answer(rng, UNKNOWN_NODE, 1)
    signals = (SignalKind.CANCEL,) if rng.random() < 0.1 else ()
    now = run.now_ms + (0 if rng.random() < 0.3 else rng.randint(0, 3_000))
    starts = dict(run.starts)
    start_some(rng, run.state, now, starts)
    if rng.random() < 0.1:  # one of an attempt the node moved on from (ignored)
        starts[UNKNOWN_NODE] = Started(1, now)
    return TickInputs(tuple(stored.values()), signals, now, starts)


@st.composite
def terminal_states(draw: st.DrawFn) -> tuple[WorkflowDef, RunState]:
    run = draw(runs())
    status = draw(st.sampled_from([RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED]))
    how = draw(st.sampled_from(["relabel", "cancel", "force_fail"]))
    state = run.state
    if how == "cancel":
        state = tick(state, run.wf, (), [SignalKind.CANCEL], run.now_ms).new_state or state
    elif how == "force_fail":
        state = force_fail(state, "livelock") or state
    if not state.status.terminal or how == "relabel":
        state = replace(state, status=status)
    return run.wf, state


any_results: st.SearchStrategy[list[StepResult]] = st.lists(
    st.builds(
        StepResult,
        node=st.one_of(st.sampled_from(STEP_NAMES), st.text()),
        attempt=st.integers(-1, 6),
        outcome=st.sampled_from(StepOutcome),
        error=ERRORS,
    ),
    max_size=8,
)


def check_decision(old: RunState, decision: Decision, wf: WorkflowDef) -> None:
    """Invariants every decision of the tick keeps."""
    new = decision.new_state
    if new is None:
        assert decision.dispatches == ()
        assert decision.timers == ()
        return
    assert new != old
    assert new.seq == old.seq + 1
    assert [n for n, _ in new.nodes] == [s.name for s in wf.steps]
    old_nodes = old.node_map()
    dispatched = {d.node: d for d in decision.dispatches}
    for step in wf.steps:
        before, after = old_nodes[step.name], new.node(step.name)
        assert after.attempt >= before.attempt
        assert after.attempt - after.attempts_before <= step.retry.max_attempts
        if step.name in dispatched:
            d = dispatched[step.name]
            assert after.status is NodeStatus.DISPATCHED
            assert (d.attempt, d.step_type) == (after.attempt, step.step_type)
            # Due at its first bound: its timeout from its dispatch, or sooner.
            assert after.due_ms is not None and after.due_ms <= d.deadline_ms
            assert d.attempt > before.attempt
        elif after.status is NodeStatus.DISPATCHED:
            # The same attempt, its due time where it was or later (rule 4 moved it).
            assert after.attempt == before.attempt
            assert before.due_ms is None or (after.due_ms or 0) >= before.due_ms
    # Timers: every retry wait this tick started has its wake-up; a timer is always the due
    # time of a node of the new state, never in the past.
    old_waits = {(n, s.attempt) for n, s in old.nodes if s.status is NodeStatus.RETRY_WAIT}
    for name, node in new.nodes:
        if node.status is NodeStatus.RETRY_WAIT and (name, node.attempt) not in old_waits:
            assert node.due_ms in decision.timers, (name, node, decision.timers)
    dues = {s.due_ms for _, s in new.nodes}
    assert all(t in dues for t in decision.timers)
    assert list(decision.timers) == sorted(set(decision.timers))
    if new.status.terminal:
        assert decision.dispatches == ()
        assert decision.timers == ()
        assert new.next_due_ms() is None
        assert all(
            s.status in {NodeStatus.SUCCEEDED, NodeStatus.FAILED, NodeStatus.CANCELLED}
            for _, s in new.nodes
        )
    assert (new.status is RunStatus.SUCCEEDED) == all(
        s.status is NodeStatus.SUCCEEDED for _, s in new.nodes
    )


def claimed_long_ago(state: RunState) -> dict[str, Started]:
    """Every attempt in flight started by a worker long before anything (a worker that takes
    each task at once, and an attempt that does not answer in time): the tick times each out
    when its due time passes, as if its timeout counted from its dispatch."""
    return {
        name: Started(node.attempt, -(10**12), None, False)
        for name, node in state.nodes
        if node.status is NodeStatus.DISPATCHED
    }


def with_duplicates(results: Iterable[StepResult], dup_mask: Iterable[bool]) -> list[StepResult]:
    base = list(results)
    return base + [r for r, dup in zip(base, dup_mask, strict=False) if dup]


# -- hostile JSON: what a careless or hostile sender gives a door (core/bounds.py) ------------

# Text as a sender may write it: any character, NUL, a lone surrogate, a quote or a backslash.
_NASTY_CHARS = st.sampled_from(["\x00", "\ud800", "\udfff", '"', "\\", "\n", "é", "💥", "u0000"])
hostile_text = st.one_of(
    st.text(max_size=12),
    st.lists(st.one_of(_NASTY_CHARS, st.characters()), max_size=8).map("".join),
)
# Integers around the 64-bit range JSON is stored in, and far past it.
hostile_integers = st.one_of(
    st.integers(-(2**63) - 2, -(2**63) + 2),
    st.integers(2**63 - 2, 2**64 + 2),
    st.integers(-(2**70), 2**70),
    st.sampled_from([10**30, -(10**30), 2**200, 10**400]),
    st.integers(-1000, 1000),
)
hostile_scalars = st.one_of(
    st.none(),
    st.booleans(),
    hostile_integers,
    st.floats(allow_nan=True, allow_infinity=True),
    hostile_text,
    st.sampled_from([{1, 2}, b"bytes", frozenset(), object()]),  # no JSON form
)
# Keys a Python value may have: strings (with NUL, surrogates), and what is not a string.
hostile_keys = st.one_of(hostile_text, st.integers(-3, 3), st.none(), st.booleans())


# Storable JSON: what orjson reads and writes and Postgres stores (no NUL, no lone
# surrogate, integers in 64 bits), with brackets inside strings too (they look like nesting).
_STORABLE_TEXT = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=10),
    st.sampled_from(["[[", "]]", "{", "}", "[{]", "\\u0000"]),
)


def json_values(max_leaves: int = 12) -> st.SearchStrategy[Any]:
    return st.recursive(
        st.one_of(
            st.none(),
            st.booleans(),
            st.integers(-(2**63), 2**64 - 1),
            st.floats(allow_nan=False, allow_infinity=False),
            _STORABLE_TEXT,
        ),
        lambda inner: st.one_of(
            st.lists(inner, max_size=5), st.dictionaries(_STORABLE_TEXT, inner, max_size=5)
        ),
        max_leaves=max_leaves,
    )


def nest(value: Any, depth: int, shape: str) -> Any:
    """``value`` inside ``depth`` containers: lists, objects, or both in turn."""
    for level in range(depth):
        in_list = shape == "list" or (shape == "mixed" and level % 2 == 1)
        value = [value] if in_list else {"k": value}
    return value


@st.composite
def hostile_values(draw: st.DrawFn) -> Any:
    """A Python value a step may return or a client may be given: scalars of every kind,
    wide lists and objects, tuples, nested 0 to 300 levels (around 64 and 254, orjson's own
    limit), sometimes a cycle."""
    leaf = st.recursive(
        hostile_scalars,
        lambda inner: st.one_of(
            st.lists(inner, max_size=6),
            st.lists(inner, max_size=4).map(tuple),
            st.dictionaries(hostile_keys, inner, max_size=5),
        ),
        max_leaves=20,
    )
    value = draw(leaf)
    depth = draw(st.one_of(st.integers(0, 3), st.sampled_from([62, 63, 64, 65, 253, 254, 300])))
    value = nest(value, depth, draw(st.sampled_from(["list", "dict", "mixed"])))
    if draw(st.integers(0, 19)) == 0:  # a cycle: a list that holds itself
        cycle: list[Any] = [value]
        cycle.append(cycle)
        return cycle
    return value


def _json_text(value: str) -> bytes:
    """A string as a JSON text writes it, escapes included (a lone surrogate as \\udxxx)."""
    return json.dumps(value).encode()


@st.composite
def hostile_json_bytes(draw: st.DrawFn) -> bytes:
    """Raw JSON text as a wire sender may write it: nested deep, keys given twice, integer
    literals past 64 bits, escaped NUL and lone surrogates, bytes that are not UTF-8, long
    strings, and text that is not JSON at all."""
    atoms = st.one_of(
        st.sampled_from(
            [
                b"1",
                b"-0",
                b"1.5e308",
                b"1e400",
                b"18446744073709551615",
                b"18446744073709551616",
                b"-9223372036854775809",
                b"123456789012345678901234567890",
                b'"\\u0000"',
                b'"\\ud800"',
                b'"\\udc00x"',
                b'"\\ud83d\\udca5"',
                b'"\xff\xfe"',
                b'"\xed\xa0\x80"',
                b"null",
                b"true",
                b"NaN",
                b'"12345678901234567890123"',
            ]
        ),
        hostile_text.map(_json_text),
        st.integers(1, 5000).map(lambda n: b'"' + b"x" * n + b'"'),
    )

    def pair(key: bytes, value: bytes) -> bytes:
        return key + b":" + value

    def composite(inner: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
        keys = st.one_of(st.sampled_from([b'"a"', b'"a"', b'"\\u0000"', b'"b"']), atoms)
        return st.one_of(
            st.lists(inner, max_size=5).map(lambda xs: b"[" + b",".join(xs) + b"]"),
            st.lists(st.tuples(keys, inner), max_size=5).map(
                lambda kvs: b"{" + b",".join(pair(k, v) for k, v in kvs) + b"}"
            ),
        )

    body = draw(st.recursive(atoms, composite, max_leaves=12))
    depth = draw(st.one_of(st.integers(0, 2), st.sampled_from([63, 64, 65, 254, 300, 1030])))
    if draw(st.booleans()):
        body = b'{"k":' * depth + body + b"}" * depth
    else:
        body = b"[" * depth + body + b"]" * depth
    return body


def hostile_request(kind: str, field: bytes, run_id: str = "r-1") -> bytes:
    """A request record (start or signal) whose input or payload is ``field``, raw."""
    if kind == "start":
        head = b'{"request_version":1,"kind":"start","workflow":"w","run_id":'
        return head + _json_text(run_id) + b',"input":' + field + b"}"
    head = b'{"request_version":1,"kind":"signal","name":"go","signal_id":"s","run_id":'
    return head + _json_text(run_id) + b',"payload":' + field + b"}"
