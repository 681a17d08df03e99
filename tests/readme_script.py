"""A README's shell commands in the order a user following it types them, and what it shows
they print: tests/integration/test_example_readmes.py runs them, tests/unit/test_readme_script.py
checks what can be checked without the services.

Two kinds of fenced blocks hold commands:

- a block without a language (or ``sh``) whose first line starts with ``$ ``: a transcript;
  each ``$ `` line is a command, the lines up to the next are what it prints (stdout and
  stderr), to match;
- any other ``sh`` block: commands to type, each line one (a line ending in ``\\`` or inside
  an unclosed quote goes on); they must succeed; a command ending in ``&`` is a service left
  running in the background; a command with a here-document (``cat > f.json <<'EOF'``) goes
  on to its end marker.

Any other block (a diagram, output shown without its command) is prose. In what a transcript
shows, a line ``...`` stands for any lines and ``...`` within a line for any text; a timestamp
(and the weekday after it) or a hex id of eight characters or more stands for any other; a
line of JSON matches the same JSON (else it matches as text: JSON holding a time or an id);
runs of spaces match any run of spaces.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

import orjson

from tests.markdown import Fence, fences


@dataclass(frozen=True)
class Command:
    text: str  # as typed, its continuation lines joined with newlines
    line: int  # where it starts in the README (1-based)
    expected: tuple[str, ...] | None  # what the transcript shows it prints; None: an sh block's

    @property
    def background(self) -> bool:
        """A service the README leaves running: ``ductor process &``."""
        words = _words(self.text)
        return bool(words) and words[-1] == "&"

    def foreground(self) -> str:
        """The background command without its ``&`` and comment, as one simple command."""
        return shlex.join(_words(self.text)[:-1])


def commands(markdown: str) -> list[Command]:
    """Every command of the README's ``sh`` blocks and transcripts, in order."""
    found: list[Command] = []
    for fence in fences(markdown):
        found.extend(fence_commands(fence))
    return found


def fence_commands(fence: Fence) -> list[Command]:
    """The commands of one block: a transcript's (a block without a language, or ``sh``, whose
    first line starts with ``$ ``), or typed (any other ``sh`` block); none for any other."""
    body = fence.body.splitlines()
    if body and body[0].startswith("$ ") and fence.info in ("", "sh"):
        return _transcript(body, fence.line + 1)
    if fence.info == "sh":
        return _typed(body, fence.line + 1)
    return []


def _typed(body: list[str], first: int) -> list[Command]:
    found: list[Command] = []
    i = 0
    while i < len(body):
        if not body[i].strip() or body[i].lstrip().startswith("#"):
            i += 1
            continue
        start = i
        text = body[i]
        while not _complete(text) and i + 1 < len(body):
            i += 1
            text += "\n" + body[i]
        if (here := _HEREDOC.search(text)) is not None:  # a file written on the page
            while i + 1 < len(body) and body[i].strip() != here["word"]:
                i += 1
                text += "\n" + body[i]
        found.append(Command(_joined(text), first + start, None))
        i += 1
    return found


# ``cat > remind.json <<'EOF'``: the lines up to ``EOF`` are the command's input.
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(?P<word>\w+)\1\s*$")


def _transcript(body: list[str], first: int) -> list[Command]:
    found: list[Command] = []
    i = 0
    while i < len(body):
        start = i
        text = body[i].removeprefix("$ ")
        while not _complete(text) and i + 1 < len(body):
            i += 1
            text += "\n" + body[i]
        i += 1
        shown: list[str] = []
        while i < len(body) and not body[i].startswith("$ "):
            shown.append(body[i])
            i += 1
        found.append(Command(_joined(text), first + start, tuple(shown)))
    return found


def _complete(text: str) -> bool:
    """Whether ``text`` is a whole command: no quote left open, no ``\\`` before its end."""
    try:
        shlex.split(text, comments=True)
    except ValueError:  # "No closing quotation", "No escaped character"
        return False
    return True


def _joined(text: str) -> str:
    # A backslash-newline is nothing to the shell; inside quotes the newline stays (JSON
    # takes it as whitespace).
    return text.replace("\\\n", " ")


def _words(text: str) -> list[str]:
    return shlex.split(text, comments=True)


def started_run_ids(found: Sequence[Command]) -> list[str]:
    """The run ids given to ``ductor start ... --run-id ID``, in order: one a README starts
    twice starts nothing the second time (``ID (already started)``)."""
    ids: list[str] = []
    for command in found:
        words = _words(command.text)
        if words[:2] == ["ductor", "start"] and "--run-id" in words:
            ids.append(words[words.index("--run-id") + 1])
    return ids


# What differs from one run to the next: a timestamp (with the weekday `schedules create`
# writes after it), a hex id.
_VARYING = re.compile(
    r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)?"
    r"(?: (?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)\b)?"
    r"|\b[0-9a-f]{8,}\b"
)
_ANY = "..."


_TOKENS = re.compile(rf"(?P<varying>{_VARYING.pattern})|(?P<any>\.\.\.)|(?P<space>\s+)")


def _line_pattern(shown: str) -> re.Pattern[str]:
    pattern = ""
    at = 0
    text = shown.strip()
    for token in _TOKENS.finditer(text):
        pattern += re.escape(text[at : token.start()])
        if token["varying"] is not None:
            pattern += f"(?:{_VARYING.pattern})"
        elif token["any"] is not None:
            pattern += ".*"
        else:
            pattern += r"\s+"
        at = token.end()
    return re.compile(pattern + re.escape(text[at:]))


def _line_matches(shown: str, printed: str) -> bool:
    if shown.startswith("{") and _ANY not in shown:
        try:
            if orjson.loads(shown) == orjson.loads(printed):
                return True
        except orjson.JSONDecodeError:
            pass
    # Else as text: JSON with a time or an id that differs from run to run.
    return _line_pattern(shown).fullmatch(printed.strip()) is not None


def matches(shown: Sequence[str], printed: Sequence[str]) -> bool:
    """Whether ``printed`` is what the README ``shown`` (blank lines at the ends left out)."""
    want = _trimmed(shown)
    got = _trimmed(printed)
    # matched[i][j]: want[i:] matches got[j:]
    matched = [[False] * (len(got) + 1) for _ in range(len(want) + 1)]
    matched[len(want)][len(got)] = True
    for i in range(len(want) - 1, -1, -1):
        for j in range(len(got), -1, -1):
            if want[i].strip() == _ANY:
                matched[i][j] = matched[i + 1][j] or (j < len(got) and matched[i][j + 1])
            else:
                matched[i][j] = (
                    j < len(got) and _line_matches(want[i], got[j]) and matched[i + 1][j + 1]
                )
    return matched[0][0]


def _trimmed(lines: Sequence[str]) -> list[str]:
    kept = list(lines)
    while kept and not kept[0].strip():
        kept.pop(0)
    while kept and not kept[-1].strip():
        kept.pop()
    return kept
