"""The build's wiring (setup.py): what compiling needs is what the package depends on, and the
pure-Python modules can be chosen at import time over compiled ones."""

from __future__ import annotations

import importlib
import importlib.machinery
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

import processor

REPO = Path(__file__).resolve().parents[2]


def test_the_build_requires_the_ranges_the_package_depends_on() -> None:
    """mypyc type-checks the compiled modules against the packages they import: the build
    gets them in the ranges the package itself (or its extras) asks for, not others."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    declared = [*project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        declared += extra
    wanted = {Requirement(r).name: Requirement(r).specifier for r in declared}
    for raw in pyproject["build-system"]["requires"]:
        requirement = Requirement(raw)
        if requirement.name == "setuptools":
            continue
        assert requirement.name in wanted, f"{raw}: the package does not depend on it"
        assert requirement.specifier == wanted[requirement.name], raw


def test_ductor_pure_python_imports_every_module_from_its_source() -> None:
    """With DUCTOR_PURE_PYTHON=1 no module of the package is compiled code, whatever the
    build installed (in a pure build the check holds trivially)."""
    script = (
        "import processor, processor.core.tick, processor.engine.executor,"
        " processor.io.postgres.store; assert processor.pure_python_selected();"
        " assert processor.compiled_modules() == [], processor.compiled_modules();"
        " assert processor.core.tick.__file__.endswith('.py')"
    )
    env = {"DUCTOR_PURE_PYTHON": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [sys.executable, "-c", script],
        check=False,
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_the_build_under_test_is_the_one_make_test_asked_for() -> None:
    """`make test` names the build each run tests (DUCTOR_EXPECT_BUILD): a compile that fell
    back to pure Python, or a DUCTOR_PURE_PYTHON that did not take, fails here instead of
    passing as the other build. Without the variable (a developer's run) either is fine."""
    expected = os.environ.get("DUCTOR_EXPECT_BUILD")
    importlib.import_module("processor.core.tick")
    importlib.import_module("processor.engine.executor")
    importlib.import_module("processor.io.postgres.store")
    importlib.import_module("processor.worker.flow")
    compiled = processor.compiled_modules()
    if expected == "compiled":
        hot = {"processor.core.tick", "processor.engine.executor", "processor.worker.flow"}
        assert hot <= set(compiled), compiled
    elif expected == "pure":
        assert compiled == [], compiled
    else:
        assert expected is None, f"DUCTOR_EXPECT_BUILD={expected!r}: compiled or pure"


def test_a_source_edited_after_the_checkout_was_compiled_is_imported_over_its_stale_build(
    tmp_path: Path,
) -> None:
    """A checkout compiled in place whose source changed since imports the sources, saying so
    (the compiled module would silently run the old code). Played on a copy of the package
    with a stand-in extension file: the check compares times, it does not load it."""
    copy = tmp_path / "checkout"
    shutil.copytree(REPO / "processor", copy / "processor", ignore=shutil.ignore_patterns("*.so"))
    shutil.copy(REPO / "setup.py", copy / "setup.py")  # its list says what is compiled
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    (copy / "processor" / f"native__mypyc{suffix}").write_bytes(b"")  # their shared library
    stand_in = copy / "processor" / "core" / f"backoff{suffix}"
    stand_in.write_bytes(b"")
    source = copy / "processor" / "core" / "backoff.py"
    os.utime(stand_in, (1_000_000, 1_000_000))  # built long before the source's last edit

    def sources_first() -> tuple[bool, str]:
        """Whether the copy's package imports its sources first, and what it printed."""
        done = subprocess.run(
            [sys.executable, "-c", "import processor; print(processor.sources_first())"],
            check=True,
            cwd=copy,
            env={"PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )
        return done.stdout.strip() == "True", done.stderr

    first, said = sources_first()
    assert first, said
    assert f"ductor: {source} changed after the checkout was compiled" in said
    os.utime(stand_in)  # built after the edit: nothing to say
    assert sources_first() == (False, "")
