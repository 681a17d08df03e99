"""The docs' shell blocks run as a reader runs them (tests/docs_shell.py says which): each page's
blocks that no marker excuses, top to bottom, in one bash session at a copy of the repository's
top, on the real Kafka and Postgres with this test's own topics, group and database (its
DUCTOR_* settings in the session's environment). A typed command must succeed, a transcript's
must print what the page shows, a service it leaves running must still run and stop cleanly on
SIGTERM. A block added to docs/ without a marker is run here, so a page cannot show a command
that no test runs."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest

from processor.io.config.settings import Settings
from processor.io.kafka.topics import create_topics, delete_topics
from tests.docs_shell import walks

from .user_shell import Shell

pytestmark = pytest.mark.integration

WALKS = walks()
# The workflows the pages register: a database that has never seen them, as a new user's.
REGISTERED = (
    "orders",
    "orders-with-approval",
    "remind",
    "shipping",
    "checkout-deadline",
    "trip",
    "tagged",
    "nightly-report",
)


@pytest.fixture
def settings(settings: Settings) -> Iterator[Settings]:
    """The tests' settings with as many steps partitions as a reader's (the default): usage.md
    runs a worker for each of its modules, four in one group, and one holding no partition
    would wait for its tasks to be handed back to it."""
    own = replace(settings, topic_prefix=f"{settings.topic_prefix}-docs", step_partitions=12)
    create_topics(own)
    yield own
    delete_topics(own)


@pytest.mark.parametrize("page", sorted(WALKS))
def test_a_pages_shell_blocks_run_and_print_what_they_show(
    pg: psycopg.Connection[Any], top: Path, shell: Shell, page: str
) -> None:
    pg.execute("DELETE FROM eec_workflow_definition WHERE name = ANY(%s)", (list(REGISTERED),))
    # A reader has `ductor` on the PATH (the quickstart's virtualenv, or an image's).
    assert shell.run(". .venv/bin/activate")[1] == 0
    for block in WALKS[page]:
        found = block.commands()
        assert found, f"{block.where}: a block without commands"
        shell.follow(found, page, top)
    shell.stop_checked(top)
