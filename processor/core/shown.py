"""A stored JSON value as `ductor inspect`, the client and the run's page show it (pure): whole
up to a bound, else the start of its JSON text and how long it is, marked as cut.

A run's input, a step's output and a signal's payload may each be a megabyte (core/bounds.py),
a map step's output as many as its items: a look at a run reads at most SHOWN_CHARS characters
of each (the statement cuts them: io/postgres/run_data.py), so it costs the same whatever the
steps returned. A value is JSON, so nothing in it is binary: a string's control characters
are escaped in its JSON text, and the page escapes what is HTML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

# What a look at a run reads of each value: enough to recognise it.
SHOWN_CHARS = 4000


@dataclass(frozen=True)
class Shown:
    """A value whole (``value``, ``preview`` None), or cut: ``preview`` is the start of its
    JSON text, ``value`` None. ``chars``: the length of its whole JSON text."""

    value: Any
    chars: int
    preview: str | None = None

    @property
    def truncated(self) -> bool:
        return self.preview is not None

    def document(self) -> dict[str, Any]:
        """As the JSON documents give it (`inspect -o json`, the client)."""
        return {
            "value": self.value,
            "truncated": self.truncated,
            "chars": self.chars,
            "preview": self.preview,
        }

    def text(self) -> str:
        """One line of compact JSON, or its start and a mark that says it was cut."""
        if self.preview is None:
            return orjson.dumps(self.value).decode()
        return f"{self.preview} ... (cut: {self.chars} characters)"


def shown(text: str, chars: int, max_chars: int = SHOWN_CHARS) -> Shown:
    """A value from the start of its JSON text as read (``text``: at least ``max_chars + 1``
    characters of it, when it has them) and its whole length ``chars``."""
    if chars <= max_chars:
        return Shown(orjson.loads(text), chars)
    return Shown(None, chars, text[:max_chars])
