"""What some tests build before they can run, built in the background from the moment the
suite knows it will run them (fix_session.py's collection hook), at a lower priority than the
tests, on the cores they leave idle while they wait:

- the Go producer example (examples/producer-go): a cold build, its modules fetched and they
  and the standard library compiled, takes about a minute on a new machine;
- the sdist and the wheel built from it (`make wheel`'s recipe), which the quickstart's
  install block in test_wheel.py installs (unless DUCTOR_TEST_DIST names a folder where
  `make compile` built them already).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
_BUILD_TIMEOUT_S = 600


class BackgroundBuild:
    """One command run once, in the background, into a folder of its own."""

    def __init__(
        self,
        command: Callable[[Path], list[str] | None],
        cwd: Path,
        env: dict[str, str],
        prebuilt: Path | None = None,
    ) -> None:
        self._command = command  # the argv that builds into the folder; None: cannot here
        self._cwd = cwd
        self._env = env
        self._proc: subprocess.Popen[str] | None = None
        self._dir: Path | None = None
        self._prebuilt = prebuilt  # built already by the same recipe: used as it is, kept

    def start(self) -> None:
        """Start the build, once (nothing if it cannot run here: ``output`` says so)."""
        if self._proc is not None or self._prebuilt is not None:
            return
        folder = Path(tempfile.mkdtemp(prefix="ductor-build-"))
        argv = self._command(folder)
        if argv is None:
            folder.rmdir()
            return
        self._dir = folder
        self._proc = subprocess.Popen(
            argv,
            cwd=self._cwd,
            env={**os.environ, **self._env},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: os.nice(10),  # noqa: PLW1509 (no threads in the child yet)
            # A group of its own: `clean` ends the compilers the build started too, not only
            # the build's first process (they would go on, orphaned, for minutes).
            start_new_session=True,
        )

    def output(self) -> Path | None:
        """The folder it built into (waiting for the build); None if it cannot build here.
        AssertionError with the build's output if it failed."""
        if self._prebuilt is not None:
            return self._prebuilt
        self.start()  # (not started yet: the test file was run alone)
        if self._proc is None or self._dir is None:
            return None
        output, _ = self._proc.communicate(timeout=_BUILD_TIMEOUT_S)
        assert self._proc.returncode == 0, output
        return self._dir

    def clean(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


def go_binary() -> Path | None:
    """The machine's Go: on the PATH, or where its official archive installs it."""
    go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
    return None if go is None else Path(go)


def _go_build(folder: Path) -> list[str] | None:
    go = go_binary()
    return None if go is None else [str(go), "build", "-o", str(folder / "ductor-producer"), "."]


PRODUCER = BackgroundBuild(
    _go_build,
    REPO / "examples" / "producer-go",
    {"GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "local"},
)
# `make wheel`: python -m build --outdir dist . (`make test` builds it once, before the tests,
# for the checkout's compiled modules too, and names its folder in DUCTOR_TEST_DIST).
_DIST = os.environ.get("DUCTOR_TEST_DIST")
WHEEL = BackgroundBuild(
    lambda folder: [sys.executable, "-m", "build", "--outdir", str(folder), str(REPO)],
    REPO,
    {},
    prebuilt=Path(_DIST) if _DIST else None,
)
# Which test file needs which build.
NEEDED_BY = {"test_producer_example.py": PRODUCER, "test_wheel.py": WHEEL}
