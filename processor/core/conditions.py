"""A step's condition: a small expression over the run's input and its dependencies' outputs,
parsed once when the workflow is registered and evaluated by the tick. No ``eval``: the
language has selectors, literals, comparisons and boolean operators, nothing else.

    $.input.amount > 100 and $.steps.check.output.status == "ok"
    not ($.input.country in ["FR", "DE"]) or $.steps.score.output.value >= 0.5

- A selector starts at ``$.input`` or ``$.steps.<step>.output`` and goes down by ``.name``
  and ``[index]``. One that finds nothing is *missing*: every comparison with it is false,
  and alone it is false.
- Literals are JSON's: numbers, strings in double quotes, ``true``, ``false``, ``null``, and
  lists of them (for ``in``).
- ``==`` and ``!=`` compare as JSON does (``1 == 1.0``; ``true`` is not ``1``); ``<``, ``<=``,
  ``>``, ``>=`` compare two numbers or two strings, and are false for anything else; ``in``
  is membership in a list (or a substring of a string).
- ``and``, ``or``, ``not`` and parentheses; a value alone is true unless it is missing,
  ``null``, ``false``, ``0``, ``""``, ``[]`` or ``{}``.

Evaluation never raises: a condition decides, it cannot fail a run. Parsing raises
``ValidationError`` with the position of what it could not read, and bounds the text (1,000
characters) and its nesting (32 levels), since definitions come from any sender.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import orjson

from processor.core.workflow_def import ValidationError

MAX_LENGTH = 1000
MAX_DEPTH = 32

_TOKEN = re.compile(
    r"""\s*(?:
      (?P<path>\$(?:\.[A-Za-z_][A-Za-z0-9_-]*|\[\d{1,9}\])+)
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


class _Missing:
    """What a selector that finds nothing gives."""


MISSING = _Missing()


@dataclass(frozen=True)
class Path:
    steps: tuple[str | int, ...]  # from the root: ("input", "a", 0) or ("steps", "x", "output")


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
    """A parsed condition, and the steps whose outputs it reads."""

    text: str
    root: Node
    steps_read: frozenset[str]

    def holds(self, run_input: Any, outputs: Mapping[str, Any]) -> bool:
        """Whether it holds for the run's input and the outputs of the steps it reads (a step
        absent from ``outputs`` has none: its selectors are missing)."""
        return _truthy(_value(self.root, {"input": run_input, "steps": _as_steps(outputs)}))


def parse_condition(text: str, where: str) -> Condition:
    """``text`` parsed, or ValidationError naming ``where`` and the position."""
    if not isinstance(text, str):
        raise ValidationError(f"{where}: a condition is a string")
    if len(text) > MAX_LENGTH:
        raise ValidationError(f"{where}: a condition is at most {MAX_LENGTH} characters")
    parser = _Parser(text, where)
    root = parser.expression(0)
    parser.end()
    return Condition(text, root, frozenset(_steps_read(root)))


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
            return Path(self._path(value, pos))
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

    def _path(self, text: str, pos: int) -> tuple[str | int, ...]:
        steps: tuple[str | int, ...] = tuple(
            name if name else int(index) for name, index in _STEP.findall(text[1:])
        )
        if steps[:1] == ("input",):
            return steps
        if (
            len(steps) >= 3
            and steps[0] == "steps"
            and isinstance(steps[1], str)
            and steps[2] == "output"
        ):
            return steps
        self._fail(pos, "a selector starts at $.input or $.steps.<step>.output")

    def _fail(self, pos: int, why: str) -> NoReturn:
        raise ValidationError(f"{self._where}: {why} at character {pos + 1} of the condition")


_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_-]*)|\[(\d+)\]")


def _steps_read(node: Node) -> set[str]:
    if isinstance(node, Path):
        return {str(node.steps[1])} if node.steps[0] == "steps" else set()
    if isinstance(node, Literal):
        return set()
    if isinstance(node, Compare):
        return _steps_read(node.left) | _steps_read(node.right)
    if isinstance(node, Not):
        return _steps_read(node.operand)
    return set().union(*(_steps_read(n) for n in node.operands))


# -- evaluation ------------------------------------------------------------------------------


def _as_steps(outputs: Mapping[str, Any]) -> dict[str, Any]:
    return {name: {"output": output} for name, output in outputs.items()}


def _value(node: Node, root: Mapping[str, Any]) -> Any:
    if isinstance(node, Literal):
        return node.value
    if isinstance(node, Path):
        return _select(root, node.steps)
    if isinstance(node, Compare):
        return _compare(node.op, _value(node.left, root), _value(node.right, root))
    if isinstance(node, Not):
        return not _truthy(_value(node.operand, root))
    if node.op == "and":
        return all(_truthy(_value(n, root)) for n in node.operands)
    return any(_truthy(_value(n, root)) for n in node.operands)


def _select(root: Any, steps: tuple[str | int, ...]) -> Any:
    here = root
    for step in steps:
        if isinstance(step, int):
            if not isinstance(here, list) or step >= len(here):
                return MISSING
            here = here[step]
        else:
            if not isinstance(here, dict) or step not in here:
                return MISSING
            here = here[step]
    return here


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
