"""The shell blocks of docs/ and which of them a test runs. A block is a shell block when its
info string is ``sh`` (or ``bash``, ``shell``, ``console``), or when it has none and its first
line is a command (``$ ductor ...``, a transcript, or ``ductor ...``).

Every shell block is run, page by page, top to bottom, by tests/integration/test_docs_shell.py
on the real Kafka and Postgres, unless the line before it (blank lines aside) marks it:

    <!-- shell: not run: REASON -->

for what a test cannot run as written: a cluster (`kubectl`, `docker`), the shared local
services (`make up`), hosts and files of a deployment, placeholders (`RUN_ID`) a reader fills
in. The reason says which, and names the test that checks the same behaviour where one does.
A block that another test runs as written (it needs a server that test serves) says which:

    <!-- shell: run by tests/integration/test_x.py -->
tests/unit/test_docs_shell.py checks the markers and what can be checked without services.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.markdown import REPO, Fence, fences
from tests.readme_script import Command, fence_commands

DOCS = REPO / "docs"
SHELL_INFOS = frozenset({"sh", "bash", "shell", "console"})
MARKER = re.compile(r"^\s*<!--\s*shell:(?P<rest>.*?)-->\s*$")
NOT_RUN = re.compile(r"^\s*not run:\s*(?P<why>\S.*?)\s*$")
RUN_BY = re.compile(r"^\s*run by (?P<test>tests/[\w/]+\.py)\s*$")
_COMMAND = re.compile(r"^\s*(?:\$ |ductor |\.venv/bin/)")


@dataclass(frozen=True)
class ShellBlock:
    path: Path
    fence: Fence
    not_run: str | None  # the marker's reason
    run_by: str | None = (
        None  # the test that runs it; neither: tests/integration/test_docs_shell.py
    )

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.fence.line}"

    def commands(self) -> list[Command]:
        return fence_commands(self.fence)


def is_shell(fence: Fence) -> bool:
    if fence.info.split(" ")[0] in SHELL_INFOS:
        return True
    first = next((line for line in fence.body.splitlines() if line.strip()), "")
    return not fence.info and _COMMAND.match(first) is not None


def _marker_before(lines: list[str], fence_line: int) -> str | None:
    """The ``<!-- shell: ... -->`` line just before the fence (1-based), blank lines aside."""
    index = fence_line - 2
    while index >= 0 and not lines[index].strip():
        index -= 1
    if index >= 0 and (found := MARKER.match(lines[index])) is not None:
        return found["rest"].strip()
    return None


def shell_blocks(path: Path) -> list[ShellBlock]:
    text = path.read_text()
    lines = text.splitlines()
    found = []
    for fence in fences(text):
        if not is_shell(fence):
            continue
        marker = _marker_before(lines, fence.line)
        reason = run_by = None
        if marker is not None and (not_run := NOT_RUN.match(marker)) is not None:
            reason = not_run["why"]
        if marker is not None and (other := RUN_BY.match(marker)) is not None:
            run_by = other["test"]
        found.append(ShellBlock(path, fence, reason, run_by))
    return found


def doc_pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def walks() -> dict[str, list[ShellBlock]]:
    """Each page's blocks a test runs, in order, by the page's path from the repository's top;
    pages without one left out."""
    found: dict[str, list[ShellBlock]] = {}
    for path in doc_pages():
        run = [b for b in shell_blocks(path) if b.not_run is None and b.run_by is None]
        if run:
            found[str(path.relative_to(REPO))] = run
    return found
