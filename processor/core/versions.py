"""Versions of step code: which version of a step type's function each run runs.

A worker registers each function with its version (``@registry.step("charge", version=2)``,
1 by default), and says in the instance registry which it serves, each as a key: the type
alone for version 1 (what a worker from before versions says, and means), ``type@N`` for
version N. A run keeps the versions it started with (its pins) until an operator moves them
(`ductor runs upgrade`), so a deploy never changes the code of a step under a running run.
The rules:

1. The tick that starts a run (core/tick.py; any tick of a pending run that never ran: a
   failed run retried goes back to pending while it waits for its key, core/run_keys.py,
   and keeps its pins) pins each of its steps a worker runs (task and map steps): the
   version the step declares (``"version"``), else the newest version the live workers of
   the step's queue serve of its type (the shell reads them from the registry:
   ``ServedVersions``), else 1.
2. A running run's pins never change in a tick; a pin absent from the state is version 1
   (a run from before versions ran every step at version 1). Only the pins other than 1 are
   stored, in their steps' entries of ``node_states`` (``"version"``), so older states keep
   their checksum.
3. Every task of a step carries its pin (core/step_task.py), the items of a map step their
   map's; a worker runs it only with the function of that version, or hands it to one that
   has it (core/handback.py, with the served key).
4. An upgrade (``upgrade``) moves the pins of a live run's steps of one type (or of every
   type) to a version, or to the newest served; it is committed like any transition, on the
   run's version, and takes effect from the next attempt: an attempt in flight keeps its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from processor.core.run_state import RunState
from processor.core.workflow_def import MAX_STEP_VERSION, StepDef, WorkflowDef

# (queue, step type) -> the newest version the live workers of that queue serve, when past 1.
ServedVersions = Mapping[tuple[str, str], int]

# A run's pins as its state holds them: (step name, version), in definition order, only those
# other than 1.
Pins = tuple[tuple[str, int], ...]

NO_PINS: Pins = ()
VERSION_MARK = "@"


def served_key(step_type: str, version: int) -> str:
    """What a worker says it serves of ``step_type`` at ``version``: the type alone for 1."""
    return step_type if version == 1 else f"{step_type}{VERSION_MARK}{version}"


def parse_served(key: str) -> tuple[str, int]:
    """(step type, version) of a served key; a key without a version mark is version 1."""
    step_type, mark, version = key.rpartition(VERSION_MARK)
    if mark and version.isdigit() and step_type and 1 <= int(version) <= MAX_STEP_VERSION:
        return step_type, int(version)
    return key, 1


def newest_served(
    workers: Iterable[tuple[Iterable[str], Iterable[str]]],
) -> dict[tuple[str, str], int]:
    """The newest version of each (queue, step type) among live workers, each given as (its
    queues, its served keys), past 1 only (a type absent is served at 1, or not at all: a run
    pins 1 either way)."""
    newest: dict[tuple[str, str], int] = {}
    for queues, keys in workers:
        served = [parse_served(key) for key in keys]
        for queue in queues:
            for step_type, version in served:
                if version > newest.get((queue, step_type), 1):
                    newest[(queue, step_type)] = version
    return newest


def runs_code(step: StepDef) -> bool:
    """Whether a worker runs a function for ``step`` (a task step, or a map's items)."""
    return step.runs_on_a_worker or step.maps


def pin_versions(wf: WorkflowDef, served: ServedVersions) -> Pins:
    """Rule 1: the pins of a run of ``wf`` starting now."""
    if not served and not wf.declares_versions:
        return NO_PINS  # (the common case: no worker serves a version past 1)
    pins = []
    for step in wf.code_steps:
        version = step.version
        if version is None:
            version = served.get((step.queue, step.step_type), 1)
        if version != 1:
            pins.append((step.name, version))
    return tuple(pins)


def pinned(state: RunState, wf: WorkflowDef, served: ServedVersions | None) -> RunState:
    """``state`` (a pending run's) with its pins as rule 1 sets them (``served`` None: the
    shell read none, so the steps' own versions and 1)."""
    pins = pin_versions(wf, {} if served is None else served)
    if pins is state.versions or pins == state.versions:
        return state
    if any(node.attempt for _, node in state.nodes):
        # It ran before: a failed run retried, pending again until its key has room
        # (core/run_keys.py). It keeps the versions it started with.
        return state
    return RunState(state.status, state.nodes, state.seq, state.reason, state.maps, pins)


def pin_of(pins: Pins, step: str) -> int:
    """The version step ``step`` (a map's own name for its items) runs."""
    for name, version in pins:
        if name == step:
            return version
    return 1


class PinMove(NamedTuple):
    """One step's pin moved by an upgrade."""

    step: str
    step_type: str
    old: int
    new: int


def upgrade(
    wf: WorkflowDef,
    pins: Pins,
    served: ServedVersions,
    step_type: str | None,
    to_version: int | None,
) -> tuple[Pins, tuple[PinMove, ...]]:
    """Rule 4: the pins after moving those of ``step_type`` (None: every type) to
    ``to_version`` (None: the newest version served, 1 when none is), and what moved."""
    kept = dict(pins)
    moves = []
    for step in wf.steps:
        if not runs_code(step) or (step_type is not None and step.step_type != step_type):
            continue
        old = kept.get(step.name, 1)
        new = to_version
        if new is None:
            new = served.get((step.queue, step.step_type), 1)
        if new != old:
            moves.append(PinMove(step.name, step.step_type, old, new))
            kept[step.name] = new
    ordered = tuple((s.name, kept[s.name]) for s in wf.steps if kept.get(s.name, 1) != 1)
    return ordered, tuple(moves)


def step_versions(wf: WorkflowDef, pins: Pins) -> dict[str, int]:
    """Every step a worker runs, with the version its run pinned (what inspect shows)."""
    return {s.name: pin_of(pins, s.name) for s in wf.steps if runs_code(s)}
