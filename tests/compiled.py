"""The modules the compiled build compiles (setup.py's ``COMPILED``), for the tests that hold
them to what mypyc needs."""

from __future__ import annotations

import runpy
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def compiled_sources() -> list[Path]:
    compiled = runpy.run_path(str(REPO / "setup.py"), run_name="setup_read")["COMPILED"]
    assert len(compiled) > 40, compiled  # the core, the engine, the worker's per-task path
    return [REPO / path for path in compiled]


def compiled_module_names() -> list[str]:
    return [".".join(path.relative_to(REPO).with_suffix("").parts) for path in compiled_sources()]
