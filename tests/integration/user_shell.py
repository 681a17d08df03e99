"""A user's bash session fed a Markdown page's commands one at a time, in a copy of the
repository's top: tests/integration/test_example_readmes.py and test_docs_shell.py walk their
pages with it. A plugin too (registered by tests/conftest.py): its fixtures ``top`` (the copy)
and ``shell`` (the session there, closed at the test's end)."""

from __future__ import annotations

import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from processor.io.config.settings import Settings
from tests.readme_script import Command, matches

from .children import child_env
from .samples import REPO
from .waiting import wait_for

# The line a service logs once it serves ("processor started", "worker started").
STARTED = re.compile(r'"msg":"(processor|worker) started"')

# The most one command may take: `ductor result --wait 30` is the longest a README asks for.
COMMAND_TIMEOUT_S = 90.0


class Shell:
    """One bash session fed the README's commands one at a time: what a command prints (stdout
    and stderr, in order) and its exit status are read up to a marker written after it."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self._marker = f"readme-{uuid.uuid4().hex}"
        self._proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its services are ended by this test, not by a Ctrl-C
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.services: list[int] = []  # the pids of the commands left running (`cmd &`)

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def run(self, text: str) -> tuple[list[str], int]:
        """``text`` run to its end: the lines it printed and its exit status."""
        assert self._proc.stdin is not None
        # The marker on a line of its own, even after output without a final newline.
        self._proc.stdin.write(f"{text}\nprintf '\\n%s %s\\n' {self._marker} \"$?\"\n")
        self._proc.stdin.flush()
        printed = ""
        done = re.compile(rf"\n{self._marker} (\d+)\n$")
        deadline = time.monotonic() + COMMAND_TIMEOUT_S
        while (found := done.search(printed)) is None:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"{text!r} did not end within {COMMAND_TIMEOUT_S:.0f} s: {printed}")
            if line is None:
                pytest.fail(f"the shell ended during {text!r}: {printed}")
            printed += line
        return printed[: found.start()].splitlines(), int(found[1])

    def start(self, command: Command, log: Path) -> None:
        """A service the README leaves running, its output to ``log`` rather than among the
        commands' output; the next command comes once it says it started, as a user reading
        its terminal types it (a worker not yet registered makes `workflows register` warn
        that no worker serves the steps)."""
        lines, status = self.run(f"{command.foreground()} >{shlex_quote(log)} 2>&1 &\necho $!")
        assert status == 0, lines
        pid = int(lines[-1])
        self.services.append(pid)
        # The shell's child opens the log itself: it may not exist yet.
        wait_for(
            lambda: (
                (log.exists() and STARTED.search(log.read_text(errors="replace")) is not None)
                or not self.running(pid)
            ),
            60,
            f"{command.text!r} to say it started",
        )

    def running(self, pid: int) -> bool:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
        except FileNotFoundError:
            return False

    def stop_services(self) -> list[int]:
        """The services ended as `kill %1 %2` in the README ends them (SIGTERM): their exit
        codes, read by the shell that started them."""
        for pid in self.services:
            if self.running(pid):
                os.kill(pid, signal.SIGTERM)
        wait_for(
            lambda: not any(self.running(pid) for pid in self.services),
            30,
            "the README's services to exit on SIGTERM",
        )
        return [self.run(f"wait {pid}")[1] for pid in self.services]

    def follow(self, found: Sequence[Command], where: str, logs: Path) -> None:
        """``found`` in order, as a user types them: a typed command must succeed, a
        transcript's must print what the page shows; a service (``cmd &``) is left running,
        its output in ``logs``/service-N.log."""
        for command in found:
            if command.background:
                self.start(command, logs / f"service-{len(self.services) + 1}.log")
                continue
            printed, status = self.run(command.text)
            if command.expected is None:
                assert status == 0, (
                    f"{where}:{command.line}: {command.text!r} exited {status}:\n"
                    + "\n".join(printed)
                )
            else:
                assert matches(command.expected, printed), (
                    f"{where}:{command.line}: {command.text!r} printed (exit {status}):\n"
                    + "\n".join(printed)
                    + "\nthe page shows:\n"
                    + "\n".join(command.expected)
                )

    def stop_checked(self, logs: Path) -> None:
        """The services still running as the page left them, then ended by SIGTERM with exit
        code 0 (their logs in the message otherwise)."""
        files = [logs / f"service-{number}.log" for number in range(1, len(self.services) + 1)]
        for pid, log in zip(self.services, files, strict=True):
            assert self.running(pid), f"{log.name} exited: {log.read_text()[-2000:]}"
        codes = self.stop_services()
        assert codes == [0] * len(codes), [log.read_text()[-2000:] for log in files]

    def close(self) -> None:
        """Whatever still runs killed, then the shell ended."""
        for pid in self.services:
            if self.running(pid):
                os.kill(pid, signal.SIGKILL)
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def shlex_quote(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def repo_top(tmp_path: Path) -> Path:
    """A copy of the repository's top as far as the READMEs see it: the examples, and .venv
    (the virtualenv running these tests), so that `. .venv/bin/activate` puts its `ductor` on
    the PATH."""
    top = tmp_path / "repo"
    ignored = shutil.ignore_patterns("__pycache__", "out_of_stock.txt", "ductor-producer")
    shutil.copytree(REPO / "examples", top / "examples", ignore=ignored)
    (top / ".venv").symlink_to(Path(sys.prefix))
    return top


def user_shell(settings: Settings, top: Path) -> Shell:
    """A bash session at ``top`` with ``settings`` in its environment, no virtualenv active (a
    page activates .venv itself, or types .venv/bin/ductor); close it when done."""
    env = child_env(settings)
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if Path(p) != Path(sys.prefix) / "bin"
    )
    env.pop("VIRTUAL_ENV", None)
    return Shell(top, env)


@pytest.fixture
def top(tmp_path: Path) -> Path:
    return repo_top(tmp_path)


@pytest.fixture
def shell(settings: Settings, top: Path) -> Iterator[Shell]:
    session = user_shell(settings, top)
    try:
        yield session
    finally:
        session.close()
