"""What mypyc compiles differently from the interpreter, kept out of the compiled modules
(setup.py's list). A name bound by two ``except ... as NAME`` clauses of one function gets the
first clause's type: compiled, the second clause raised ``TypeError: UnknownWorkflow object
expected; got KeyError`` instead of handling the error (store.load_runs_at, seen on a row the
processor could not read: the batch stopped). A compiled class derived from an ABC (a Span, a
Tracer) is built without its metaclass and shares its base's isinstance cache: every span once
checked against ``Span`` passed ``isinstance(span, LightSpan)`` (telemetry.context_headers gave
a span that records nothing no headers), so such classes are checked by their exact type."""

from __future__ import annotations

import abc
import ast
import builtins
import importlib
import inspect
from typing import Protocol

from tests.compiled import REPO, compiled_module_names, compiled_sources


def test_no_compiled_function_binds_one_name_to_two_kinds_of_exception() -> None:
    found = []
    for path in compiled_sources():
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            kinds: dict[str, set[str]] = {}
            for node in ast.walk(fn):
                if isinstance(node, ast.ExceptHandler) and node.name:
                    kind = ast.unparse(node.type) if node.type else "BaseException"
                    kinds.setdefault(node.name, set()).add(kind)
            found += [
                f"{path.relative_to(REPO)}:{fn.lineno} {fn.name}: {name} is {sorted(k)}"
                for name, k in kinds.items()
                if len(k) > 1
            ]
    assert found == [], "give each except clause's exception a name of its own:\n" + "\n".join(
        found
    )


def _compiled_abc_subclasses() -> set[str]:
    """Classes of the compiled modules derived from an ABC other than a typing Protocol (which
    nothing checks at run time: none is runtime_checkable)."""
    found = set()
    for name in compiled_module_names():
        for attr, value in vars(importlib.import_module(name)).items():
            if (
                inspect.isclass(value)
                and value.__module__ == name
                and isinstance(value, abc.ABCMeta)
                and Protocol not in value.__mro__
            ):
                found.add(attr)
    return found


def test_no_compiled_class_derived_from_an_abc_is_named_in_an_isinstance_check() -> None:
    derived = _compiled_abc_subclasses()
    assert {"LightSpan", "LightTracer"} <= derived  # the scan sees what it is meant to see
    found = []
    for path in [*(REPO / "processor").rglob("*.py"), *(REPO / "tests").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
            ):
                continue
            named = {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
            found += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in named & derived]
    assert found == [], "check these by their exact type (type(x) is C):\n" + "\n".join(found)


def test_no_compiled_dataclass_field_is_a_bare_builtin_exception() -> None:
    """The compiled build looks a dataclass field's bare type name up in its module's globals,
    where builtins are not: ``error: Exception`` raised KeyError when the module was imported
    (core/batch_values.py names an alias instead). A name inside a union or a generic is
    not looked up."""
    found = []
    for path in compiled_sources():
        for cls in ast.walk(ast.parse(path.read_text())):
            if not isinstance(cls, ast.ClassDef) or not any(
                "dataclass" in ast.unparse(d) for d in cls.decorator_list
            ):
                continue
            for field in cls.body:
                kind = field.annotation if isinstance(field, ast.AnnAssign) else None
                builtin = getattr(builtins, kind.id, None) if isinstance(kind, ast.Name) else None
                if isinstance(builtin, type) and issubclass(builtin, BaseException):
                    found.append(f"{path.relative_to(REPO)}:{field.lineno} {cls.name}")
    assert found == [], "name an alias of the exception type instead:\n" + "\n".join(found)
