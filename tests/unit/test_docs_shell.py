"""The docs' shell blocks (tests/docs_shell.py), checked without services: each is run by
tests/integration/test_docs_shell.py or marked with the reason it is not; a marker marks a
shell block and says why; a block the test runs types its commands in full (no placeholder a
reader fills in) and gives `ductor` only commands and options it takes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from processor.cli.main import parse_args
from tests.docs_shell import MARKER, NOT_RUN, RUN_BY, doc_pages, is_shell, shell_blocks, walks
from tests.markdown import REPO, fences, prose

PAGES = doc_pages()
# What a reader fills in: RUN_ID, DLQ_OFFSET, an option shown as optional ([--version 2]).
_PLACEHOLDER = re.compile(r"\b(?:RUN_ID|DLQ_OFFSET|WORKFLOW|MODULE|SECONDS)\b|\[--")


def _ids(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_a_shell_block_is_told_from_the_others(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```sh\nductor migrate\n```\n\n"
        "<!-- shell: not run: a cluster -->\n\n```sh\nkubectl apply -k .\n```\n\n"
        '<!-- shell: run by tests/integration/test_http_api.py -->\n```sh\ncurl "$API"\n```\n\n'
        "```\n$ ductor gc --finished-before 7d\ndeleted 0 run(s)\n```\n\n"
        "```\nductor outbox parked\n```\n\n"
        '```json\n{"a": 1}\n```\n\n```\nok    postgres: up\n```\n'
    )
    found = shell_blocks(page)
    assert [(b.fence.line, b.not_run, b.run_by) for b in found] == [
        (1, None, None),
        (7, "a cluster", None),
        (12, None, "tests/integration/test_http_api.py"),
        (16, None, None),
        (21, None, None),
    ]
    assert [len(b.commands()) for b in found] == [1, 1, 1, 1, 0]


@pytest.mark.parametrize("path", PAGES, ids=_ids)
def test_every_marker_marks_a_shell_block_and_says_why(path: Path) -> None:
    text = path.read_text()
    lines = text.splitlines()
    shell_lines = {f.line for f in fences(text) if is_shell(f)}
    problems = []
    # A marker shown inside a block (docs/development.md shows one) marks nothing.
    for number, line in enumerate(prose(text).splitlines(), start=1):
        found = MARKER.match(line)
        if found is None:
            continue
        run_by = RUN_BY.match(found["rest"])
        if NOT_RUN.match(found["rest"]) is None and run_by is None:
            problems.append(f"{number}: neither `not run: REASON` nor `run by TEST`: {line}")
        if run_by is not None:
            test = REPO / run_by["test"]
            if not test.is_file() or path.name not in test.read_text():
                problems.append(f"{number}: {run_by['test']} does not read {path.name}")
        after = next((n for n in range(number + 1, len(lines) + 1) if lines[n - 1].strip()), 0)
        if after not in shell_lines:
            problems.append(f"{number}: the marker is not right before a shell block")
    assert problems == []


@pytest.mark.parametrize("path", PAGES, ids=_ids)
def test_a_block_the_docs_test_runs_types_its_commands_in_full(path: Path) -> None:
    for block in shell_blocks(path):
        if block.not_run is not None or block.run_by is not None:
            continue
        found = block.commands()
        assert found, f"{block.where}: no command the test can run: an `sh` block, or marked"
        for command in found:
            where = f"{block.where}: {command.text!r}"
            words = shlex.split(command.text, comments=True)
            typed = shlex.join(words)
            assert "..." not in typed, f"{where}: an elided command cannot be typed"
            assert _PLACEHOLDER.search(typed) is None, f"{where}: a placeholder"
            if words[0] not in ("ductor", ".venv/bin/ductor"):
                continue
            argv = [w for w in words[1:] if w != "&"]
            for i, word in enumerate(argv):  # `ductor runs list -o json | jq ...`: its own part
                if word in ("|", "||", "&&", ";"):
                    argv = argv[:i]
                    break
            parse_args(argv)  # exits 2 on bad usage


def test_the_docs_test_runs_every_block_no_marker_excuses() -> None:
    run = {b.where for blocks in walks().values() for b in blocks}
    unmarked = {
        b.where
        for path in PAGES
        for b in shell_blocks(path)
        if b.not_run is None and b.run_by is None
    }
    assert run == unmarked
    assert run, "no shell block of docs/ is run by a test"
