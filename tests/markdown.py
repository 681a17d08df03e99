"""The repository's Markdown read the way GitHub renders it, without a Markdown parser: fenced
blocks, headings and their anchors (GitHub's slug rule), links, and sections. Enough for the
files we write ourselves; shared by tests/unit/test_docs_links.py and the quickstart's tests.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# Folders that are not the project's own text: tools' state, the local services, builds.
_SKIPPED = {"node_modules", "build", "dist"}


@dataclass(frozen=True)
class Fence:
    """A fenced block: its info string (``sh``, ``python``, empty), its text and where it is."""

    info: str
    body: str
    line: int  # 1-based line of the opening fence


@dataclass(frozen=True)
class Link:
    target: str
    line: int


@dataclass(frozen=True)
class Heading:
    level: int
    text: str
    line: int  # 1-based


_FENCE = re.compile(r"^(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")  # indented too (in a list)
_HEADING = re.compile(r"^ {0,3}(?P<marks>#{1,6})(?:[ \t]+(?P<text>.*?))?(?:[ \t]+#+)?[ \t]*$")
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.DOTALL)
_INLINE_LINK = re.compile(
    r"!?\[(?P<text>[^\]]*)\]\(\s*<?(?P<target>[^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)"
)
_REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(?P<target>\S+?)>?(?:\s.*)?$", re.MULTILINE)
_AUTOLINK = re.compile(r"<(?P<target>[A-Za-z][A-Za-z0-9+.-]*:[^>\s]*)>")
_BARE_URL = re.compile(r"(?<![<\w])(?P<target>(?:https?|ftp|file)://[^\s)>\]]*[^\s)>\].,;:!?])")
_HTML_TAG = re.compile(r"<[^>]+>")


def markdown_files(root: Path = REPO) -> list[Path]:
    """Every Markdown file of the project: none under hidden folders (.git, .venv, .infra) or
    build output."""
    found = []
    # Walked with the hidden and build folders pruned, not globbed: a glob also walks .infra,
    # where Kafka deletes a topic's folders while the walk is in them.
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [
            d for d in subfolders
            if not (d.startswith(".") or d in _SKIPPED or d.endswith(".egg-info"))
        ]  # fmt: skip
        found += [Path(folder) / f for f in files if f.endswith(".md")]
    return sorted(found)


def fences(text: str) -> list[Fence]:
    found = []
    opened: tuple[str, str, int, list[str]] | None = None  # fence, info, line, body lines
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line.strip())
        if opened is None:
            if match:
                opened = (match["fence"], match["info"].strip(), number, [])
            continue
        fence, info, start, body = opened
        closes = match and not match["info"].strip() and match["fence"][0] == fence[0]
        if closes and match is not None and len(match["fence"]) >= len(fence):
            found.append(Fence(info, "\n".join(body) + ("\n" if body else ""), start))
            opened = None
            continue
        body.append(line)
    return found


def _without_fences(text: str) -> str:
    """The text with its fenced blocks blanked out, fences included, line numbers kept."""
    lines = text.splitlines()
    for fence in fences(text):
        end = fence.line + fence.body.count("\n")  # the closing fence's index (0-based)
        for index in range(fence.line - 1, min(end + 1, len(lines))):
            lines[index] = ""
    return "\n".join(lines)


def prose(text: str) -> str:
    """The text with fenced blocks and code spans blanked out, line numbers kept: what is left
    is what GitHub renders as links."""
    return _CODE_SPAN.sub(lambda m: "\n" * m.group(0).count("\n"), _without_fences(text))


def headings(text: str) -> list[Heading]:
    """ATX headings outside fenced blocks (a `# comment` in a shell block is none), their text
    as written, code spans included."""
    found = []
    for number, line in enumerate(_without_fences(text).splitlines(), start=1):
        match = _HEADING.match(line)
        if match:
            found.append(Heading(len(match["marks"]), (match["text"] or "").strip(), number))
    return found


def slug(heading_text: str) -> str:
    """GitHub's anchor for a heading: the rendered text (no code-span backticks, no emphasis
    stars, a link's text only, no HTML), lowercased, every character dropped that is not a
    letter, a digit, a space, a hyphen or an underscore, each space a hyphen."""
    text = _INLINE_LINK.sub(lambda m: m["text"], heading_text)
    text = _HTML_TAG.sub("", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, ... as GitHub numbers them."""
    seen: dict[str, int] = {}
    found = set()
    for heading in headings(text):
        base = slug(heading.text)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text: str) -> Iterator[Link]:
    """Inline links and images, reference definitions, autolinks and bare URLs (GitHub links
    those too), outside code."""
    visible = prose(text)
    for pattern in (_INLINE_LINK, _REFERENCE, _AUTOLINK, _BARE_URL):
        for match in pattern.finditer(visible):
            yield Link(match["target"], visible.count("\n", 0, match.start()) + 1)


def section(text: str, title: str) -> tuple[int, str]:
    """The section that starts at the heading ``title`` and ends before the next heading of any
    level: its first line number and its text, heading included."""
    lines = text.splitlines(keepends=True)
    found = headings(text)
    for index, heading in enumerate(found):
        if heading.text == title:
            end = found[index + 1].line - 1 if index + 1 < len(found) else len(lines)
            return heading.line, "".join(lines[heading.line - 1 : end])
    raise LookupError(f"no heading {title!r}")
