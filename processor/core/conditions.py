"""A step's condition: a small expression over the run's input and its dependencies' outputs,
parsed once when the workflow is registered and evaluated by the tick. No ``eval``: the
language has selectors, literals, comparisons and boolean operators, nothing else.

    $.input.amount > 100 and $.steps.check.output.status == "ok"
    not ($.input.country in ["FR", "DE"]) or $.steps.score.output.value >= 0.5

- A selector starts at ``$.input`` or ``$.steps.<step>.output`` and goes down by ``.name``
  and ``[index]`` (core/selectors.py, the grammar a sleep's ``until`` is written in too). One
  that finds nothing is *missing*: every comparison with it is false, and alone it is false.
  The output of a step that was skipped is missing.
- Literals are JSON's: numbers, strings in double quotes, ``true``, ``false``, ``null``, and
  lists of them (for ``in``).
- ``==`` and ``!=`` compare as JSON does (``1 == 1.0``; ``true`` is not ``1``); ``<``, ``<=``,
  ``>``, ``>=`` compare two numbers or two strings, and are false for anything else; ``in``
  is membership in a list (or a substring of a string).
- ``and``, ``or``, ``not`` and parentheses; a value alone is true unless it is missing,
  ``null``, ``false``, ``0``, ``""``, ``[]`` or ``{}``.

The tick never reads a run's input or outputs to evaluate one: the load reads what each of
its selectors finds (io/postgres/selected.py, in Postgres), and ``holds`` decides from those
values alone (``None`` when one was not read yet: the tick then waits for the next load).
Evaluation never raises: a condition decides, it cannot fail a run. Parsing raises
``BadCondition`` with the position of what it could not read, and bounds the text (1,000
characters) and its nesting (32 levels), since definitions come from any sender.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

from processor.core.selectors import BadSelector, Selected, Selector, parse_selector

MAX_LENGTH = 1000
MAX_DEPTH = 32

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<path>\$(?:\.[A-Za-z0-9_-]+|\[\d{1,9}\])+)
    | (?P<number>-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?)
    | (?P<string>"(?:[^"\\]|\\.)*")
    | (?P<op>==|!=|<=|>=|<|>|\(|\)|\[|\]|,)
    | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
    )""",
    re.VERBOSE,
)
_WORDS = {"and", "or", "not", "in", "true", "false", "null"}
_COMPARISONS = {"==", "!=", "<", "<=", ">", ">=", "in"}
_CONSTANTS: dict[str, Any] = {"true": True, "false": False, "null": None}


class BadCondition(ValueError):
    """Text that is no condition; the message names where and the position."""


class _Missing:
    """What a selector that finds nothing gives."""


MISSING = _Missing()


@dataclass(frozen=True)
class Path:
    selector: Selector


@dataclass(frozen=True)
class Literal:
    value: Any


@dataclass(frozen=True)
class Compare:
    op: str
    left: Node
    right: Node


@dataclass(frozen=True)
class Not:
    operand: Node


@dataclass(frozen=True)
class BoolOp:
    op: str  # "and" or "or"
    operands: tuple[Node, ...]


Node = Path | Literal | Compare | Not | BoolOp


@dataclass(frozen=True)
class Condition:
    """A parsed condition: its text as written, and the selectors it reads (each once, in
    the order written)."""

    text: str
    root: Node
    selectors: tuple[Selector, ...]

    @property
    def steps_read(self) -> frozenset[str]:
        """The steps whose outputs it reads."""
        return frozenset(s.step for s in self.selectors if s.step is not None)

    def holds(self, found: Mapping[str, Selected]) -> bool | None:
        """Whether it holds, given what each of its selectors found (by its text); None when
        one of them was not read (not in ``found``). Never raises."""
        for selector in self.selectors:
            if selector.text not in found:
                return None
        return _truthy(_value(self.root, found))


def parse_condition(text: str, where: str) -> Condition:
    """``text`` parsed, or BadCondition naming ``where`` and the position."""
    if not isinstance(text, str):
        raise BadCondition(f"{where}: a condition is a string")
    if len(text) > MAX_LENGTH:
        raise BadCondition(f"{where}: a condition is at most {MAX_LENGTH} characters")
    parser = _Parser(text, where)
    root = parser.expression(0)
    parser.end()
    selectors: dict[str, Selector] = {}
    _collect(root, selectors)
    return Condition(text, root, tuple(selectors.values()))


# -- parsing ---------------------------------------------------------------------------------


class _Parser:
    def __init__(self, text: str, where: str) -> None:
        self._text = text
        self._where = where
        self._tokens: list[tuple[str, str, int]] = []
        pos = 0
        while pos < len(text):
            if text[pos:].strip() == "":
                break
            match = _TOKEN.match(text, pos)
            if match is None or match.end() == pos or match.lastgroup is None:
                self._fail(len(text) - len(text[pos:].lstrip()), "cannot read this")
            kind, value = match.lastgroup, match.group(match.lastgroup)
            if kind == "word" and value not in _WORDS:
                self._fail(match.start(kind), f"unknown word {value!r}")
            self._tokens.append((kind, value, match.start(kind)))
            pos = match.end()
        self._at = 0

    def expression(self, depth: int) -> Node:
        return self._or(depth)

    def end(self) -> None:
        if self._at < len(self._tokens):
            self._fail(self._tokens[self._at][2], "unexpected text")

    def _or(self, depth: int) -> Node:
        operands = [self._and(depth)]
        while self._take("word", "or"):
            operands.append(self._and(depth))
        return operands[0] if len(operands) == 1 else BoolOp("or", tuple(operands))

    def _and(self, depth: int) -> Node:
        operands = [self._not(depth)]
        while self._take("word", "and"):
            operands.append(self._not(depth))
        return operands[0] if len(operands) == 1 else BoolOp("and", tuple(operands))

    def _not(self, depth: int) -> Node:
        if self._take("word", "not"):
            return Not(self._not(self._deeper(depth)))
        return self._comparison(depth)

    def _comparison(self, depth: int) -> Node:
        left = self._operand(depth)
        token = self._peek()
        if token is not None and token[1] in _COMPARISONS:
            self._at += 1
            return Compare(token[1], left, self._operand(depth))
        return left

    def _operand(self, depth: int) -> Node:
        token = self._next("a value, a selector or '('")
        kind, value, pos = token
        if kind == "path":
            try:
                return Path(parse_selector(value))
            except BadSelector as bad:
                self._fail(pos, str(bad))
        if kind in {"number", "string"} or value in _CONSTANTS:
            return Literal(self._literal(kind, value, pos))
        if value == "(":
            inner = self.expression(self._deeper(depth))
            self._expect(")")
            return inner
        if value == "[":
            return Literal(self._list())
        self._fail(pos, f"expected a value, a selector or '(', found {value!r}")

    def _list(self) -> list[Any]:
        items: list[Any] = []
        if self._take("op", "]"):
            return items
        while True:
            kind, value, pos = self._next("a literal")
            if kind not in {"number", "string"} and value not in _CONSTANTS:
                self._fail(pos, "a list holds literals only")
            items.append(self._literal(kind, value, pos))
            if self._take("op", "]"):
                return items
            self._expect(",")

    def _literal(self, kind: str, value: str, pos: int) -> Any:
        if kind == "word":
            return _CONSTANTS[value]
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            self._fail(pos, f"not a JSON {kind}")

    def _deeper(self, depth: int) -> int:
        if depth + 1 > MAX_DEPTH:
            token = self._peek()
            self._fail(len(self._text) if token is None else token[2], "nested too deep")
        return depth + 1

    def _peek(self) -> tuple[str, str, int] | None:
        return self._tokens[self._at] if self._at < len(self._tokens) else None

    def _next(self, wanted: str) -> tuple[str, str, int]:
        token = self._peek()
        if token is None:
            self._fail(len(self._text), f"expected {wanted}, found the end")
        self._at += 1
        return token

    def _take(self, kind: str, value: str) -> bool:
        token = self._peek()
        if token is not None and token[0] == kind and token[1] == value:
            self._at += 1
            return True
        return False

    def _expect(self, value: str) -> None:
        if not self._take("op", value):
            token = self._peek()
            found = "the end" if token is None else repr(token[1])
            at = len(self._text) if token is None else token[2]
            self._fail(at, f"expected {value!r}, found {found}")

    def _fail(self, pos: int, why: str) -> NoReturn:
        raise BadCondition(f"{self._where}: {why} at character {pos + 1} of the condition")


def _collect(node: Node, into: dict[str, Selector]) -> None:
    """The selectors under ``node``, each once by its text, in the order written."""
    if isinstance(node, Path):
        into.setdefault(node.selector.text, node.selector)
    elif isinstance(node, Compare):
        _collect(node.left, into)
        _collect(node.right, into)
    elif isinstance(node, Not):
        _collect(node.operand, into)
    elif isinstance(node, BoolOp):
        for operand in node.operands:
            _collect(operand, into)


# -- evaluation ------------------------------------------------------------------------------


def _value(node: Node, found: Mapping[str, Selected]) -> Any:
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, Path):
        selected = found[node.selector.text]
        return selected.value if selected.found else MISSING
    if isinstance(node, Compare):
        return _compare(node.op, _value(node.left, found), _value(node.right, found))
    if isinstance(node, Not):
        return not _truthy(_value(node.operand, found))
    if node.op == "and":
        return all(_truthy(_value(n, found)) for n in node.operands)
    return any(_truthy(_value(n, found)) for n in node.operands)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _json_equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if isinstance(a, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    return bool(a == b)


def _compare(op: str, left: Any, right: Any) -> bool:
    if left is MISSING or right is MISSING:
        return False
    if op == "==":
        return _json_equal(left, right)
    if op == "!=":
        return not _json_equal(left, right)
    if op == "in":
        if isinstance(right, list):
            return any(_json_equal(left, item) for item in right)
        return isinstance(right, str) and isinstance(left, str) and left in right
    both_numbers = _is_number(left) and _is_number(right)
    if not both_numbers and not (isinstance(left, str) and isinstance(right, str)):
        return False
    if op == "<":
        return bool(left < right)
    if op == "<=":
        return bool(left <= right)
    if op == ">":
        return bool(left > right)
    return bool(left >= right)


def _truthy(value: Any) -> bool:
    if value is MISSING or value is None:
        return False
    return bool(value)
