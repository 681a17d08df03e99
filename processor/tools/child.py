"""One way to start a `ductor` child process, for the tools (bench, chaos, failover, demo)
and the integration tests alike: `python -m processor ARGS...` (or the installed console
script, as a user runs it), its stdout and stderr (JSON log lines) written to a file, read
back by the questions the callers ask of it (partitions owned, outages logged, final stats).

A failure (a child that exited, or did not stop on SIGTERM) is reported through
``DuctorChild.fail``: an exception here; the tests' subclass fails the test instead.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import orjson

from processor.io.telemetry.logs import read_stats


class ChildFailed(RuntimeError):
    """A child exited when it should have run, or did not stop when told to."""


def ductor_command(installed: bool = False) -> list[str]:
    """How to run `ductor`: `python -m processor`, or the installed console script beside
    this interpreter (`python -m processor` puts the current directory on the import path by
    itself and would hide whether `--app` does)."""
    if installed:
        return [str(Path(sys.executable).with_name("ductor"))]
    return [sys.executable, "-m", "processor"]


def popen_ductor(
    args: list[str],
    env: dict[str, str],
    log_path: Path,
    cwd: Path | None = None,
    installed: bool = False,
) -> subprocess.Popen[bytes]:
    """`ductor ARGS...` started with ``env``, its output (stdout and stderr, interleaved) to
    ``log_path``; the child keeps the file open, this process does not."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            [*ductor_command(installed), *args],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )


# How long after its shutdown bound a child's stop is judged to hang: before its own watchdog
# (processor/cli/common.py, STOP_OVERRUN_S past the bound) writes its stacks and ends it.
_JUDGED_BEFORE_WATCHDOG_S = 6.0


class DuctorChild:
    """A running `ductor` child and its log file."""

    def __init__(
        self,
        args: list[str],
        env: dict[str, str],
        log_path: Path,
        cwd: Path | None = None,
        installed: bool = False,
    ) -> None:
        self.log_path = log_path
        self.proc = popen_ductor(args, env, log_path, cwd, installed)
        # Its shutdown bound, when its environment gives one: a stop that overruns it is
        # judged before the process's own watchdog (the bound + STOP_OVERRUN_S) ends it.
        bound = env.get("DUCTOR_SHUTDOWN_TIMEOUT_S")
        self._stop_wait_s = float(bound) + _JUDGED_BEFORE_WATCHDOG_S if bound else 30.0

    def fail(self, message: str) -> NoReturn:
        raise ChildFailed(message)

    def tail(self, lines: int = 10) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def running(self) -> bool:
        """True while the process runs (a condition to wait on); once it has exited, a
        failure carrying its exit code and the last lines of its log."""
        code = self.proc.poll()
        if code is not None:
            self.fail(f"{self.log_path.stem} exited with {code}:\n{self.tail()}")
        return True

    def terminate(self, timeout: float | None = None) -> int:
        """SIGTERM, and its exit code. A process that has not exited within ``timeout`` (by
        default its shutdown bound and 6 s, before its own watchdog ends it, or 30 s) is a
        failure (a stop that hangs is a bug wherever it shows): its native stacks are taken
        twice, a second apart (a loop moves between them, a blocked thread does not), SIGUSR1
        makes it write its threads' stacks to its log, SIGKILL ends it, and the failure
        carries them and the log's tail, so a report shows where it was stuck."""
        timeout = self._stop_wait_s if timeout is None else timeout
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            native = self.native_stacks()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(1)
            native += "\n--- a second later:\n" + self.native_stacks()
            self.proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2)
            self.proc.kill()
            self.proc.wait(10)
            self.fail(
                f"{self.log_path.name} did not stop in {timeout:.0f} s of SIGTERM."
                f"\n{self.stacks()}\n--- its native stacks:\n{native}"
                f"\n--- the last lines of its log:\n{self.tail(15)}"
            )

    def native_stacks(self) -> str:
        """Every thread's stack with its native frames (py-spy, when installed), so a thread
        stuck in a compiled module or a C library shows where: Python's own dump stops at the
        last interpreted frame."""
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        if not Path(spy).exists():
            return "(py-spy is not installed)"
        try:
            done = subprocess.run(
                [spy, "dump", "--native", "--pid", str(self.proc.pid)],
                check=False,
                capture_output=True,
                text=True,
                timeout=20,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"(py-spy failed: {exc})"
        return (done.stdout + done.stderr)[-8000:]

    def stacks(self) -> str:
        """The last stacks the process wrote (SIGUSR1, or its overrun bound): the last run of
        lines that are not log lines (JSON) holding a thread's header. First in a failure's
        report, so a short view of it shows where the process was."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        header = next(
            (i for i in range(len(lines) - 1, -1, -1) if "thread 0x" in lines[i].lower()), None
        )
        if header is None:
            return "(it wrote no stacks)"
        start = end = header
        while start > 0 and not lines[start - 1].startswith("{"):
            start -= 1
        while end + 1 < len(lines) and not lines[end + 1].startswith("{"):
            end += 1
        return "\n".join(lines[start : end + 1])[-6000:]

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``: its exit code, None
        when it had to be killed (for tools, which report rather than fail)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def log_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log_path.read_bytes().splitlines():
            try:
                lines.append(orjson.loads(raw))
            except orjson.JSONDecodeError:
                continue  # not a log line (a failing command's last sentence)
        return lines

    def outages(self, dependency: str, phase: str = "started") -> int:
        """Its log lines saying an outage of ``dependency`` ("kafka", "postgres") started or
        ended."""
        return sum(
            1
            for line in self.log_lines()
            if line.get("dependency") == dependency and line.get("outage") == phase
        )

    def owned_partitions(self) -> int:
        """Partitions the instance holds, from its assignment log lines."""
        owned = 0
        for line in self.log_lines():
            if line.get("msg") == "partitions assigned":
                owned += int(line["count"])
            elif line.get("msg") == "partitions released":
                owned -= int(line["count"])
        return owned

    def assignments(self) -> int:
        """How many times the instance was given partitions."""
        return sum(1 for line in self.log_lines() if line.get("msg") == "partitions assigned")

    def final_stats(self) -> dict[str, Any]:
        stats = read_stats(self.log_path, final=True)
        if stats is None:
            self.fail(f"no final stats line in {self.log_path}")
        return stats
