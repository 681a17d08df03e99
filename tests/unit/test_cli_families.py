"""The command line loads the family of commands it names, alone: the table of families says
truly what each registers, and a client command does not load the services."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from processor.cli.main import FAMILIES, Family, build_parser, families_for


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f"{f.module}.{f.register}")
def test_each_family_registers_the_commands_the_table_says(family: Family) -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    family.add_to(sub)
    # Completion's command is left out of the table: named, it loads every family.
    assert sorted(sub.choices) == sorted(family.commands or ("completion",))


def test_no_command_is_claimed_by_two_families() -> None:
    commands = [c for f in FAMILIES for c in f.commands]
    assert len(commands) == len(set(commands))


@pytest.mark.parametrize(
    ("argv", "modules"),
    [
        (["runs", "list"], {"runs"}),
        (["-o", "json", "inspect", "r-1"], {"runs"}),
        (["start", "worker"], {"start"}),  # a workflow named like a command
        (["worker", "--app", "m:r"], {"services"}),
        (["help", "runs", "list"], {"runs"}),
        ([], None),
        (["--help"], None),
        (["completion", "bash"], None),
        (["no-such-command"], None),
    ],
)
def test_a_command_line_loads_the_family_it_names(
    argv: list[str], modules: set[str] | None
) -> None:
    chosen = families_for(argv)
    if modules is None:
        assert chosen == FAMILIES
    else:
        assert {f.module for f in chosen} == modules


def test_the_whole_parser_lists_every_command_in_the_tables_order() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    listed = [c for c in sub.choices if c not in ("help", "completion")]
    family_of = {c: i for i, f in enumerate(FAMILIES) for c in f.commands}
    assert sorted(listed) == sorted(family_of)
    order = [family_of[c] for c in listed]
    assert order == sorted(order), listed


def test_a_client_command_does_not_load_the_services() -> None:
    """`ductor runs list --help` loads neither the processor, the worker nor the web server
    (each command spawned by a script paid for all three)."""
    code = (
        "import sys\n"
        "from processor.cli.main import main\n"
        "try:\n"
        "    main(['runs', 'list', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "loaded = [m for m in ('processor.engine.processor', 'processor.worker.worker',"
        " 'processor.ui.server', 'opentelemetry.sdk.trace') if m in sys.modules]\n"
        "print(loaded, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr
