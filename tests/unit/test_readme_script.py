"""The examples' READMEs (tests/readme_script.py reads them), checked without services: each
is run top to bottom by tests/integration/test_example_readmes.py, starts no run id twice,
types every command in full, and gives `ductor` only commands and options it takes. And the
matching of what a transcript shows against what a command printed."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from processor.cli.main import parse_args
from tests.markdown import REPO
from tests.readme_script import commands, matches, started_run_ids

# The READMEs of examples/ that the integration test runs; producer-go's needs Go, and
# test_producer_example.py runs its block as written where Go is installed.
RUN = ["orders", "reports", "signup"]
NOT_RUN = {"producer-go"}


def _readme(example: str) -> Path:
    return REPO / "examples" / example / "README.md"


def test_every_examples_readme_is_run_top_to_bottom() -> None:
    found = {p.parent.name for p in (REPO / "examples").glob("*/README.md")}
    assert found - NOT_RUN == set(RUN)
    source = (REPO / "tests" / "integration" / "test_example_readmes.py").read_text()
    assert f'@pytest.mark.parametrize("example", {RUN!r}'.replace("'", '"') in source
    go = (REPO / "tests" / "integration" / "test_producer_example.py").read_text()
    assert 'commands((EXAMPLE / "README.md").read_text())' in go and "shell.follow(" in go


@pytest.mark.parametrize("example", RUN)
def test_a_readme_starts_each_run_id_once(example: str) -> None:
    """A second `ductor start --run-id` of an id starts nothing: the commands after it would
    read the first run."""
    ids = started_run_ids(commands(_readme(example).read_text()))
    assert len(ids) == len(set(ids)), ids


@pytest.mark.parametrize("example", RUN)
def test_a_readme_types_its_commands_in_full_and_ductor_takes_them(example: str) -> None:
    found = commands(_readme(example).read_text())
    assert found
    for command in found:
        where = f"examples/{example}/README.md:{command.line}"
        assert "..." not in command.text, f"{where}: an elided command cannot be typed"
        words = shlex.split(command.text, comments=True)
        if words[0] != "ductor":
            continue
        # Up to the end of the command: `ductor result X --wait 30; echo "exit $?"`.
        argv: list[str] = []
        for word in words[1:]:
            if word == "&":
                break
            argv.append(word.removesuffix(";"))
            if word.endswith(";"):
                break
        parse_args(argv)  # exits 2 on bad usage


def test_the_orders_readme_reads_as_typed() -> None:
    found = commands(_readme("orders").read_text())
    services = [c.foreground() for c in found if c.background]
    assert services == ["ductor process", "ductor worker --app steps:registry"]
    start = next(c for c in found if "--run-id order-1001" in c.text)
    assert start.expected == ("order-1001",)
    assert '"country": "DE"' in start.text  # the quoted input over two lines, one argument


@pytest.mark.parametrize(
    ("shown", "printed", "expected"),
    [
        (["a", "b"], ["a", "b"], True),
        (["a", "b"], ["a"], False),
        (["a  b"], ["a b"], True),  # spaces of a table's columns
        (["...", "b"], ["x", "y", "b"], True),
        (["a", "...", "b"], ["a", "b"], True),
        (["a", "..."], ["a", "z"], True),
        (["a", "..."], ["b"], False),
        (["run a (x-...)"], ["run a (x-1)"], True),
        (["next 2026-12-05T06:00:00+01:00 Sat"], ["next 2027-01-04T06:00:00+01:00 Mon"], True),
        (["at 2026-12-04T13:58:46.052Z"], ["at 2026-12-06T05:01:02.003Z"], True),
        (["at 2026-12-04T13:58:46.052Z"], ["at yesterday"], False),
        (["sent (approved-d64e8c5a24c4)"], ["sent (approved-0123456789ab)"], True),
        (['{"a":1,"b":2}'], ['{"b": 2, "a": 1}'], True),
        (['{"a":1,"b":2}'], ['{"a": 1}'], False),
        (["order-1002"], ["order-1002 (already started)"], False),
        ([], [""], True),
    ],
)
def test_what_a_transcript_shows_is_matched_against_what_was_printed(
    shown: list[str], printed: list[str], expected: bool
) -> None:
    assert matches(shown, printed) is expected


def test_a_here_document_is_one_command_with_its_lines() -> None:
    page = (
        '```sh\ncat > remind.json <<\'EOF\'\n{"name": "remind",\n "version": 1}\nEOF\n'
        "ductor workflows register remind.json\n```\n"
    )
    found = commands(page)
    assert [(c.text, c.line) for c in found] == [
        ('cat > remind.json <<\'EOF\'\n{"name": "remind",\n "version": 1}\nEOF', 2),
        ("ductor workflows register remind.json", 6),
    ]


def test_a_json_line_with_a_time_matches_as_text() -> None:
    shown = ['{"pause":{"slept_until_ms":1796583330018},"at":"2026-12-06T18:55:32Z"}']
    assert matches(
        shown, ['{"pause":{"slept_until_ms":1796583991234},"at":"2026-12-07T01:02:03Z"}']
    )
    assert not matches(shown, ['{"pause":{"slept_until_ms":1796583991234},"at":"later"}'])
