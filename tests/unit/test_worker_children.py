"""Where a worker's child processes import its steps from (worker/app.py ``child_spec``): the
``--app`` spec, the module attribute that holds a registry built in Python, the samples, or
an error that says what to give when no child could import it."""

from __future__ import annotations

import pytest

from processor.worker import StepContext, StepRegistry, sample_registry
from processor.worker.app import AppError, child_spec

REGISTRY = StepRegistry()


@REGISTRY.step("noop")
def _noop(ctx: StepContext) -> None:
    return None


def test_the_app_spec_is_used_as_given() -> None:
    assert child_spec(REGISTRY, "my_steps:registry") == "my_steps:registry"


def test_a_registry_held_by_an_imported_module_is_found_there() -> None:
    assert child_spec(REGISTRY, None) == f"{__name__}:REGISTRY"


def test_the_sample_steps_need_no_spec() -> None:
    assert child_spec(sample_registry(), None) is None


def test_a_registry_no_module_holds_is_refused_saying_what_to_give() -> None:
    local = StepRegistry()

    @local.step("noop")
    def noop(ctx: StepContext) -> None:
        return None

    with pytest.raises(AppError, match=r"MODULE:ATTRIBUTE \(WorkerOptions.app, --app\)"):
        child_spec(local, None)
