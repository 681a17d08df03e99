"""The package's structure, checked from its imports: no import circle anywhere, and each
layer imports only the layers below it (core < io < engine and worker < client < cli, tools,
ui); the processor's engine and the step worker, side by side, never import each other.

Imports at module level count, including those under ``if TYPE_CHECKING``; imports inside a
function do not (that is how the CLI loads the benchmark and the demo lazily).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "processor"
LAYERS = {
    "core": 0,
    "io": 1,
    "engine": 2,
    "worker": 2,
    "client": 3,
    "cli": 4,
    "tools": 4,
    "ui": 4,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(tree: ast.Module) -> list[str]:
    names: list[str] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.If | ast.Try):
            pending += node.body + node.orelse
            if isinstance(node, ast.Try):
                pending += [stmt for handler in node.handlers for stmt in handler.body]
    return names


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = _top_level_imports(ast.parse(path.read_text()))
        graph[name] = {i for i in imported if i in modules and i != name}
    return graph


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else None


def test_the_graph_sees_the_package() -> None:
    graph = _graph()
    assert "processor.engine.executor" in graph
    assert "processor.core.decide" in graph["processor.engine.executor"]
    assert "processor.core.claims" in graph["processor.worker.flow"]


def test_no_import_circle() -> None:
    graph = _graph()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module) :], module]
            pytest.fail("import circle: " + " -> ".join(cycle))
        if module in done:
            return
        for imported in sorted(graph[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_each_layer_imports_only_the_layers_below_it() -> None:
    wrong = []
    for module, imported in sorted(_graph().items()):
        own = _layer(module)
        for target in sorted(imported):
            theirs = _layer(target)
            if own is None or theirs is None:
                continue
            same_package = module.split(".")[1] == target.split(".")[1]
            if theirs > own or (theirs == own and not same_package):
                wrong.append(f"{module} imports {target}")
    assert not wrong, wrong
