"""The dataclasses of the compiled modules whose ``__init__`` is written out (the decorator's
own is interpreted Python even in the compiled build, ~20 x dearer than a compiled one: the
hot ones write theirs) take exactly their fields, in order, with the fields' defaults, so
that ``dataclasses.replace``, positional and keyword construction behave as the decorator's
would. Checked for every dataclass of those modules, on both builds."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

import pytest

from processor.core.model import LoadedRun, StepOutcome, StepResult
from processor.core.run_state import RunState, RunStatus
from processor.core.step_task import StepTask
from processor.core.workflow_def import StepDef, WorkflowDef
from tests.compiled import compiled_module_names


def _dataclasses() -> list[type]:
    found = []
    for name in compiled_module_names():
        module = importlib.import_module(name)
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and dataclasses.is_dataclass(value)
                and value.__module__ == name
            ):
                found.append(value)
    return found


FACTORY = object()  # a default made by a factory


def _expected(cls: type) -> list[tuple[str, Any]]:
    """(name, default) of each parameter the decorator's ``__init__`` would take."""
    out = []
    for f in cls.__dataclass_fields__.values():  # type: ignore[attr-defined]
        if f._field_type is dataclasses._FIELD_CLASSVAR or not f.init:  # type: ignore[attr-defined]
            continue
        if f.default is not dataclasses.MISSING:
            default: Any = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = FACTORY
        else:
            default = inspect.Parameter.empty
        out.append((f.name, default))
    return out


def _actual(cls: type) -> list[tuple[str, Any]]:
    try:
        params = list(inspect.signature(cls).parameters.values())
    except ValueError:  # a compiled class may not say (LoadedRun): the pure build's run checks
        pytest.skip(f"{cls.__qualname__} has no signature in this build")
    return [(p.name, p.default) for p in params]


CLASSES = _dataclasses()


def test_the_compiled_modules_hold_dataclasses() -> None:
    names = {c.__qualname__ for c in CLASSES}
    assert {"RunState", "StepResult", "LoadedRun", "Plan", "Commit", "Send"} <= names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: f"{c.__module__}.{c.__qualname__}")
def test_init_takes_exactly_the_fields(cls: type) -> None:
    expected, actual = _expected(cls), _actual(cls)
    assert [n for n, _ in actual] == [n for n, _ in expected]
    for (name, want), (_, got) in zip(expected, actual, strict=True):
        if want is FACTORY:
            # the decorator's signature shows its marker; a written-out one, some default
            assert got is not inspect.Parameter.empty, name
        else:
            assert got == want and type(got) is type(want), (name, got, want)


def test_written_out_inits_set_every_field_and_stay_frozen() -> None:
    wf = WorkflowDef("w", 1, (StepDef("a", "t"),))
    state = RunState(RunStatus.PENDING, ())
    result = StepResult("a", 2, StepOutcome.FAILED, "boom", False, 3)
    assert (result.node, result.attempt, result.outcome) == ("a", 2, StepOutcome.FAILED)
    assert (result.error, result.retryable, result.length) == ("boom", False, 3)
    run = LoadedRun("r", wf, state, 7, "t1", (result,), stored_checksum="nope")
    assert (run.run_id, run.wf, run.state, run.version, run.tier) == ("r", wf, state, 7, "t1")
    assert run.results == (result,) and run.checksum_ok is False
    assert LoadedRun("r", wf, state, 7, "t1", verified=True).checksum_ok is True
    assert dataclasses.replace(run, version=8).version == 8
    task = StepTask("r", "a", 1, "t", 5, data=None, item=None)
    assert dataclasses.replace(task, attempt=2) == StepTask("r", "a", 2, "t", 5)
    for value in (state, result, run, task):
        with pytest.raises(dataclasses.FrozenInstanceError):
            object.__getattribute__(type(value), "__setattr__")(value, "seq", 1)
