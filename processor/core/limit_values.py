"""The shapes the limits' decision (core/limits.py, whose rules these follow) exchanges with
the shell: the counters a dispatch needs room in (``Need``), what the shell loads of them
(``LimitView``, ``LimitInputs``) and what a run's commit writes of them (``Guard``,
``RunLimits``). Pure values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from processor.core.shapes import AttemptRef


class Need(NamedTuple):
    """One counter a dispatch must find room in."""

    key: str
    name: str  # the limit's name (a metric's label: bounded, unlike the key)
    limit: int
    per_ms: int  # a rate limit's window; 0 for a concurrency limit


class LimitView(NamedTuple):
    """A counter as loaded: its version (0: no row yet), the attempts holding it
    (concurrency), the times that bound its next dispatches (rate: ``bounds``) and the first
    waiters of its line, ``(since_ms, run_id, node)`` in the line's order (round-robin across
    their runs' keys, oldest first within one: core/limit_line.py), at most as many as can
    be let in (any waiter behind those cannot be let in before they are).

    A rate counter has counted ``dispatched`` dispatches; ``bounds[j]`` is the time of its
    dispatch number ``dispatched - span + j`` (0 when there is none: no bound), the one
    that bounds its ``j``-th next admission under a limit of ``span``."""

    version: int = 0
    holders: int = 0
    bounds: tuple[int, ...] = ()
    queue: tuple[tuple[int, str, str], ...] = ()
    dispatched: int = 0
    span: int = 0


class LimitInputs(NamedTuple):
    """What the shell loaded for the batch's runs with limited steps: each run's input values
    at the limits' paths, each counter those runs may use, and Postgres's time when it read
    the counters (epoch ms; 0: none read). The batch is judged at that time when it is later
    than its load's (core/batch.py): no dispatch is counted before one the counters already
    hold, so a rate counter's times rise with its numbers (core/limits.py, rule 5)."""

    values: Mapping[str, Mapping[tuple[str, ...], str]]
    views: Mapping[str, LimitView]
    now_ms: int = 0


NO_LIMITS = LimitInputs({}, {})


class Guard(NamedTuple):
    """A counter a commit counted on: written only if its version is still ``expected`` (it
    becomes expected + 1). A rate counter's: the times of the dispatches the batch let in
    (``times``), numbered from ``first``, and how many of its last dispatches it keeps."""

    key: str
    expected: int
    times: tuple[int, ...] | None = None
    first: int = 0
    keep: int = 0


class RunLimits(NamedTuple):
    """What one run's commit writes of its limits, besides its row."""

    guards: tuple[Guard, ...] = ()
    holds: tuple[tuple[str, str, int], ...] = ()  # (key, node, attempt) taking a slot
    releases: tuple[AttemptRef, ...] = ()  # attempts whose slots are freed
    waits: tuple[tuple[str, str, int], ...] = ()  # (key, node, since_ms) now waiting
    unwaits: tuple[str, ...] = ()  # nodes no longer waiting (let in)
    released: tuple[str, ...] = ()  # a key per slot freed for others: the waiters to wake
    ends: bool = False  # the run ended: every slot it holds and every wait of it goes
    waited: tuple[tuple[str, int], ...] = ()  # (limit name, ms) of each waiter let in
    refused: tuple[str, ...] = ()  # a limit name per dispatch it held back (a metric)
    run_key: str = ""  # the run's key, which its waits carry (core/limit_line.py)
