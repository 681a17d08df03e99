"""The Python a workflow was written in, as a registration keeps it (pure): the text of the
module that created the ``Workflow`` (processor/authoring.py finds it) and the module's name.

The text is stored beside the definition (``eec_workflow_definition.source``) and shown by the
page and ``ductor workflows show --source``; it is for people to read, never run or compared
(versions are compared by their JSON). So it is bounded where it enters: at most
MAX_SOURCE_BYTES bytes (UTF-8), whole lines, and a last line that says how much was cut; a
character Postgres cannot store in text (NUL, a lone surrogate) is written as its escape.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_SOURCE_BYTES = 64 * 1024


@dataclass(frozen=True)
class WorkflowSource:
    """A module's text (already bounded: ``bounded_source``) and its name."""

    module: str
    text: str


def _storable(text: str) -> str:
    """``text`` with what a Postgres text column refuses written as escapes."""
    if text.isascii():
        return text.replace("\x00", "\\x00")
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")


def cut_mark(total_bytes: int, kept_bytes: int) -> str:
    """The line that ends a text cut to ``kept_bytes`` of its ``total_bytes``."""
    return f"# ... cut: the module is {total_bytes} bytes; its first {kept_bytes} are shown\n"


def bounded_source(text: str, max_bytes: int = MAX_SOURCE_BYTES) -> str:
    """``text`` whole when it takes at most ``max_bytes`` bytes (UTF-8); else as many of its
    first whole lines as fit with the line that says so (``cut_mark``), within ``max_bytes``.
    ``max_bytes`` must leave room for that line (a hundred bytes)."""
    text = _storable(text)
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text
    # (the mark's kept figure has no more digits than max_bytes; 1: a line break of its own)
    room = max_bytes - len(cut_mark(len(data), max_bytes).encode("utf-8")) - 1
    head = data[:room]
    end = head.rfind(b"\n")
    # Whole lines; a first line longer than the room is cut inside it, on a character.
    kept = head[: end + 1] if end >= 0 else head
    shown = kept.decode("utf-8", "ignore")
    if not shown.endswith("\n"):
        shown += "\n"
    return shown + cut_mark(len(data), len(shown.encode("utf-8")))
