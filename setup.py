"""The build: the package as pyproject.toml declares it, with the hot paths compiled by mypyc.

The modules in ``COMPILED`` are compiled to C extension modules (mypyc, the compiler that ships
with mypy) and installed next to their .py sources, which the import system then passes over
(``DUCTOR_PURE_PYTHON=1`` at import time imports the sources instead: processor/__init__.py).
The build is pure Python, every module from its source, when:

- ``DUCTOR_PURE_PYTHON=1`` (or true, yes, on) is set at build time: a pure wheel
  (py3-none-any);
- mypyc is not importable (a build without isolation in an environment without mypy);
- it is an editable install (``pip install -e``): the development loop stays pure and fast
  (``make compile`` puts the compiled modules of a built wheel into a checkout);
- compiling fails: no C compiler, a compiler error. The failure is reported and the build goes
  on without any compiled module (a part of them would be unusable: they share one library).
"""

from __future__ import annotations

import importlib
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent


def _modules(folder: str) -> list[str]:
    """The modules of a folder of the package, but its __init__ (which stays Python)."""
    paths = (HERE / "processor" / folder).glob("*.py")
    return sorted(str(p.relative_to(HERE)) for p in paths if p.name != "__init__.py")


# The one list of what is compiled, as two literals (processor/build.py reads them from this
# file in a checkout, to import an edited source over its stale compiled module).
# Every module of the pure core and the engine (the loop thread's per-record path, the
# database stage): what a tick runs (processor.tools.bench_hot measures them).
COMPILED_FOLDERS = ("core", "engine")
# The worker's per-task path (its loop, its book of tasks, its database lanes, its intake and
# wakeups) but what runs the users' code or crosses a process boundary (steps.py,
# isolation.py: a child process unpickles what they define) and what runs once. The load and
# commit codecs; the spans' protobuf encoder (12.2 -> 10.1 µs per span) and the light spans
# (one instance with every trace sampled: 87 -> 79 µs per tick, medians of three alternating
# rounds; no compiled class derived from an ABC may be named in an isinstance check:
# test_compiled_pitfalls.py). Paths under processor/, without ".py".
COMPILED_MODULES = (
    *("worker/flow", "worker/tasks", "worker/source", "worker/permits", "worker/database"),
    *("worker/runners", "worker/stats", "worker/messages", "worker/lanes", "worker/intake"),
    *("worker/claiming", "worker/runs", "worker/watch", "worker/results", "worker/turns"),
    *("worker/backlog", "worker/static_join", "worker/lane_batches"),
    *("io/postgres/store", "io/postgres/outbox", "io/postgres/step_data"),
    *("io/postgres/step_attempts",),
    *("io/kafka/clients", "io/kafka/offsets", "io/kafka/delivery"),
    *("io/telemetry/otlp_proto", "io/telemetry/light_spans"),
)
COMPILED = [
    *(module for folder in COMPILED_FOLDERS for module in _modules(folder)),
    *(f"processor/{module}.py" for module in COMPILED_MODULES),
]
# The shared library of the compiled modules, inside the package (not a top-level module).
GROUP = "processor.native"
# Where mypyc writes the C files (relative to the build's folder).
MYPYC_DIR = "build"
_TRUE = {"1", "true", "yes", "on"}


def _pure_requested() -> bool:
    return os.environ.get("DUCTOR_PURE_PYTHON", "").strip().lower() in _TRUE


def _mypyc_available() -> bool:
    try:
        importlib.import_module("mypyc.build")
    except ImportError:
        return False
    return True


def _say(message: str) -> None:
    print(f"ductor build: {message}", file=sys.stderr, flush=True)


class CompilingBuildExt(build_ext):
    """build_ext that compiles ``COMPILED`` with mypyc when it runs (not when setup.py is read,
    so building the sdist or the metadata type-checks nothing), and falls back to a pure build
    when compiling fails."""

    editable_mode: bool  # set by setuptools' editable_wheel

    def run(self) -> None:
        if getattr(self, "editable_mode", False):
            _say("editable install: pure Python (`make compile` compiles a checkout)")
            self.extensions = []
            return
        mypycify = importlib.import_module("mypyc.build").mypycify
        try:
            # One C file per module instead of one for the whole group: the C compiler's time
            # (the build's largest part) falls from 195 to 100 s of CPU, and the files can be
            # compiled side by side. The compiled hot paths (processor.tools.bench_hot, CPU per
            # run, four alternated rounds) are within 2 % of the single file's.
            extensions = mypycify(COMPILED, group_name=GROUP, multi_file=True, target_dir=MYPYC_DIR)
        except (SystemExit, Exception) as exc:  # mypyc exits on a type error
            self.extensions = []
            _say(f"mypyc could not compile the modules ({exc!r}): pure Python")
            return
        # The command was set up for the placeholder: what setuptools' finalize_options does
        # for each extension, done for mypyc's (none of them a shared Library).
        self.extensions = extensions
        for ext in extensions:
            # mypyc writes a dotted group's headers in its package's folder of the build
            # directory, but includes them from the modules' files as if beside them.
            ext.include_dirs.append(os.path.join(MYPYC_DIR, *GROUP.split(".")[:-1]))
            ext._full_name = self.get_ext_fullname(ext.name)
            self.ext_map[ext._full_name] = ext
            ext._links_to_dynamic = ext._needs_stub = False
            ext._file_name = self.get_ext_filename(ext._full_name)
        try:
            super().run()
        except (SystemExit, Exception) as exc:  # CompileError, a missing compiler (OSError)
            self._fall_back(f"the C extensions could not be built: {exc!r}")

    def build_extensions(self) -> None:
        _compile_side_by_side(self.compiler)
        super().build_extensions()

    def _fall_back(self, why: str) -> None:
        """Remove whatever was built, so no compiled module is installed: every module is then
        imported from its source."""
        _say(f"{why}; building pure Python instead")
        for ext in self.extensions:
            built = Path(self.get_ext_fullpath(ext.name))
            if built.exists():
                built.unlink()
        self.extensions = []


def _compile_side_by_side(compiler: Any) -> None:
    """Compile an extension's C files on every CPU (setuptools compiles one after another):
    distutils' own steps of ``CCompiler.compile``, the files given to a thread pool. Left as
    it is where a compiler lacks those steps."""
    steps = ("_setup_compile", "_get_cc_args", "_compile")
    jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if (jobs or 1) < 2 or not all(hasattr(compiler, step) for step in steps):
        return

    def compile_files(
        sources: list[str],
        output_dir: str | None = None,
        macros: Any = None,
        include_dirs: Any = None,
        debug: bool = False,
        extra_preargs: Any = None,
        extra_postargs: Any = None,
        depends: Any = None,
    ) -> list[str]:
        macros, objects, extra_postargs, pp_opts, build = compiler._setup_compile(
            output_dir, macros, include_dirs, sources, depends, extra_postargs
        )
        cc_args = compiler._get_cc_args(pp_opts, debug, extra_preargs)

        def compile_one(obj: str) -> None:
            src, ext = build[obj]
            compiler._compile(obj, src, ext, cc_args, extra_postargs, pp_opts)

        with ThreadPoolExecutor(jobs) as pool:
            list(pool.map(compile_one, [obj for obj in objects if obj in build]))
        return list(objects)

    compiler.compile = compile_files


def _options() -> dict[str, Any]:
    if _pure_requested():
        _say("DUCTOR_PURE_PYTHON is set: pure Python")
        return {}
    if not _mypyc_available():
        _say("mypyc is not importable: pure Python")
        return {}
    # A placeholder the command replaces with mypyc's extensions when it runs: it makes the
    # wheel one of this platform and Python version.
    return {
        "ext_modules": [Extension(f"{GROUP}__placeholder", sources=[])],
        "cmdclass": {"build_ext": CompilingBuildExt},
    }


# setuptools runs this file as __main__; tests read COMPILED without building anything.
if __name__ == "__main__":
    setup(**_options())
