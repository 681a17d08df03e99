"""A selector: where a step reads one value of its run, the run's input or a dependency's
output, written ``$.input.<field>...`` or ``$.steps.<step>.output.<field>...``, each field a
dotted name or a list index in brackets (``$.input.items[0].sku``; ``.0`` is the same). A
sleep step's ``until`` is one (core/sleeps.py); a condition holds any number
(core/conditions.py). This is the one grammar of both.

The tick never reads a run's input or outputs itself: the shell resolves each selector in
Postgres (``#>`` with the path, io/postgres/selected.py) with the batch's load, and hands the
tick what it found (``Selected``), keyed by the selector's canonical text (``Selector.text``:
brackets written as dotted fields). ``resolve`` is the same reading in Python, for the tests.
Parsed once, when the workflow is registered; pure, no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

# A field's name: what a dotted path can spell without quoting.
_NAME = r"[A-Za-z0-9_-]{1,100}"
_FIELD = rf"\.{_NAME}|\[\d{{1,9}}\]"
_SELECTOR = re.compile(
    rf"\$\.(?:input|steps\.(?P<step>[^.\[\]]{{1,200}})\.output)(?P<path>(?:{_FIELD})*)"
)
_FIELDS = re.compile(rf"\.({_NAME})|\[(\d{{1,9}})\]")
_INDEX = re.compile(r"-?\d{1,9}")
MAX_DEPTH = 16  # fields below the root


class BadSelector(ValueError):
    """Text that is no selector; the message says why (the caller says where)."""


class Selector(NamedTuple):
    """A parsed selector: ``step`` None reads the run's input, else that step's output; then
    down ``path``, one field (or list index, as digits) at a time. ``text``: its canonical
    form (what the load's findings are keyed by; as written but for brackets)."""

    text: str
    step: str | None
    path: tuple[str, ...]


class Selected(NamedTuple):
    """What a selector found in its run, as the load read it: ``found`` False when nothing
    is there (a field missing); else ``value`` (JSON, maybe null)."""

    found: bool
    value: Any = None


NOTHING = Selected(False)


def parse_selector(text: object) -> Selector:
    """``text`` as a selector, or BadSelector."""
    if not isinstance(text, str):
        raise BadSelector(f"expected a selector string, got {text!r}")
    found = _SELECTOR.fullmatch(text)
    if found is None:
        raise BadSelector(
            f"{text!r} is not a selector: write $.input.<field>... or"
            " $.steps.<step>.output.<field>... (dotted names of letters, digits, '_' or '-',"
            " or list indexes as [0])"
        )
    path = tuple(name or index for name, index in _FIELDS.findall(found["path"]))
    if len(path) > MAX_DEPTH:
        raise BadSelector(f"{text!r} goes more than {MAX_DEPTH} fields deep")
    step = found["step"]
    root = "$.input" if step is None else f"$.steps.{step}.output"
    return Selector(root + "".join(f".{field}" for field in path), step, path)


def resolve(selector: Selector, run_input: Any, outputs: Mapping[str, Any]) -> Selected:
    """What ``selector`` finds in a run whose input is ``run_input`` and whose steps' outputs
    are ``outputs`` (a step absent: none), as Postgres's ``#>`` reads it: a field of an
    object by name, an element of a list by index (a negative one from its end)."""
    if selector.step is None:
        here = run_input
    elif selector.step in outputs:
        here = outputs[selector.step]
    else:
        return NOTHING
    for field in selector.path:
        if isinstance(here, dict) and field in here:
            here = here[field]
        elif isinstance(here, list) and _INDEX.fullmatch(field) and -len(here) <= int(field):
            if int(field) >= len(here):
                return NOTHING
            here = here[int(field)]
        else:
            return NOTHING
    return Selected(True, here)


__all__ = [
    "MAX_DEPTH",
    "NOTHING",
    "BadSelector",
    "Selected",
    "Selector",
    "parse_selector",
    "resolve",
]
