"""What users import from the package root (processor/__init__.py): the names are pinned here,
each is the object of the module that defines it, and importing the root loads none of them
until they are used (`python -m processor` must run processor/cli/early_stop.py first)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import processor

REPO = Path(__file__).resolve().parents[2]
EXPORTS = {
    "Compensate": "processor.authoring",
    "Concurrency": "processor.authoring",
    "ConfigError": "processor.io.config.settings",
    "NonRetryable": "processor.worker.steps",
    "RateLimit": "processor.authoring",
    "Retry": "processor.authoring",
    "RunStatus": "processor.core.run_state",
    "Settings": "processor.io.config.settings",
    "SignalKind": "processor.core.model",
    "StepContext": "processor.worker.steps",
    "StepFailed": "processor.worker.steps",
    "StepRegistry": "processor.worker.steps",
    "Worker": "processor.worker.worker",
    "WorkerOptions": "processor.worker.options",
    "Workflow": "processor.authoring",
    "client": "processor.client",
    "load_settings": "processor.io.config.settings",
}


def test_the_public_names_are_pinned() -> None:
    assert processor.__all__ == sorted(EXPORTS)
    assert set(processor.__all__) <= set(dir(processor))


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_each_name_is_the_object_of_its_module(name: str) -> None:
    home = importlib.import_module(EXPORTS[name])
    expected = home if home.__name__ == f"processor.{name}" else getattr(home, name)
    assert getattr(processor, name) is expected


def test_a_star_import_gives_exactly_the_public_names() -> None:
    namespace: dict[str, object] = {}
    exec("from processor import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == processor.__all__


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'StepRegistery'"):
        _ = processor.StepRegistery  # type: ignore[attr-defined]
    with pytest.raises(ImportError):
        exec("from processor import StepRegistery", {})


def test_importing_the_root_loads_nothing_else() -> None:
    code = (
        "import sys, processor; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('processor', 'psycopg', 'confluent_kafka', 'opentelemetry', 'orjson')))"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert shown.stdout.strip() == "['processor', 'processor.build']"  # the build's finder
