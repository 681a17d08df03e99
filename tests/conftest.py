"""What every test session says first: which build of the package it tests. A wheel (or a
checkout after `make compile`) carries compiled modules (setup.py);
DUCTOR_PURE_PYTHON=1 makes the package import its .py sources instead (processor/__init__.py).

The integration tests' fixtures and hooks are plugins by concern, registered here (pytest takes
``pytest_plugins`` only from the top conftest): the services and a test's share of them, child
processes, in-process instances, the browser, the session's serial marks and builds, a user's
shell. The functions tests call live in plain modules beside them (tests/integration/waiting.py,
samples.py, runs.py, children.py, instances.py, contention.py, telemetry_capture.py); no test
imports from a conftest (tests/unit/test_no_conftest_imports.py).
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Iterator

import pytest
from hypothesis import settings

import processor
from processor.io.telemetry.logs import HANDLER_NAME

# No deadline per example: a shared machine under load (CI's phases overlap) made a 20 ms
# example take 253 ms and fail a property that holds; speed is the benchmark's business.
settings.register_profile("ductor", deadline=None)
settings.load_profile("ductor")

pytest_plugins = [
    "tests.integration.fix_session",
    "tests.integration.fix_services",
    "tests.integration.fix_children",
    "tests.integration.fix_instances",
    "tests.integration.fix_browser",
    "tests.integration.user_shell",
]


def pytest_report_header(config: pytest.Config) -> str:
    for name in ("processor.core.tick", "processor.engine.executor", "processor.io.postgres.store"):
        importlib.import_module(name)
    compiled = processor.compiled_modules()
    if compiled:
        return f"ductor build: compiled ({len(compiled)} of its modules imported so far)"
    why = " (DUCTOR_PURE_PYTHON)" if processor.pure_python_selected() else ""
    return f"ductor build: pure Python{why}"


@pytest.fixture(autouse=True)
def _command_logging_removed() -> Iterator[None]:
    """A test that runs a command in process gets the command's logging (io/telemetry/logs.py: a
    handler on the stderr of that moment, pytest's capture, closed after the test). Left on
    the root logger, it made a later test's threads write "--- Logging error ---" tracebacks
    into the output; it is removed, and the root's level restored, after each test."""
    root = logging.getLogger()
    level = root.level
    yield
    root.handlers[:] = [h for h in root.handlers if h.get_name() != HANDLER_NAME]
    root.setLevel(level)
