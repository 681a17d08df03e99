"""What every test session says first: which build of the package it tests. A wheel (or a
checkout after `make compile`) carries compiled modules (setup.py);
DUCTOR_PURE_PYTHON=1 makes the package import its .py sources instead (processor/__init__.py).
"""

from __future__ import annotations

import importlib

import pytest

import processor


def pytest_report_header(config: pytest.Config) -> str:
    for name in ("processor.core.tick", "processor.engine.executor", "processor.io.store"):
        importlib.import_module(name)
    compiled = processor.compiled_modules()
    if compiled:
        return f"ductor build: compiled ({len(compiled)} of its modules imported so far)"
    why = " (DUCTOR_PURE_PYTHON)" if processor.pure_python_selected() else ""
    return f"ductor build: pure Python{why}"
