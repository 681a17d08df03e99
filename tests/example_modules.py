"""An example's Python module (examples/*/...) loaded by its path, as a unit test reads it
without the example's directory on sys.path."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def example_module(relative: str, name: str) -> ModuleType:
    """The module at ``examples/<relative>``, loaded under ``name``."""
    spec = importlib.util.spec_from_file_location(name, REPO / "examples" / relative)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
