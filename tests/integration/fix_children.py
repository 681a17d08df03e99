"""Plugin: `ductor` child processes started by a test (``spawn``), stopped at its end."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from processor.io.config.settings import Settings

from .children import Spawned, child_env


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Callable[..., Spawned]]:
    """Start `ductor` subprocesses; whatever is still running at the end is stopped."""
    started: list[Spawned] = []

    def start(
        args: list[str],
        settings: Settings,
        name: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,  # given: the installed `ductor` script, run there
    ) -> Spawned:
        child = Spawned(args, {**child_env(settings), **(env or {})}, tmp_path / f"{name}.log", cwd)
        started.append(child)
        return child

    yield start
    for child in started:
        if child.proc.poll() is None:
            child.kill()
