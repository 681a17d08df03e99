"""No test module imports from a conftest: fixtures and hooks come from the plugins that
tests/conftest.py registers, and the functions tests call from plain helper modules. A
conftest imported as a module runs a second time under another name (its fixtures and hooks
registered twice) and ties every test to one directory's fixture file."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def _conftest_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        if any("conftest" in name.split(".") for name in names):
            found.append(f"line {node.lineno}")
    return found


def test_no_test_module_imports_from_a_conftest() -> None:
    offenders = {
        str(path.relative_to(TESTS)): lines
        for path in sorted(TESTS.rglob("*.py"))
        if (lines := _conftest_imports(path.read_text()))
    }
    assert offenders == {}


def test_the_check_sees_each_way_of_importing_a_conftest() -> None:
    for source in (
        "from .conftest import wait_for",
        "from . import conftest",
        "from tests.integration.conftest import REPO",
        "import tests.conftest",
    ):
        assert _conftest_imports(source) == ["line 1"], source
    assert _conftest_imports("from .waiting import wait_for\nimport conftests") == []
