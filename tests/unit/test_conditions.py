"""A step's condition (core/conditions.py): what it reads, what it decides, and that no text or
value a sender can send makes it raise anything but a BadCondition at registration, or
anything at all when the tick evaluates it."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from processor.core.conditions import MAX_DEPTH, MAX_LENGTH, BadCondition, parse_condition
from processor.core.selectors import resolve

INPUT = {"amount": 250, "country": "FR", "tags": ["vip", "eu"], "flag": False, "none": None}
OUTPUTS = {"check": {"status": "ok", "score": 0.75}, "empty": {}}


def holds(text: str, run_input: Any = INPUT, outputs: Any = OUTPUTS) -> bool | None:
    """What the tick decides when the load found what each selector finds in such a run."""
    condition = parse_condition(text, "steps[0].when")
    found = {s.text: resolve(s, run_input, outputs) for s in condition.selectors}
    return condition.holds(found)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$.input.amount > 100", True),
        ('$.input.amount > 100 and $.steps.check.output.status == "ok"', True),
        ("$.input.amount <= 100 or $.steps.check.output.score >= 0.5", True),
        ('not ($.input.country in ["FR", "DE"])', False),
        ('$.input.tags[0] == "vip"', True),
        ('"eu" in $.input.tags', True),
        ("$.input.amount == 250.0", True),
        ("$.input.flag == false", True),
        ("$.input.flag == 0", False),  # JSON: false is not 0
        ("$.input.none == null", True),
        ("$.input.flag", False),
        ("$.input.tags", True),
        ("$.steps.empty.output", False),  # {} is false alone
        ("$.input.absent == null", False),  # missing is not null
        ("$.input.absent != 1", False),  # every comparison with missing is false
        ("not $.input.absent", True),
        ("$.input.country > 1", False),  # a string against a number: false, never an error
        ('$.input.country < "GB"', True),
        ("$.steps.unknown.output.x == 1", False),
        ('$.input.tags[9] == "vip"', False),
    ],
)
def test_a_condition_decides_as_its_rules_say(text: str, expected: bool) -> None:
    assert holds(text) is expected


def test_it_names_the_steps_it_reads() -> None:
    found = parse_condition("$.steps.a.output.x > 1 or not $.steps.b.output", "c")
    assert found.steps_read == {"a", "b"}
    assert parse_condition("$.input.x", "c").steps_read == frozenset()


def test_it_reads_each_selector_once_by_its_canonical_text() -> None:
    found = parse_condition("$.input.a[0] == 1 or $.input.a.0 == 2 or $.input.b", "c")
    assert [s.text for s in found.selectors] == ["$.input.a.0", "$.input.b"]


def test_what_was_not_read_leaves_it_undecided_and_what_was_decides() -> None:
    condition = parse_condition("$.input.a == 1 or $.steps.s.output.b", "c")
    assert condition.holds({}) is None
    assert condition.holds({"$.input.a": resolve(condition.selectors[0], {"a": 1}, {})}) is None
    found = {s.text: resolve(s, {"a": 2}, {"s": {"b": [1]}}) for s in condition.selectors}
    assert condition.holds(found) is True


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("$.input.x >", "expected a value, a selector or '(', found the end at character 12"),
        ("$.input.x ~ 1", "cannot read this at character 11"),
        ("$.output.x", "'$.output.x' is not a selector: write $.input.<field>"),
        ("$.steps[0].output", "is not a selector"),
        ("__import__", "unknown word '__import__'"),
        ("($.input.x", "expected ')', found the end"),
        ("$.input.x 1", "unexpected text at character 11"),
        ("[$.input.x]", "a list holds literals only"),
        ("$.input.x in [1e400]", "not a JSON number at character 15"),
        ('$.input.x == "\\ud800"', "not a JSON string at character 14"),
        ("(" * (MAX_DEPTH + 1) + "1" + ")" * (MAX_DEPTH + 1), "nested too deep"),
        ("not " * (MAX_DEPTH + 1) + "1", "nested too deep"),
        ("1 or " * MAX_LENGTH + "1", f"at most {MAX_LENGTH} characters"),
    ],
)
def test_a_condition_it_cannot_read_is_refused_saying_where(text: str, said: str) -> None:
    with pytest.raises(BadCondition) as refused:
        parse_condition(text, "steps[0].when")
    assert str(refused.value).startswith("steps[0].when: ")
    assert said in str(refused.value)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
_ATOMS = st.sampled_from(
    [
        "$.input.a",
        "$.input.a[0]",
        "$.steps.s.output",
        "$.steps.s.output.b",
        "1",
        "0.5",
        '"x"',
        "true",
        "null",
        '[1, "x"]',
    ]
)
_OPS = st.sampled_from(["==", "!=", "<", "<=", ">", ">=", "in"])


@st.composite
def _conditions(draw: st.DrawFn, depth: int = 3) -> str:
    if depth == 0 or draw(st.booleans()):
        return f"{draw(_ATOMS)} {draw(_OPS)} {draw(_ATOMS)}"
    kind = draw(st.sampled_from(["and", "or", "not"]))
    if kind == "not":
        return f"not ({draw(_conditions(depth - 1))})"
    return f"({draw(_conditions(depth - 1))}) {kind} ({draw(_conditions(depth - 1))})"


@settings(max_examples=300)
@given(st.text(max_size=60))
def test_any_text_is_parsed_or_refused_with_a_validation_error(text: str) -> None:
    with contextlib.suppress(BadCondition):
        parse_condition(text, "c")


@settings(max_examples=300)
@given(_conditions(), _JSON, _JSON)
def test_evaluation_never_raises_and_is_deterministic(text: str, a: Any, s: Any) -> None:
    run_input, outputs = {"a": a}, {"s": s}
    first = holds(text, run_input, outputs)
    assert isinstance(first, bool)
    assert holds(text, run_input, outputs) is first


@settings(max_examples=200)
@given(_conditions(2), _conditions(2), _JSON, _JSON)
def test_not_and_is_or_of_nots(left: str, right: str, a: Any, s: Any) -> None:
    run_input, outputs = {"a": a}, {"s": s}
    one = holds(f"not (({left}) and ({right}))", run_input, outputs)
    two = holds(f"(not ({left})) or (not ({right}))", run_input, outputs)
    assert one is two
