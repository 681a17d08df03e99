"""The build's wiring (setup.py): what compiling needs is what the package depends on, and the
pure-Python modules can be chosen at import time over compiled ones."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

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
        "import processor, processor.core.tick, processor.engine.executor, processor.io.store;"
        " assert processor.pure_python_selected();"
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
