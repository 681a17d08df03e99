"""Which build of the package this process runs: the compiled modules a wheel built with
compilation on installs beside their sources (setup.py), or the sources. The package's
__init__ calls ``choose_build`` before any of its modules is imported. Only the standard
library here: this module loads before anything else of the package."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_PACKAGE = "processor"

# -- the compiled build and the pure-Python one ------------------------------------------------
#
# A wheel built with compilation on (setup.py) carries, next to some modules' .py files, the
# same modules compiled by mypyc (extension modules: .so files), which the import system
# prefers. DUCTOR_PURE_PYTHON=1 (or true, yes, on) at import time makes this package import
# every module of its own from its .py source instead: the finder below comes before the
# standard ones for this package's modules only. A build without compiled modules (an
# editable install, a pure wheel) is the same either way.
_TRUE = {"1", "true", "yes", "on"}


class _SourcesFirst(importlib.abc.MetaPathFinder):
    """Finds the package's modules as .py sources where a compiled one sits beside them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if path is None or not fullname.startswith(_PACKAGE + "."):
            return None
        leaf = fullname.rpartition(".")[2]
        for folder in path:
            source = os.path.join(folder, leaf + ".py")
            if os.path.isfile(source):
                return importlib.util.spec_from_file_location(fullname, source)
        return None  # a package (its __init__.py is never compiled), or not here


def pure_python_selected() -> bool:
    """Whether DUCTOR_PURE_PYTHON asks for the pure-Python modules."""
    return os.environ.get("DUCTOR_PURE_PYTHON", "").strip().lower() in _TRUE


def compiled_modules() -> list[str]:
    """The modules of this package imported so far from compiled code, sorted (not the
    library they share, ``processor.native__mypyc``)."""
    suffixes = tuple(importlib.machinery.EXTENSION_SUFFIXES)
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if name.startswith(_PACKAGE + ".")
        and not name.endswith("__mypyc")
        and (getattr(module, "__file__", None) or "").endswith(suffixes)
    )


def _compiled_sources(checkout: str) -> list[str]:
    """The sources setup.py compiles (its ``COMPILED_FOLDERS`` and ``COMPILED_MODULES``, read
    as literals: the build's one list), as paths."""
    import ast  # noqa: PLC0415 (only in a compiled checkout)

    with open(os.path.join(checkout, "setup.py"), encoding="utf-8") as file:
        tree = ast.parse(file.read())
    found: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name) and target.id.startswith("COMPILED_"):
                found[target.id] = _literal(node.value)
    package = os.path.join(checkout, _PACKAGE)
    sources = [os.path.join(package, *m.split("/")) + ".py" for m in found["COMPILED_MODULES"]]
    for folder in found["COMPILED_FOLDERS"]:
        path = os.path.join(package, folder)
        sources += [
            os.path.join(path, name)
            for name in sorted(os.listdir(path))
            if name.endswith(".py") and name != "__init__.py"
        ]
    return sources


def _literal(node: Any) -> tuple[str, ...]:
    """A tuple of strings, its parts possibly starred tuples (``*("a", "b"), "c"``)."""
    import ast  # noqa: PLC0415

    values: list[str] = []
    for element in node.elts:
        if isinstance(element, ast.Starred):
            values += _literal(element.value)
        else:
            values.append(ast.literal_eval(element))
    return tuple(values)


def _stale_in_checkout(package: str | None = None) -> str | None:
    """In a checkout compiled in place (`make compile`), a source edited since: the compiled
    modules would shadow the edit, so the sources are imported instead (one warning line).
    Nothing is checked in an installed package (no setup.py beside it), nor in a checkout
    without compiled modules (no shared library of theirs in the package)."""
    here = package or os.path.dirname(os.path.abspath(__file__))
    checkout = os.path.dirname(here)
    if not os.path.isfile(os.path.join(checkout, "setup.py")):
        return None
    if not any(name.startswith("native__mypyc") for name in os.listdir(here)):
        return None
    suffixes = importlib.machinery.EXTENSION_SUFFIXES
    for source in _compiled_sources(checkout):
        stem = source[: -len(".py")]
        for built in (stem + suffix for suffix in suffixes):
            if not (os.path.isfile(built) and os.path.isfile(source)):
                continue
            if os.path.getmtime(source) > os.path.getmtime(built):
                return source
    return None


def sources_first() -> bool:
    """Whether this process imports the package's .py sources over compiled modules
    (DUCTOR_PURE_PYTHON, or a stale build in a checkout)."""
    return any(isinstance(f, _SourcesFirst) for f in sys.meta_path)


def choose_build() -> None:
    """Installs the finder of the sources when this process imports them over compiled
    modules: run once, by the package's __init__ before any of its modules is imported."""
    if sources_first():
        return
    if pure_python_selected():
        sys.meta_path.insert(0, _SourcesFirst())
        return
    stale = _stale_in_checkout()
    if stale is not None:
        sys.stderr.write(
            f"ductor: {stale} changed after the checkout was compiled: importing the sources"
            " (run `make compile` again, or `make clean-compiled`)\n"
        )
        sys.meta_path.insert(0, _SourcesFirst())
