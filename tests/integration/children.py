"""`ductor` child processes of a test: run to their end (``run_ductor``) or left running
(``Spawned``, started by the ``spawn`` fixture of fix_children.py), through the one helper
the tools use too (processor/tools/child.py)."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path
from typing import NoReturn

import pytest

from processor.io.config.settings import Settings
from processor.io.config.settings import child_env as config_child_env
from processor.tools.chaos_steps import execution_log_env
from processor.tools.child import DuctorChild, ductor_command

from .samples import REPO


def child_env(settings: Settings) -> dict[str, str]:
    """The environment that gives a `ductor` subprocess these settings, logging JSON (and the
    tests' steps modules the database they count executions in)."""
    return config_child_env(replace(settings, log_format="json")) | execution_log_env(settings)


def run_ductor(
    settings: Settings, *args: str, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`ductor ARGS...` run to its end with these settings, its output captured as text:
    `python -m processor` in the repository, or, given ``cwd``, the installed script run
    there as a user runs it."""
    return subprocess.run(
        [*ductor_command(installed=cwd is not None), *args],
        env=child_env(settings),
        cwd=cwd or REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


class Spawned(DuctorChild):
    """A `ductor` subprocess whose output (JSON logs) is captured to a file: `python -m
    processor` in the repository, or, given ``cwd``, the installed script run there as a user
    runs it. A child that exits while it should run, or hangs on SIGTERM, fails the test."""

    def __init__(
        self, args: list[str], env: dict[str, str], log_path: Path, cwd: Path | None = None
    ) -> None:
        super().__init__(args, env, log_path, cwd=cwd or REPO, installed=cwd is not None)

    def fail(self, message: str) -> NoReturn:
        pytest.fail(message)


def still_running(*children: Spawned) -> bool:
    """True while every child runs (a predicate for ``wait_for``); fails the test with the
    end of its log once one has exited."""
    return all(child.running() for child in children)
