"""The package stays in pieces a person reads at once: no module over 400 lines, no function
over 60. ruff counts a function's statements, branches and complexity (pyproject.toml); this
counts what it does not. A module that must grow is split by concern, as the others were."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "processor"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_of_the_package_is_over_400_lines() -> None:
    over = {
        str(p.relative_to(PACKAGE)): n
        for p in _modules()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert over == {}


def test_no_function_of_the_package_is_over_60_lines() -> None:
    over: dict[str, int] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    over[f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}"] = lines
    assert over == {}


def test_the_checks_see_the_whole_package() -> None:
    """Not vacuous: the walk finds the package's modules, and long ones would be counted."""
    modules = _modules()
    assert len(modules) > 200
    assert any(p.name == "tick.py" for p in modules)
