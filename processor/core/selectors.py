"""A selector: where a step reads one value of its run, the run's input or a dependency's
output, written ``$.input.<field>...`` or ``$.steps.<step>.output.<field>...`` (dotted names
only; a name of digits indexes a list). A sleep step's ``until`` is one (core/sleeps.py).

The grammar is deliberately tiny: the shell resolves a selector in Postgres (``#>`` with the
path, io/postgres/selected.py), so only what that operator reads exactly is accepted. Parsed
once, when the workflow is registered; pure, no I/O.
"""

from __future__ import annotations

import re
from typing import NamedTuple

# A field's name: what a dotted path can spell without quoting.
_NAME = r"[A-Za-z0-9_-]{1,100}"
_SELECTOR = re.compile(
    rf"\$\.(?:input|steps\.(?P<step>[^.]{{1,200}})\.output)(?P<path>(?:\.{_NAME})*)"
)
MAX_DEPTH = 16  # fields below the root


class BadSelector(ValueError):
    """Text that is no selector; the message says why (the caller says where)."""


class Selector(NamedTuple):
    """A parsed selector: ``step`` None reads the run's input, else that step's output; then
    down ``path``, one field (or list index) at a time. ``text``: as written."""

    text: str
    step: str | None
    path: tuple[str, ...]


def parse_selector(text: object) -> Selector:
    """``text`` as a selector, or BadSelector."""
    if not isinstance(text, str):
        raise BadSelector(f"expected a selector string, got {text!r}")
    found = _SELECTOR.fullmatch(text)
    if found is None:
        raise BadSelector(
            f"{text!r} is not a selector: write $.input.<field>... or"
            " $.steps.<step>.output.<field>... (dotted names of letters, digits, '_' or '-')"
        )
    path = tuple(found["path"].split(".")[1:])
    if len(path) > MAX_DEPTH:
        raise BadSelector(f"{text!r} goes more than {MAX_DEPTH} fields deep")
    return Selector(text, found["step"], path)


__all__ = ["MAX_DEPTH", "BadSelector", "Selector", "parse_selector"]
