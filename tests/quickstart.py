"""The README's quickstart as data: its shell blocks parsed into commands, the step functions
it shows and the output it promises. tests/integration/test_wheel.py runs these very commands
from the installed wheel; tests/unit/test_quickstart.py checks, without services, that they
are what the Makefile, the CLI, the example and the package say.

The quickstart's first block is the checkout's pair (`make demo`, `make test`); every `sh`
block after it is one user's shell session, in order: the first installs the wheel, the
others use it. A command is one line (or one quoted argument over several lines); `a && b`
is two commands, a trailing `&` runs it in the background, `#` starts a comment. Nothing else
of a shell's syntax is allowed, so that the test can run each command as written.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from tests.markdown import REPO, fences, section

README = REPO / "README.md"
TITLE = "Quickstart"
MAX_LINES = 60
_SHELL = ("sh", "bash", "shell", "console")
_REFUSED = {"|", "||", ";", ";;", "(", ")", "<", ">", ">>", "&>", "<<"}


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    background: bool  # ended by `&`: the shell goes on while it runs
    line: int  # where it starts in the README

    def __str__(self) -> str:
        return shlex.join(self.argv) + (" &" if self.background else "")


@dataclass(frozen=True)
class Quickstart:
    line: int  # of its heading
    length: int  # lines from its heading to the next heading
    blocks: tuple[tuple[Command, ...], ...]  # its shell blocks, in order
    steps: str  # the Python block: an excerpt of the example's step functions
    output: str  # the block without a language: what the session's last command prints

    @property
    def checkout(self) -> tuple[Command, ...]:
        """The first block: run from a checkout."""
        return self.blocks[0]

    @property
    def install(self) -> tuple[Command, ...]:
        """The session's first block: the wheel built and installed into a virtualenv."""
        return self.blocks[1]

    @property
    def rest(self) -> tuple[Command, ...]:
        """The session's other blocks, in order: they use what the first installed."""
        return tuple(command for block in self.blocks[2:] for command in block)


def commands(body: str, first_line: int) -> list[Command]:
    """A shell block's commands."""
    found: list[Command] = []
    pending, start = "", first_line
    for number, line in enumerate(body.splitlines(), start=first_line):
        if not pending:
            start = number
        pending += line + "\n"
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # a quote left open: the argument goes on on the next line
            continue
        found += _split(pending, start)
        pending = ""
    if pending:
        raise ValueError(f"README.md:{start}: a quote is never closed")
    return found


def _split(text: str, line: int) -> list[Command]:
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = list(lexer)
    found: list[Command] = []
    current: list[str] = []
    for index, word in enumerate(words):
        if word in _REFUSED:
            raise ValueError(f"README.md:{line}: {word!r} is more shell than the session runs")
        if word in ("&&", "&"):
            if not current:
                raise ValueError(f"README.md:{line}: {word!r} without a command before it")
            if word == "&" and index != len(words) - 1:
                raise ValueError(f"README.md:{line}: '&' only ends a line")
            found.append(Command(tuple(current), word == "&", line))
            current = []
        else:
            current.append(word)
    if current:
        found.append(Command(tuple(current), False, line))
    return found


def quickstart(path: Path = README) -> Quickstart:
    text = path.read_text()
    line, body = section(text, TITLE)
    blocks = fences(body)
    shell = [b for b in blocks if b.info in _SHELL]
    python = [b for b in blocks if b.info == "python"]
    plain = [b for b in blocks if not b.info]
    if len(shell) < 2 or len(python) != 1 or len(plain) != 1:
        raise ValueError(
            "the quickstart has shell blocks (the checkout's, then the session's), one Python"
            f" block and one output block; found {[b.info for b in blocks]}"
        )

    return Quickstart(
        line=line,
        length=len(body.splitlines()),
        blocks=tuple(tuple(commands(b.body, line + b.line)) for b in shell),
        steps=python[0].body,
        output=plain[0].body,
    )
