"""The examples' READMEs followed top to bottom, as a user does: every command of their ``sh``
blocks and transcripts (tests/readme_script.py says which), in order, in one bash session that
starts at a copy of the repository's top (the examples copied, .venv the one running these
tests), on the real Kafka and Postgres. A typed command must succeed; a transcript's command
must print what the README shows. A README that starts a run id twice, elides an input a
user must type, or shows output the commands no longer print fails here.

examples/producer-go is not among them: its README's block needs Go, and
test_producer_example.py runs it as written, in the same kind of session, where Go is
installed (skipped, saying so, where it is not)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from processor.io.config.settings import Settings
from tests.readme_script import commands

from .samples import REPO
from .user_shell import Shell

pytestmark = pytest.mark.integration


# The workflows the READMEs register: a database that has never seen them, as a new user's.
REGISTERED = ("orders", "orders-with-approval", "report", "signup")


@pytest.mark.parametrize("example", ["orders", "reports", "signup"])
def test_an_examples_readme_runs_top_to_bottom_and_prints_what_it_shows(
    settings: Settings, pg: psycopg.Connection[Any], top: Path, shell: Shell, example: str
) -> None:
    pg.execute("DELETE FROM eec_workflow_definition WHERE name = ANY(%s)", (list(REGISTERED),))
    readme = REPO / "examples" / example / "README.md"
    steps = commands(readme.read_text())
    assert steps, f"{readme} has no commands"
    where = f"examples/{example}/README.md"
    shell.follow(steps, where, top)
    assert shell.services, f"{where} starts no service"
    shell.stop_checked(top)
