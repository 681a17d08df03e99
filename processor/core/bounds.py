"""The bounds of the JSON values Ductor stores (a run's input, a signal's payload, a step's
output, a schedule's input) and of the texts it keys rows by (run ids, signal ids): one owner,
applied by every door before anything is written (docs/requests.md#bounds).

A stored JSON value is refused when it

1. is nested deeper than ``MAX_DEPTH`` (64) levels: orjson reads 1,024 levels but writes only
   254, and a value is written again inside others (a step task, a run's output, a batch's
   load), so a value that was read could not always be written back;
2. is larger than ``MAX_JSON_BYTES`` (1 MiB) as compact JSON (what orjson writes). The size
   bounds every string, key, list and object in it too: Postgres holds far larger ones
   (256 MiB in a jsonb value), so no bound of their own would protect anything;
3. holds a NUL character in a string or a key: Postgres refuses it in text and jsonb;
4. holds a lone surrogate (a string that is not Unicode text): orjson cannot write it, and
   refuses to read one (``"\\ud800"`` on the wire is not JSON);
5. holds an integer outside ``MIN_INTEGER`` .. ``MAX_INTEGER`` (-2⁶³ .. 2⁶⁴-1): what orjson
   writes, and reads back as the same integer. A longer integer literal on the wire would be
   read as the nearest float, silently another number: it is refused there too
   (``literal_problem``), so a huge number is refused whatever door it comes through;
6. holds a key that is not a string, or a value JSON has no form for (a set, a Decimal).

What orjson writes in a form of its own is stored in that form, as it always was: a dataclass
or a datetime as an object or a string, a tuple as a list, NaN and the infinities as null.
A key given twice on the wire is read as its last value, by orjson as by Postgres.

``json_problem`` says the first problem, with the path to it (``$.order.items[3]``), as a
value; it never raises, whatever it is given (a cycle is a value nested too deep). A value
that is plainly fine costs one orjson encoding and a few scans of its bytes (2.6 µs for an
order of 621 bytes: docs/requests.md#bounds has the figures); only a value near a bound is
walked in Python.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import orjson

MAX_DEPTH = 64
MAX_JSON_BYTES = 1024 * 1024
# The details a step gives its heartbeat (``ctx.heartbeat(details)``): written again at each
# recorded beat, so kept far smaller than a stored value: progress, a cursor, not data.
MAX_HEARTBEAT_BYTES = 64 * 1024
MIN_INTEGER, MAX_INTEGER = -(2**63), 2**64 - 1
# Tags, what runs are found by (`ductor runs list --tag KEY=VALUE`), so small and flat: a run
# is given at most MAX_TAGS at its start, and its steps set at most MAX_STEP_TAGS keys more
# (``ctx.tag``: a key set again keeps its place; the database holds the count too, in
# schemas/migrations/0045_run_tags.sql). A key is 1 to 64 letters, digits, '_', '.', ':', '/'
# or '-', starting with a letter or digit; a value a string of at most MAX_TAG_VALUE
# characters (core/run_search.tags_problem says which tags are refused, and why).
MAX_TAGS = 20
MAX_STEP_TAGS = 16
MAX_TAG_VALUE = 200
TAG_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/-]{0,63}")

# A path longer than this many steps is shown by its first and last steps.
_PATH_HEAD, _PATH_TAIL = 8, 4
_KEY_SHOWN = 40  # characters of a key shown in a path
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")  # a key written .name (as triggers read paths)
# A run of 19 digits: an integer literal that long is the only one orjson may read as
# another number (2⁶³ has 19 digits). Found by mapping every digit to "0" and every other
# byte to " " (C speed: a regular expression tried at each position cost 10 times more);
# digits in a string, a fraction or an exponent match too: the exact reading then decides.
_DIGITS = bytes(0x30 if 0x30 <= b <= 0x39 else 0x20 for b in range(256))
_LONG_RUN = b"0" * 19


class BoundsProblem(NamedTuple):
    """What is wrong with a value, and where: ``path`` from its root (``$``), ``problem`` a
    phrase that follows the value's name (``is nested deeper than 64 levels``)."""

    path: str
    problem: str

    def describe(self, name: str) -> str:
        """One sentence: ``the input at $.a[0] is nested deeper than 64 levels``."""
        where = "" if self.path == "$" else f" at {self.path}"
        return f"{name}{where} {self.problem}"


def json_problem(value: Any, max_bytes: int = MAX_JSON_BYTES) -> BoundsProblem | None:
    """The first reason ``value`` cannot be stored as JSON, or None. Never raises."""
    try:
        encoded = orjson.dumps(value)
    except Exception:
        return _walk_guarded(value)
    return encoded_problem(encoded, max_bytes)


def _walk_guarded(value: Any) -> BoundsProblem:
    """Why orjson refused ``value``. Never raises: an object whose methods raise (a dict
    subclass's items(), a dataclass's property) is refused as a whole."""
    try:
        problem = _walk(value, [], 0, True)
    except Exception:
        problem = None
    return problem or BoundsProblem("$", "cannot be written as JSON")


def encoded_problem(encoded: bytes, max_bytes: int = MAX_JSON_BYTES) -> BoundsProblem | None:
    """``json_problem`` of a value given as orjson wrote it (compact JSON)."""
    size = len(encoded)
    if size > max_bytes:
        return BoundsProblem("$", f"is {size:,} bytes as JSON, more than the {max_bytes:,} allowed")
    # JSON writes every NUL as \u0000: a value without that text holds none (with it, perhaps
    # as a string's text, the walk decides).
    if b"\\u0000" not in encoded and _shallow(encoded):
        return None
    return _walk(orjson.loads(encoded), [], 0, False)


# The brackets of a JSON text, all made square; everything else deleted.
_SQUARE = bytes.maketrans(b"{}", b"[]")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _shallow(encoded: bytes) -> bool:
    """True when the JSON text is surely nested at most MAX_DEPTH levels; False when it may
    not be (the walk decides). Each level opens a bracket, so at most MAX_DEPTH brackets is
    shallow; otherwise the innermost pairs are peeled off, a level per pass (a few passes of
    C, not a walk of every value in Python). A bracket in a string's text can only make a
    shallow text look deep, never a deep one shallow."""
    if encoded.count(b"[") + encoded.count(b"{") <= MAX_DEPTH:
        return True
    brackets = encoded.translate(_SQUARE, _NOT_BRACKETS)
    for _ in range(MAX_DEPTH):
        if not brackets:
            return True
        brackets = brackets.replace(b"[]", b"")
    return not brackets


def literal_problem(raw: bytes, pick: Callable[[Any], Any]) -> BoundsProblem | None:
    """An integer literal beyond ``MIN_INTEGER`` .. ``MAX_INTEGER`` in the part of the JSON
    document ``raw`` that ``pick`` takes from it (the input of a request, a trigger's input
    path), which orjson read as a float; None when there is none. ``raw`` is valid JSON
    (orjson read it). Never raises."""
    if _LONG_RUN not in raw.translate(_DIGITS):
        return None  # the common case: no literal long enough to be out of range
    try:
        exact = json.loads(raw)  # integers as written, however long
    except RecursionError:
        return BoundsProblem("$", f"is nested deeper than {MAX_DEPTH} levels")
    except ValueError:  # an integer longer than Python reads (4,300 digits): orjson refused
        return BoundsProblem("$", "holds a number that cannot be read exactly")
    try:
        part = pick(exact)
    except Exception:
        return None
    return _big_integer(part)


def _big_integer(value: Any) -> BoundsProblem | None:
    """The first integer beyond MIN_INTEGER .. MAX_INTEGER in a value the stdlib read, in
    document order, with its path (iterative: the value may be nested up to 1,024 levels)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        item, steps = stack.pop()
        kind = type(item)
        if kind is int:
            if not MIN_INTEGER <= item <= MAX_INTEGER:
                return _at(list(steps), f"is {_integer(item)}, {_BEYOND_64_BITS}")
        elif kind is dict or kind is list:
            pairs: list[tuple[Any, Any]] = (
                list(item.items()) if kind is dict else list(enumerate(item))
            )
            for at in range(len(pairs) - 1, -1, -1):  # the first is popped first
                step, inner = pairs[at]
                stack.append((inner, (*steps, step)))
    return None


def text_problem(value: Any, most: int) -> str | None:
    """Why ``value`` cannot be an id Ductor stores as text (a run id, a signal id): not a
    string of 1 to ``most`` characters, a NUL, a lone surrogate; None when it can."""
    if type(value) is not str or not 1 <= len(value) <= most:
        return f"must be a string of 1 to {most} characters"
    if "\x00" in value:
        return "holds a NUL character, which Postgres cannot store"
    if not value.isascii() and not _is_unicode(value):
        return "holds a lone surrogate: it is not Unicode text"
    return None


def _is_unicode(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


_SCALARS = (float, bool, type(None))
_BEYOND_64_BITS = "beyond the 64-bit range JSON is stored in"


def _walk(value: Any, steps: list[Any], depth: int, full: bool) -> BoundsProblem | None:
    """The first problem in ``value`` (at ``depth`` containers below the root, reached by
    ``steps``), in document order. ``full``: the value may hold anything (orjson refused it,
    or it was read exactly); otherwise it is what orjson read, where only the depth and NUL
    characters can be wrong. Recursion ends at MAX_DEPTH: a cycle is a value too deep."""
    kind = type(value)
    if kind is dict:
        return _walk_object(value, steps, depth, full)
    if kind is list or kind is tuple:
        return _walk_array(value, steps, depth, full)
    if kind is str:
        wrong = _text(value, full)
        return None if wrong is None else _at(steps, wrong)
    if kind is int:
        if full and not MIN_INTEGER <= value <= MAX_INTEGER:
            return _at(steps, f"is {_integer(value)}, {_BEYOND_64_BITS}")
        return None
    if kind in _SCALARS:
        return None
    return _other(value, steps, depth)


def _walk_object(
    value: dict[Any, Any], steps: list[Any], depth: int, full: bool
) -> BoundsProblem | None:
    """``_walk`` of a dict: its keys must be text JSON can hold, then each value."""
    if depth >= MAX_DEPTH:
        return _too_deep(steps)
    for key, item in value.items():
        if not isinstance(key, str):  # a str subclass is written as its text
            return _at(steps, f"has a key that is not a string ({_kind(key)})")
        wrong = _text(key, full)
        if wrong is not None:
            return _at(steps, f"has a key ({_quoted(key)}) that {wrong}")
        steps.append(key)
        problem = _walk(item, steps, depth + 1, full)
        if problem is not None:
            return problem
        steps.pop()
    return None


def _walk_array(value: Any, steps: list[Any], depth: int, full: bool) -> BoundsProblem | None:
    """``_walk`` of a list or a tuple: each item."""
    if depth >= MAX_DEPTH:
        return _too_deep(steps)
    for index, item in enumerate(value):
        steps.append(index)
        problem = _walk(item, steps, depth + 1, full)
        if problem is not None:
            return problem
        steps.pop()
    return None


def _other(value: Any, steps: list[Any], depth: int) -> BoundsProblem | None:
    """A value of another type: stored as orjson writes it (a dataclass as an object, a
    datetime as a string, an enum as its value, a subclass of dict, list, str or int as its
    base), or refused, where orjson has no form for it or for what it holds."""
    try:
        written = orjson.loads(orjson.dumps(value))
    except Exception:
        inner: Any = _NOTHING
        if isinstance(value, dict):
            inner = dict(value)
        elif isinstance(value, list):
            inner = list(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            inner = {f.name: getattr(value, f.name, None) for f in dataclasses.fields(value)}
        elif isinstance(value, enum.Enum):
            inner = value.value
        if inner is _NOTHING:
            return _at(steps, f"is a {_kind(value)}, which is not JSON")
        return _walk(inner, steps, depth, True)
    return _walk(written, steps, depth, False)


_NOTHING = object()


def _text(value: str, full: bool) -> str | None:
    """What is wrong with a string or a key: a NUL; a lone surrogate, when it may hold one."""
    if "\x00" in value:
        return "holds a NUL character, which Postgres cannot store"
    if full and not value.isascii() and not _is_unicode(value):
        return "holds a lone surrogate: it is not Unicode text"
    return None


def _too_deep(steps: list[Any]) -> BoundsProblem:
    return _at(steps, f"is nested deeper than {MAX_DEPTH} levels")


def _at(steps: list[Any], problem: str) -> BoundsProblem:
    return BoundsProblem(render_path(steps), problem)


def render_path(steps: list[Any] | tuple[Any, ...]) -> str:
    """A JSON path as triggers read them (``$.order.items[3]``, ``$["a b"]``); a long one
    by its first and last steps (``$[0][0][0][0][0][0][0][0]…[0][0][0][0]``)."""
    if len(steps) > _PATH_HEAD + _PATH_TAIL + 1:
        shown = [*map(_step, steps[:_PATH_HEAD]), "…", *map(_step, steps[-_PATH_TAIL:])]
    else:
        shown = [_step(s) for s in steps]
    return "$" + "".join(shown)


def _step(step: Any) -> str:
    if type(step) is int:
        return f"[{step}]"
    key = str(step)
    cut = key if len(key) <= _KEY_SHOWN else key[:_KEY_SHOWN] + "…"
    return f".{cut}" if _NAME.fullmatch(key) else f"[{_quoted(cut)}]"


def _quoted(key: str) -> str:
    """A key quoted as JSON: each character as itself, but those that would break a log line
    or a header (control characters and NUL escaped, a lone surrogate as \\udxxx)."""
    cut = key if len(key) <= _KEY_SHOWN else key[:_KEY_SHOWN] + "…"
    return json.dumps(cut, ensure_ascii=False).encode("utf-8", "backslashreplace").decode()


def _kind(value: Any) -> str:
    return type(value).__name__


def _integer(number: int) -> str:
    """An integer as a problem names it (a huge one by its size: printing it could fail)."""
    if number.bit_length() <= 128:
        return f"the integer {number}"
    return f"an integer of {number.bit_length()} bits"
