"""A run's attempts on a time axis, for its page (pure: ``now`` is an argument, no I/O).

One lane per node (a step, or an item of a map step), in the order of the run's nodes; on it a
bar per attempt from its start (a worker's claim) to its end (its result), drawn in its
outcome's colour, and between the bars what the step waited for:

- an attempt that has no result yet runs to ``now`` while it is the node's attempt in flight;
  one that was superseded without a result (timed out, or its worker was lost) is drawn
  failed up to the next attempt's start, since it ended no later than that;
- a wait step and a child workflow have no claim: their bar starts when their dependencies had
  all ended (when the coordinator could start them; the run's creation for a first step) and
  ends at their result, or runs to ``now`` while they wait;
- the time from one attempt's end to the next one's start (the retry's backoff and the time in
  the queue) is a dashed line, and so is the time from when a step could start to its first
  attempt's start (the queue), and a node waiting now: for its retry (to its due time), for a
  limit's slot, or in the queue for a worker.

The axis runs from the run's creation to its last change (or ``now``, or the due time of a
retry, while it is live). Times are the ISO strings of `inspect -o json`'s document
(io/postgres/run_document.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

LABEL_W = 200  # the lanes' names
PLOT_W = 920  # the time axis
LANE_H = 24
BAR_H = 14
AXIS_H = 22  # the tick labels above the lanes
PAD = 8
MIN_BAR_W = 3.0  # an attempt of a millisecond is still seen
MAX_LANES = 40  # a map of a thousand items: its first lanes, and how many more there are
TICKS = 5

_LIVE = ("pending", "running")


@dataclass(frozen=True)
class Bar:
    """One attempt, or a claimless step's wait: ``x``, ``width`` in SVG user units."""

    node: str
    attempt: int
    x: float
    width: float
    state: str  # succeeded, failed, lost (no result, superseded), running, waiting
    title: str


@dataclass(frozen=True)
class Gap:
    """A wait on a lane: between attempts (``retry``), or now (``retry_wait``, ``limit_wait``,
    ``queued``)."""

    node: str
    x1: float
    x2: float
    kind: str
    title: str


@dataclass(frozen=True)
class NodeLane:
    node: str
    y: int
    bars: tuple[Bar, ...]
    gaps: tuple[Gap, ...]


@dataclass(frozen=True)
class Tick:
    x: float
    label: str


@dataclass(frozen=True)
class Timeline:
    width: int
    height: int
    lanes: tuple[NodeLane, ...]
    ticks: tuple[Tick, ...]
    more_lanes: int  # lanes not drawn (past MAX_LANES)
    span_s: float


def _at(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text).timestamp()


def _after(
    step: Mapping[str, Any] | None, ends: Mapping[str, float], created: float
) -> float | None:
    """When a step could start: its dependencies' last end (None while one has not ended)."""
    if step is None:
        return None
    times = [ends.get(d) for d in step["after"]]
    if any(t is None for t in times):
        return None
    return max((t for t in times if t is not None), default=created)


def _step_of(node: str, steps: Mapping[str, Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The step a node is of: its own, or its map step's (``resize[3]``)."""
    return steps.get(node) or steps.get(node.split("[", 1)[0])


@dataclass(frozen=True)
class _Scale:
    """Epoch seconds to x, clamped to the axis."""

    start: float
    end: float

    @property
    def span(self) -> float:
        return max(self.end - self.start, 0.001)

    def __call__(self, t: float) -> float:
        return LABEL_W + (min(max(t, self.start), self.end) - self.start) / self.span * PLOT_W


def timeline(document: Mapping[str, Any], now: float) -> Timeline | None:
    """The run's timeline (``now``: epoch seconds); None for a run whose row cannot be loaded
    or that has no node yet."""
    if "nodes" not in document:
        return None
    steps = {s["name"]: s for s in document.get("steps", [])}
    nodes = {n["node"]: n for n in document["nodes"]}
    attempts: dict[str, list[Mapping[str, Any]]] = {}
    for a in document.get("attempts", []):
        attempts.setdefault(a["node"], []).append(a)
    order = [n["node"] for n in document["nodes"]]
    order += sorted(set(attempts) - set(nodes))
    if not order:
        return None
    created = _at(document["created_at"]) or now
    live = document["status"] in _LIVE
    ends = _last_ends(attempts, nodes)
    for name, step in steps.items():  # a map step ended with its last item
        items = [t for n, t in ends.items() if n.startswith(f"{name}[")]
        if step["kind"] == "map" and items and nodes.get(name, {}).get("status") == "succeeded":
            ends[name] = max(items)
    x = _axis(document, nodes, attempts, ends, created, now)
    until = now if live else x.end
    lanes = []
    for index, node in enumerate(order[:MAX_LANES]):
        rows = sorted(attempts.get(node, []), key=lambda a: int(a["attempt"]))
        state = nodes.get(node, {})
        step = _step_of(node, steps)
        ready = _after(step, ends, created)
        kind = "task" if step is None or node != step["name"] else str(step["kind"])
        bars: list[Bar] = []
        gaps: list[Gap] = []
        if kind == "map":
            bars = _map_lane(node, state, nodes, ends, ready, until, x)
        else:
            bars, gaps, last_end = _lane(node, rows, state, until, x, ready)
            since = ready if last_end is None else last_end
            gaps += _waiting(node, kind, rows, state, until, x, since)
        y = AXIS_H + PAD + index * LANE_H
        lanes.append(NodeLane(node, y, tuple(bars), tuple(gaps)))
    ticks = tuple(
        Tick(LABEL_W + i * PLOT_W / (TICKS - 1), "+" + _duration(x.span * i / (TICKS - 1)))
        for i in range(TICKS)
    )
    height = AXIS_H + 2 * PAD + len(lanes) * LANE_H
    more = max(len(order) - MAX_LANES, 0)
    return Timeline(LABEL_W + PLOT_W + PAD, height, tuple(lanes), ticks, more, x.span)


def _last_ends(
    attempts: Mapping[str, Sequence[Mapping[str, Any]]], nodes: Mapping[str, Mapping[str, Any]]
) -> dict[str, float]:
    """Each node's last end (none for a node pending again after a resume): a step without
    a claim starts at its dependencies'."""
    ends: dict[str, float] = {}
    for node, rows in attempts.items():
        done = [t for t in (_at(a["ended"]) for a in rows) if t is not None]
        if done and nodes.get(node, {}).get("status") != "pending":
            ends[node] = max(done)
    return ends


def _axis(
    document: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
    attempts: Mapping[str, Sequence[Mapping[str, Any]]],
    ends: Mapping[str, float],
    created: float,
    now: float,
) -> _Scale:
    """From the run's creation (or an earlier claim: clocks differ) to its last change, or
    while it is live to ``now`` or the latest retry's due time."""
    end = max([_at(document["updated_at"]) or created, *ends.values()])
    if document["status"] in _LIVE:
        dues = [_at(n.get("due")) for n in nodes.values() if n["status"] == "retry_wait"]
        end = max([now, *(d for d in dues if d is not None)])
    start = min([created, *(t for rows in attempts.values() for t in _starts(rows))])
    return _Scale(start, max(end, start))


def _starts(rows: Sequence[Mapping[str, Any]]) -> list[float]:
    return [t for t in (_at(a["started"]) for a in rows) if t is not None]


def _lane(
    node: str,
    rows: Sequence[Mapping[str, Any]],
    state: Mapping[str, Any],
    now: float,
    x: _Scale,
    ready: float | None,
) -> tuple[list[Bar], list[Gap], float | None]:
    """A node's attempts as bars, the waits between them, and its last attempt's end."""
    bars: list[Bar] = []
    gaps: list[Gap] = []
    status, current = state.get("status"), state.get("attempt")
    previous_end: float | None = None
    for i, a in enumerate(rows):
        started, ended = _at(a["started"]), _at(a["ended"])
        if started is None:  # a wait or a child run: from when it could start
            started = ended if ready is None else min(ready, ended or ready)
        if started is None:
            continue
        if previous_end is not None and started > previous_end:
            wait = f"{_duration(started - previous_end)} before attempt {a['attempt']}"
            gaps.append(Gap(node, x(previous_end), x(started), "retry", wait))
        elif previous_end is None and ready is not None and started > ready:
            wait = f"{_duration(started - ready)} from ready to its first start (the queue)"
            gaps.append(Gap(node, x(ready), x(started), "queued", wait))
        if ended is not None:
            outcome = str(a["outcome"] or "succeeded")
        elif a["attempt"] == current and status == "dispatched":
            outcome, ended = "running", now
        else:  # superseded without a result: ended no later than the next attempt began
            later = _starts(rows[i + 1 :])
            outcome, ended = "lost", (later[0] if later else now)
        if a["started"] is None and outcome == "succeeded":
            outcome = "waited"
        bars.append(_bar(node, a, started, ended, outcome, x))
        previous_end = ended
    return bars, gaps, previous_end


def _waiting(
    node: str,
    kind: str,
    rows: Sequence[Mapping[str, Any]],
    state: Mapping[str, Any],
    now: float,
    x: _Scale,
    since: float | None,
) -> list[Gap]:
    """What the node waits for now, from its last attempt's end (or from when it could
    start): its retry's due time, a slot of its limit, a worker; a wait step its signal and
    a child workflow its run (drawn as a gap of their own)."""
    status, current = state.get("status"), state.get("attempt")
    in_flight = status == "dispatched" and (not rows or rows[-1]["attempt"] != current)
    if since is None or not (in_flight or status in ("retry_wait", "limit_wait")):
        return []
    if status == "retry_wait":
        due = _at(state.get("due"))
        return [Gap(node, x(since), x(max(due or now, now)), "retry_wait", "waiting to retry")]
    if status == "limit_wait":
        return [Gap(node, x(since), x(now), "limit_wait", "waiting for a slot of its limit")]
    if kind == "wait":
        return [Gap(node, x(since), x(now), "waiting", "waiting for its signal")]
    if kind == "workflow":
        return [Gap(node, x(since), x(now), "waiting", "waiting for its child run")]
    return [Gap(node, x(since), x(now), "queued", "in the queue for a worker")]


def _map_lane(
    node: str,
    state: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
    ends: Mapping[str, float],
    ready: float | None,
    now: float,
    x: _Scale,
) -> list[Bar]:
    """A map step: one bar from when it could start to its last item's end (``now`` while
    it runs), failed when an item failed."""
    if ready is None or not state.get("attempt"):
        return []
    items = [n for n in nodes if n.startswith(f"{node}[")]
    status = str(state.get("status"))
    if any(nodes[i].get("status") == "failed" for i in items):
        status = "failed"
    item_ends = [ends[i] for i in items if i in ends]
    until = now if status == "dispatched" else max(item_ends, default=ready)
    shown = {"dispatched": "running"}.get(status, status)
    what = {"attempt": state.get("attempt"), "started": None, "worker": None, "error": None}
    return [_bar(node, what, ready, until, shown, x)]


def _bar(
    node: str, a: Mapping[str, Any], started: float, ended: float, kind: str, x: _Scale
) -> Bar:
    x1, x2 = x(started), x(ended)
    width = max(x2 - x1, MIN_BAR_W)
    worker = f" on {a['worker']}" if a.get("worker") else ""
    words = {
        "lost": "no result: timed out or its worker was lost",
        "running": "running",
        "waited": "waited",
    }.get(kind, kind)
    title = f"{node} attempt {a['attempt']}{worker}: {words}, {_duration(ended - started)}"
    if a.get("error"):
        title += f" ({a['error']})"
    return Bar(node, int(a["attempt"]), x1, width, kind, title)


def _duration(seconds: float) -> str:
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
