"""What mypyc compiles differently from the interpreter, kept out of the compiled modules
(setup.py's list). A name bound by two ``except ... as NAME`` clauses of one function gets the
first clause's type: compiled, the second clause raised ``TypeError: UnknownWorkflow object
expected; got KeyError`` instead of handling the error (store.load_runs_at, seen on a row the
processor could not read: the batch stopped)."""

from __future__ import annotations

import ast

from tests.compiled import REPO, compiled_sources


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
