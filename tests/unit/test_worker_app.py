"""`--app` names a StepRegistry or a code-first Workflow carrying one (worker/app.py), and
nothing else: the worker tells them apart without importing the authoring layer above it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from processor.worker.app import AppError, load_registry

MODULE = """
from processor import StepContext, StepRegistry, Workflow

flow = Workflow("checkout", version=1)


@flow.step
def charge(ctx: StepContext) -> dict[str, str]:
    return {}


registry = StepRegistry()


@registry.step("ship")
def ship(ctx: StepContext) -> dict[str, str]:
    return {}


class Holder:
    registry = "not a registry"


holder = Holder()
"""


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    (tmp_path / "app_under_test.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    yield "app_under_test"
    sys.modules.pop("app_under_test", None)


def test_a_workflow_gives_the_registry_it_carries(app: str) -> None:
    assert load_registry(f"{app}:flow").types() == ["charge"]


def test_a_registry_is_itself(app: str) -> None:
    assert load_registry(f"{app}:registry").types() == ["ship"]


def test_anything_else_is_refused(app: str) -> None:
    with pytest.raises(AppError, match="is a Holder, not a StepRegistry"):
        load_registry(f"{app}:holder")
