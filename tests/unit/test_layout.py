"""The package's structure, checked from its imports: no import circle anywhere, every module
in one layer, and each layer imports only the layers below it (core and the build's finder <
io < engine and worker < authoring < client < cli, tools, ui < the package's root and
``__main__``); the processor's engine and the step worker, side by side, never import each
other.

Imports at module level count, including those under ``if TYPE_CHECKING``; imports inside a
function do not (that is how the CLI loads the benchmark and the demo lazily).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "processor"
# Each module's layer is its sub-package's or, for a module at the top, its own.
LAYERS = {
    "processor.core": 0,
    "processor.build": 0,
    "processor.io": 1,
    "processor.engine": 2,
    "processor.worker": 2,
    "processor.authoring": 3,
    "processor.authoring_options": 2,  # below authoring, which re-exports its options
    "processor.client": 4,
    "processor.cli": 5,
    "processor.tools": 5,
    "processor.ui": 5,
    "processor": 6,  # the public names, imported lazily: above all it names
    "processor.__main__": 6,
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _top_level_imports(tree: ast.Module, modules: Iterable[str]) -> list[str]:
    """The project's modules imported at module level; ``from processor import client``
    imports processor.client (the package above it is loaded by any import of it)."""
    known = set(modules)
    names: list[str] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            names += submodules
            if not all(name in known for name in submodules):
                names.append(node.module)
        elif isinstance(node, ast.If | ast.Try):
            pending += node.body + node.orelse
            if isinstance(node, ast.Try):
                pending += [stmt for handler in node.handlers for stmt in handler.body]
    return names


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        imported = _top_level_imports(ast.parse(path.read_text()), modules)
        graph[name] = {i for i in imported if i in modules and i != name}
    return graph


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _layer(module: str) -> int | None:
    return LAYERS.get(_package(module))


def test_the_graph_sees_the_package() -> None:
    graph = _graph()
    assert "processor.engine.executor" in graph
    assert "processor.core.decide" in graph["processor.engine.executor"]
    assert "processor.core.claims" in graph["processor.worker.flow"]


def test_every_module_has_a_layer() -> None:
    assert [module for module in sorted(_graph()) if _layer(module) is None] == []


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
            assert own is not None and theirs is not None, (module, target)
            if theirs > own or (theirs == own and _package(module) != _package(target)):
                wrong.append(f"{module} imports {target}")
    assert not wrong, wrong


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"


def _documented_layers() -> list[tuple[int, str, list[str]]]:
    """docs/architecture.md's table of layers: each row's layer, the folder or module it
    names, and the modules listed in its second cell (``bench_*`` matches a prefix)."""
    rows = []
    for line in ARCHITECTURE.read_text().splitlines():
        match = re.match(r"\| (\d) · (.+?) \| (.*?) \|", line)
        if match:
            for path in re.findall(r"`(processor/[\w/.]*)`", match[2]):
                rows.append((int(match[1]), path, re.findall(r"`([\w*]+)`", match[3])))
    return rows


def test_the_architecture_page_states_the_layers_of_this_test() -> None:
    """Every folder and top-level module is a row of docs/architecture.md at the layer this
    test gives it, and a folder's row names each of its modules, no more."""
    rows = _documented_layers()
    modules = sorted(_graph())
    named = set()
    for layer, path, listed in rows:
        dotted = path.removesuffix("/").removesuffix(".py").replace("/", ".")
        dotted = dotted.removesuffix(".__init__")
        assert _layer(dotted) == layer, (path, layer, _layer(dotted))
        inside = [m.removeprefix(dotted + ".") for m in modules if m.startswith(dotted + ".")]
        if path.endswith("/") and dotted != "processor.io":
            assert listed, path
            assert sorted(m for m in inside if not any(fnmatch(m, p) for p in listed)) == []
            assert [p for p in listed if not any(fnmatch(m, p) for m in inside)] == []
        named.add(dotted if path.endswith(".py") else _package(dotted))
    assert sorted(set(map(_package, modules)) - named) == []
