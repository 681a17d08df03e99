"""The Go producer example (examples/producer-go), built in the background from the moment the
suite knows it will run it: a cold build (its modules fetched, they and the standard library
compiled) takes about a minute on a new machine, time the tests before it hide. The build runs
at a lower priority than the tests, on the cores they leave idle while they wait."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "producer-go"
_BUILD_TIMEOUT_S = 600


class BackgroundBuild:
    def __init__(self) -> None:
        self._proc: subprocess.Popen[str] | None = None
        self._dir: Path | None = None

    def start(self) -> None:
        """Start the build, once; nothing if Go is not installed (``binary`` says so)."""
        go = shutil.which("go") or shutil.which("go", path="/usr/local/go/bin")
        if self._proc is not None or go is None:
            return
        self._dir = Path(tempfile.mkdtemp(prefix="ductor-go-"))
        env = {**os.environ, "GOFLAGS": "-buildvcs=false", "GOTOOLCHAIN": "local"}
        self._proc = subprocess.Popen(
            [go, "build", "-o", str(self._dir / "ductor-producer"), "."],
            cwd=EXAMPLE,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=lambda: os.nice(10),  # noqa: PLW1509 (no threads in the child yet)
        )

    def binary(self) -> Path | None:
        """The built producer (waiting for the build); None without Go. AssertionError with
        the compiler's output if the build failed."""
        self.start()  # (not started yet: the test file was run alone)
        if self._proc is None or self._dir is None:
            return None
        output, _ = self._proc.communicate(timeout=_BUILD_TIMEOUT_S)
        assert self._proc.returncode == 0, output
        return self._dir / "ductor-producer"

    def clean(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)


PRODUCER = BackgroundBuild()
