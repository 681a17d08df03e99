"""The compiled-build finder (processor/build.py) in a checkout compiled in place (`make
compile`): a source edited after the build is imported instead of its stale compiled module,
for every module setup.py compiles (its one list), the worker's among them.

Each test builds a small checkout in a temporary folder: setup.py, processor/__init__.py and
processor/build.py copied from this one, a module's source and a stand-in for its compiled
module (never imported: importing ``processor`` alone imports none of its modules), and a
fresh interpreter says which build it chose.
"""

from __future__ import annotations

import importlib.machinery
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]


def _checkout(root: Path, module: str) -> Path:
    """A compiled checkout holding ``module`` (a path under processor/, without .py); its
    source returned, older than its compiled module until a test touches it."""
    shutil.copy(REPO / "setup.py", root / "setup.py")
    package = root / "processor"
    for folder in ("core", "engine", "io", "worker"):
        (package / folder).mkdir(parents=True)
    for name in ("__init__.py", "build.py"):
        shutil.copy(REPO / "processor" / name, package / name)
    source = package / f"{module}.py"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("VALUE = 1\n")
    for built in (package / f"{module}{SUFFIX}", package / f"native__mypyc{SUFFIX}"):
        built.write_bytes(b"")  # stands in for the compiled module and the shared library
    old = source.stat().st_mtime - 60
    os.utime(source, (old, old))
    return source


def _import(root: Path) -> subprocess.CompletedProcess[str]:
    script = "import processor; print(processor.sources_first())"
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )


def test_an_edited_worker_module_is_imported_from_its_source(tmp_path: Path) -> None:
    source = _checkout(tmp_path, "worker/flow")
    source.write_text("VALUE = 2\n")  # edited after the build

    done = _import(tmp_path)

    assert done.stdout.strip() == "True", done
    assert f"{source} changed after the checkout was compiled" in done.stderr


def test_an_edited_io_module_in_a_sub_package_is_imported_from_its_source(
    tmp_path: Path,
) -> None:
    source = _checkout(tmp_path, "io/postgres/store")
    source.write_text("VALUE = 2\n")

    done = _import(tmp_path)

    assert done.stdout.strip() == "True", done


def test_a_checkout_compiled_after_its_last_edit_runs_the_compiled_modules(
    tmp_path: Path,
) -> None:
    _checkout(tmp_path, "worker/flow")

    done = _import(tmp_path)

    assert done.stdout.strip() == "False", done
    assert done.stderr == ""
